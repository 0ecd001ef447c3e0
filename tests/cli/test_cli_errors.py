"""Every command of the red team's table (2026-12-01, S10, S11) that ended in a traceback now
exits 2 with one clear message: unreadable or absurd profiles, bad ``serve --listen``
addresses, ``audit`` sizes, ``bench`` inputs checked before the run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[..., tuple[int, str, str]]


pytestmark = pytest.mark.usefixtures("clean_env")


def _refused(result: tuple[int, str, str], says: str) -> None:
    code, _, err = result
    assert code == 2, err
    assert says in err, err
    assert "Traceback" not in err


@pytest.fixture
def bad_profiles(tmp_path: Path) -> dict[str, Path]:
    files = {
        "random": os.urandom(4096),
        "xff": b"# comment \xff\n[batching]\nread_batch_pages = 64\n",
        "arrays": ("x = " + "[" * 5000 + "]" * 5000 + "\n").encode(),
        "tables": ("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n").encode(),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name}.toml"
        paths[name].write_bytes(data)
    paths["folder"] = tmp_path / "adir"
    paths["folder"].mkdir()
    paths["device"] = Path("/dev/zero")  # exists, endless, and not a file
    return paths


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("random", "not valid TOML"),
        ("xff", "not valid TOML"),
        ("arrays", "nested too deeply"),
        ("tables", "nested too deeply"),
        ("folder", "is a directory"),
        ("device", "is a character device, not a regular file"),
    ],
)
def test_unreadable_profiles_exit_2_from_every_command(
    cli: Run, bad_profiles: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str, says: str
) -> None:
    path = str(bad_profiles[name])
    _refused(cli("validate", path), says)
    _refused(cli("show", "--profile", path), says)
    monkeypatch.setenv("KVCR_POLICY_PROFILE", path)
    _refused(cli("show"), says)


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("nonsense:x", "port must be an integer in 0..65535"),
        ("nonsense", "cannot listen on nonsense:7480"),  # a HOST alone: the default port
        ("127.0.0.1:99999", "port must be in 0..65535"),
        ("127.0.0.1:-1", "port must be in 0..65535"),
        ("999.1.1.1:7000", "cannot listen on 999.1.1.1:7000"),
    ],
)
def test_serve_with_a_bad_address_exits_2(cli: Run, address: str, says: str) -> None:
    _refused(cli("serve", "--listen", address, "--set", "transport.name=ucx"), says)


def test_serve_on_a_port_in_use_exits_2(cli: Run) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        _refused(cli("serve", "--listen", f"127.0.0.1:{port}"), "another process holds it")


@pytest.mark.parametrize(
    ("size", "says"),
    [
        ("0", "expected a size from 1"),
        ("1000EiB", "expected a size from 1"),
        ("1GiB garbage", "nothing after it"),
        ("１GiB", "ASCII digits"),
        ("200TiB", "--size = 200TiB (from the command line) is more than the memory"),
    ],
)
def test_audit_sizes_are_strict_and_refusals_exit_2(cli: Run, size: str, says: str) -> None:
    _refused(cli("audit", "--size", size), says)


SMALL = ("--geometry", "small", "--tokens", "64", "--repeat", "1")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--tokens", "1000000000000"), "of host memory"),
        (("--tokens", str(1 << 28)), "of host memory"),  # 64 TiB measured: no host has it
        (("--screen", "nan", *SMALL), "expected a finite number from 0 to 100 %, got 'nan'"),
        (("--screen", "-50", *SMALL), "expected a finite number from 0 to 100 %, got '-50'"),
        (("--set", "placement.eviction=bogus", *SMALL), "'lru' or 'fifo'"),
        (("--set", "transport.threads=1000000000000", *SMALL), "less than or equal to 1024"),
        (("--set", "thread_tuning.switch_interval_s=1e-300", *SMALL), "greater than or equal"),
    ],
)
def test_bench_inputs_are_checked_before_the_run(
    cli: Run, args: tuple[str, ...], says: str
) -> None:
    _refused(cli("bench", *args), says)


def test_bench_plot_paths_are_checked_before_the_run(cli: Run, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for path, says in (
        (tmp_path / "missing" / "run.png", "does not exist"),
        (tmp_path / "run.xyz", "has suffix '.xyz'"),
        (tmp_path / "run", "has no suffix"),
        (tmp_path, "is a folder"),
    ):
        _refused(cli("bench", "--plot", str(path), *SMALL), says)
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing run


def test_bench_without_sglang_names_both_install_commands(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcr_policy.bench import hicache

    monkeypatch.setattr(hicache, "find_spec", lambda name: None)
    _refused(cli("bench", "--peer", "hicache-file", *SMALL), "bash .ci/install-sglang.sh")


# The child sets its own address-space limit a little above what it has mapped once imported,
# so that the limit is the tightest bound on memory whatever the machine has free right now.
UNDER_A_LIMIT = """
import re, resource, sys
from kvcr_policy.cli import main
size = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
sys.argv = ["kvcr-policy", "bench", "--repeat", "1"]
main()
"""


def test_bench_under_an_address_space_limit_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNDER_A_LIMIT],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("KVCR_POLICY_")},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "address-space limit (ulimit -v)" in done.stderr and "Traceback" not in done.stderr


def test_a_huge_value_is_not_echoed_whole(cli: Run) -> None:
    code, _, err = cli("show", "--set", "batching.read_batch_pages=" + "9" * 5_000_000 + "x")
    assert code == 2 and len(err) < 2_000, len(err)
