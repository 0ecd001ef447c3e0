"""Memory pre-flight end to end: a tier larger than a real memory cgroup exits with the message
(never SIGKILL), and ``validate`` refuses a tier larger than this host.

The cgroup is real: a child memory cgroup of this process's own, limited to 600 MiB (cgroup v1
here; v2 where the memory controller can be delegated), into which each command moves itself.
It is skipped, saying why, only where this process may not make one.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.config.loading import LoadedConfig, load_config
from kvcr_policy.config.preflight import check_host_fit
from kvcr_policy.errors import TierMemoryError
from kvcr_policy.memory.linux import use_roots
from tests.support.cgroups import GIB, MIB, FakeHost, child_memory_cgroup, in_cgroup
from tests.support.paths import ROOT, child_env

Run = Callable[..., tuple[int, str, str]]

#: A process with a 2 GiB pre-faulted tier: without the pre-flight, the kernel's OOM killer
#: ends it (SIGKILL, exit 137) while it pre-faults, with no message.
PIPELINE = """
import dataclasses, numpy as np
from kvcr_policy import build_pipeline, load_config
from kvcr_policy.geometry import preset
loaded = load_config(overrides={"placement.capacity_bytes": "2GiB", "placement.prefault": True})
geometry = dataclasses.replace(preset("small", layout="layer_first", tokens=64), dtype="float16")
with build_pipeline(loaded) as pipeline:
    pipeline.register_pool("kv", geometry, np.zeros(geometry.shape, np.float16))
"""


@pytest.fixture(scope="module")
def cgroup() -> Iterator[Path]:
    try:
        with child_memory_cgroup(600 * MIB) as path:
            yield path
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup here ({err}): the kernel's limit is untested")


def _run(cgroup: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_cgroup(cgroup, *argv), capture_output=True, text=True,
                          env=child_env(drop=("KVCR_POLICY_",), **env), timeout=300,
                          check=False)  # fmt: skip


def _loaded(**overrides: Any) -> LoadedConfig:
    return load_config(overrides=overrides, environ={}, dotenv=False)


def _says_the_cgroup_binds(text: str, cgroup: Path) -> None:
    assert "placement.capacity_bytes = 2GiB (from " in text, text
    assert f"{cgroup}/memory." in text  # the file the binding limit was read from
    assert "lower placement.capacity_bytes to at most" in text


def test_a_pipeline_with_a_2gib_tier_in_600mib_exits_with_the_message(cgroup: Path) -> None:
    done = _run(cgroup, sys.executable, "-c", PIPELINE)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # not -9: no SIGKILL
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kvcr_policy.errors.TierMemoryError: placement.capacity_bytes")
    _says_the_cgroup_binds(last, cgroup)
    assert "takes 2GiB at once" in last


def test_serve_with_a_2gib_tier_in_600mib_exits_2_with_the_message(cgroup: Path) -> None:
    argv = ("serve", "--insecure", "--set", "placement.capacity_bytes=2GiB")
    done = _run(cgroup, sys.executable, "-m", "kvcr_policy", *argv)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stdout == ""  # it never listened
    _says_the_cgroup_binds(done.stderr, cgroup)


def test_audit_of_a_2gib_prefaulted_region_in_600mib_exits_2_with_the_message(
    cgroup: Path,
) -> None:
    argv = ("audit", "--profile", "throughput", "--size", "2GiB")
    done = _run(cgroup, sys.executable, "-m", "kvcr_policy", *argv)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "--size = 2GiB (from the command line) is more than the memory" in done.stderr
    assert f"{cgroup}/memory." in done.stderr and "lower --size to at most" in done.stderr


def test_validate_in_600mib_refuses_a_2gib_tier(cgroup: Path) -> None:
    done = _run(cgroup, sys.executable, "-m", "kvcr_policy", "validate", "--format", "json",
                KVCR_POLICY_PLACEMENT__CAPACITY_BYTES="2GiB")  # fmt: skip
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)["profiles"][0]
    assert not report["ok"]
    _says_the_cgroup_binds(report["error"], cgroup)
    assert "cgroup v1 memory.limit_in_bytes is 600MiB" in report["error"] or (
        "cgroup v2 memory.max is 600MiB" in report["error"]
    )


def _cgroup_neutral(text: str) -> str:
    """``text`` with the cgroup's version and folder left out (the docs show v1 at ``pod``)."""
    text = re.sub(r"cgroup v[12] memory\.(max|limit_in_bytes)", "LIMIT", text)
    text = re.sub(r"(raise )memory\.(max|limit_in_bytes)", r"\1LIMIT", text)
    return re.sub(r"/sys/fs/cgroup/[^\s)]*", "PATH", text)


def test_the_documented_validate_in_a_600mib_pod_says_what_is_shown(cgroup: Path) -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = page.split("checks the message shown -->\n```bash\n", 1)[1].split("```", 1)[0]
    line, shown = block.splitlines()[:2]
    assignment, *argv = shlex.split(line.split("#", 1)[0])
    name, _, value = assignment.partition("=")
    done = _run(cgroup, sys.executable, "-m", "kvcr_policy", *argv[1:], **{name: value})
    assert done.returncode == 2 and "# exit 2" in line
    assert _cgroup_neutral(done.stderr.strip()) == _cgroup_neutral(shown.removeprefix("# "))


def test_validate_of_a_tier_larger_than_this_host_exits_2(cli: Run, tmp_path: Path) -> None:
    """Real: no host has 200 TiB; the message names the file, its table and what binds."""
    profile = tmp_path / "big.toml"
    profile.write_text('[placement]\ncapacity_bytes = "200TiB"\n')
    code, out, err = cli("validate", "default", str(profile))
    assert code == 2 and "✓ default" in out
    assert f"placement.capacity_bytes = 200TiB (from profile {profile} [placement])" in err
    assert "is more than the memory this host holds" in err and "at most" in err


def test_a_peer_client_profile_is_not_held_to_this_hosts_memory() -> None:
    """The tier of a peer's client lives in its ``serve``, which checks its own at start."""
    peer = _loaded(**{"transport.name": "ucx", "placement.capacity_bytes": "200TiB"})
    assert check_host_fit(peer) is None
    with pytest.raises(TierMemoryError, match="200TiB"):
        check_host_fit(_loaded(**{"placement.capacity_bytes": "200TiB"}))


def test_validate_reads_the_hosts_cgroup_limit(tmp_path: Path) -> None:
    """Faked: a 600 MiB v2 pod on a 512 GiB host (this machine has neither)."""
    host = FakeHost(tmp_path, total=512 * GIB, available=400 * GIB)
    host.v2("/pod")
    host.limit_v2("/sys/fs/cgroup/pod", 600 * MIB, current=0)
    with use_roots(proc=host.proc, sys=host.sys):
        binding = check_host_fit(_loaded(**{"placement.capacity_bytes": "512MiB"}))
    assert binding is not None and binding.limit.name == "cgroup v2 memory.max"
