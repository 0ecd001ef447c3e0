"""The ``kvcr`` backend's options and process defaults: selected like any value, validated by
its own model, UCX variables set only where the user has not, each shown with its source."""

from __future__ import annotations

import glob
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import ConfigError, PoolError
from tests.support.paths import child_env
from tests.support.pools import P, geometry, pool_buffer


def _process() -> Any:
    from kvcr_policy_kvcr import process

    return process


def test_a_profile_and_the_environment_select_the_backend(kvcr_profile: Any) -> None:
    from_file = load_config(kvcr_profile("[backend.options]\nucx_net_devices = 'eth0'\n"))
    assert from_file.config.backend.name == "kvcr"
    assert from_file.config.backend.options["ucx_net_devices"] == "eth0"
    assert "kvcr.toml" in from_file.origin("backend.options.ucx_net_devices")
    environ = {
        "KVCR_POLICY_BACKEND__NAME": "kvcr",
        "KVCR_POLICY_BACKEND__OPTIONS__PROGRESS_THREAD": "true",
    }
    from_env = load_config("default", environ=environ)
    assert from_env.config.backend.name == "kvcr"
    assert from_env.config.backend.options["progress_thread"] is True
    assert from_env.origin("backend.options.progress_thread") == (
        "env KVCR_POLICY_BACKEND__OPTIONS__PROGRESS_THREAD"
    )


def test_bad_options_are_errors_naming_the_option(kvcr_profile: Any) -> None:
    with pytest.raises(ConfigError, match=r"backend\.options\.ucx_tls.*keeps tcp"):
        load_config(kvcr_profile("[backend.options]\nucx_tls = 'sm,self'\n"))
    with pytest.raises(ConfigError, match="progress_thread"):
        load_config(kvcr_profile("[backend.options]\nprogres_thread = true\n"))
    with pytest.raises(ConfigError, match="g3_capacity_bytes_per_file"):
        load_config(kvcr_profile("[backend.options]\ng3_paths = ['/tmp/x']\n"))
    with pytest.raises(ConfigError, match="only UCX_"):
        load_config(kvcr_profile("[backend.options.env]\nNIXL_X = '1'\n"))
    with pytest.raises(ConfigError, match=r"backend\.options\.staging.*'never', 'auto'"):
        load_config(kvcr_profile("[backend.options]\nstaging = 'sometimes'\n"))
    with pytest.raises(ConfigError, match=r"backend\.options\.staging_bytes"):
        load_config(kvcr_profile("[backend.options]\nstaging_bytes = 0\n"))


@pytest.mark.parametrize(
    ("tls", "keeps"),
    [("tcp", True), ("all", True), ("self,posix,tcp", True), ("^cma", True),
     ("sm,self", False), ("^tcp", False), ("^cma,tcp", False)],
)  # fmt: skip
def test_ucx_tls_must_keep_tcp(tls: str, keeps: bool) -> None:
    from kvcr_policy_kvcr.options import tls_keeps_tcp

    assert tls_keeps_tcp(tls) is keeps


def test_defaults_are_set_only_where_unset_and_reported_with_their_source() -> None:
    from kvcr_policy_kvcr.options import KvcrOptions

    process = _process()
    options = KvcrOptions(ucx_tls="tcp,self", env={"UCX_TCP_TX_SEG_SIZE": "512k"})
    origins = {"backend.options.ucx_tls": "profile site.toml [backend.options]"}
    environ: dict[str, str] = {"UCX_TCP_TX_SEG_SIZE": "64k"}  # the user's own value
    report = process.apply_process_defaults(options, origins, environ)
    assert environ["UCX_NET_DEVICES"] == "lo"  # loopback unless configured
    assert environ["UCX_TLS"] == "tcp,self"
    assert environ["UCX_TCP_TX_SEG_SIZE"] == "64k"  # never overridden
    values = report.to_dict()["env"]
    assert values["UCX_NET_DEVICES"]["source"] == ("backend.options.ucx_net_devices (from default)")
    assert values["UCX_TLS"]["source"] == (
        "backend.options.ucx_tls (from profile site.toml [backend.options])"
    )
    assert values["UCX_TCP_TX_SEG_SIZE"]["value"] == "64k"
    assert "set before the backend opened" in values["UCX_TCP_TX_SEG_SIZE"]["source"]
    assert report.ignored == {"UCX_TCP_TX_SEG_SIZE": "512k (backend.options.env.UCX_TCP_TX_SEG_SIZE"
                              " (from default))"}  # fmt: skip
    user = {"UCX_NET_DEVICES": "eth1"}
    process.apply_process_defaults(KvcrOptions(), {}, user)
    assert user["UCX_NET_DEVICES"] == "eth1"
    unset = process.apply_process_defaults(KvcrOptions(ucx_net_devices=None), {}, {})
    assert unset.to_dict()["env"]["UCX_NET_DEVICES"]["source"].startswith("UCX default")


def test_a_user_ucx_tls_without_tcp_is_refused_with_the_fix() -> None:
    from kvcr_policy_kvcr.options import KvcrOptions

    with pytest.raises(ConfigError) as caught:
        _process().apply_process_defaults(KvcrOptions(), {}, {"UCX_TLS": "sm,self"})
    text = str(caught.value)
    assert "env UCX_TLS='sm,self'" in text and "add tcp to UCX_TLS or unset it" in text


def test_the_backend_reports_every_process_default(kvcr_pipeline: Any) -> None:
    pipeline = kvcr_pipeline()
    pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
    described = pipeline.stats().transport
    process = described["process"]
    assert process["nixl_progress_thread"] == {
        "value": False,
        "source": "backend.options.progress_thread (from default)",
    }
    port = process["listen_ports"]["kv"]
    assert port["source"].startswith("chosen free")
    assert process["env"]["UCX_NET_DEVICES"]["value"] == os.environ["UCX_NET_DEVICES"]
    assert described["operation_timeout_s"]["source"].startswith("transport.op_timeout_s")
    # NIXL's listener holds the chosen port while the pool is open.
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind(("0.0.0.0", port["value"]))


def test_a_configured_listen_port_serves_one_pool(kvcr_pipeline: Any) -> None:
    from kvcr_policy_kvcr.process import free_port

    port = free_port()
    pipeline = kvcr_pipeline(backend__options__listen_port=port)
    pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
    assert pipeline.stats().transport["process"]["listen_ports"]["kv"]["value"] == port
    with pytest.raises(
        PoolError, match=r"listen_port = \d+ \(from override\) already serves pool 'kv'"
    ):
        pipeline.register_pool("swa", geometry(), pool_buffer(geometry()))
    assert "swa" in pipeline.refused


def test_a_listen_port_in_use_refuses_the_pool_with_the_fix(kvcr_pipeline: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pipeline = kvcr_pipeline(backend__options__listen_port=port)
        with pytest.raises(PoolError, match=r"listen_port = \d+ \(from override\) is in use"):
            pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
    assert "kv" in pipeline.refused


def test_a_runner_that_fails_to_start_frees_its_region_once_kvcr_stopped(
    kvcr_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCR's own start failure (its listener cannot bind: the port was taken after it was
    chosen) raises KVCRStartupError; KVCR's quiescence check decides whether the region can go."""
    from kvcr_policy_kvcr import backend

    from kvcr_policy.memory import region as tier

    opened: list[Any] = []
    original = tier.open_region
    monkeypatch.setattr(
        tier, "open_region", lambda *a, **k: opened.append(original(*a, **k)) or opened[-1]
    )
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(backend, "free_port", lambda: port)  # both attempts meet it
        pipeline = kvcr_pipeline()
        with pytest.raises(PoolError, match="the KVCR runner could not start"):
            pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
    assert [r.state for r in opened] == ["closed"]
    assert not opened[0].leaked


def _threads() -> dict[str, int]:
    """CPU ticks of each thread of this process."""
    ticks = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            fields = Path(task, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[task] = int(fields[11]) + int(fields[12])
    return ticks


def _threads_added(progress_thread: bool) -> int:
    before = set(_threads())
    options = {"backend.name": "kvcr", "backend.options.progress_thread": progress_thread}
    with build_pipeline(load_config("default", environ={}, overrides=options)) as pipeline:
        pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
        time.sleep(0.2)
        return len(set(_threads()) - before)


def test_nixl_progress_thread_is_off_unless_asked_for() -> None:
    """NIXL's progress thread spins a core while idle (~99 % on this kind of machine); off by
    default, the runner starts exactly one thread fewer, and it still moves bytes (the other
    tests of this module run without it)."""
    assert _threads_added(True) == _threads_added(False) + 1


def test_pages_move_with_the_progress_thread_on_too(kvcr_pipeline: Any) -> None:
    pipeline = kvcr_pipeline(backend__options__progress_thread=True)
    geo = geometry()
    buffer = pool_buffer(geo)
    pipeline.register_pool("kv", geo, buffer)
    from tests.support.pools import fresh_keys, pages_of, token_indices

    keys = fresh_keys(6)
    assert pipeline.set(keys, token_indices(range(6), P)) == [True] * 6
    view = pages_of(buffer, geo)
    expected = view[:, :6].copy()
    assert pipeline.get(keys, token_indices(range(10, 16), P)) == [True] * 6
    assert np.array_equal(view[:, 10:16], expected)


BLOCKED = """
import sys
from importlib.abc import MetaPathFinder

class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "kvcr" or name.startswith(("kvcr.", "nixl")):
            raise ImportError(f"{name} blocked for this test")
        return None

sys.meta_path.insert(0, Block())
from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import PluginError

loaded = load_config("default", environ={}, overrides={"backend.name": "kvcr"})
print("validated", loaded.config.backend.options["ucx_net_devices"])
try:
    build_pipeline(loaded)
except PluginError as err:
    print("refused:", err)
"""


def test_a_profile_naming_kvcr_validates_where_the_runner_is_missing() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", BLOCKED],
        env=child_env(drop=("KVCR_POLICY_",)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "validated lo" in done.stdout
    assert "refused: backend 'kvcr' needs the KVCR runner" in done.stdout
    assert "pip install kvcr-policy-kvcr" in done.stdout


QUIET = """
import logging
import numpy as np
from kvcr_policy import build_pipeline, load_config
from kvcr_policy.geometry import PoolGeometry

geometry = PoolGeometry("kv", "page_first", 2, 2, 8, "uint8", 4, 32)
overrides = {"backend.name": "kvcr", "placement.capacity_bytes": geometry.nbytes}
with build_pipeline(load_config("default", environ={}, overrides=overrides)) as pipeline:
    pipeline.register_pool("kv", geometry, np.zeros(geometry.shape, dtype=np.uint8))
    pipeline.probe(64)
print("only this", logging.raiseExceptions)
"""


def test_nixl_prints_nothing_on_stdout() -> None:
    """NIXL's own logging prints INFO lines on stdout, where a command's JSON goes: routed to
    the application's logging instead, and Python's logging.raiseExceptions left alone."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", QUIET],
        env=child_env(drop=("KVCR_POLICY_", "NIXL_")),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout == "only this True\n"
