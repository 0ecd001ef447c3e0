"""The bench adapters: dram and peer built in, a plugin's through ``kvcr_register_bench_backends``.

The core bench names no plugin backend: ``kvcr`` and ``mooncake`` reach ``--backend`` only
through their plugins' hook, and any installed plugin can add one the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvcr_policy.bench import BenchError, BenchSetup
from kvcr_policy.bench.backends import bench_backends
from kvcr_policy.bench.resolve import resolve
from kvcr_policy.bench_adapter import BenchBackend
from kvcr_policy.config.loading import load_config

pytestmark = pytest.mark.usefixtures("clean_env")

ADAPTER = """
    from contextlib import contextmanager

    from kvcr_policy import hookimpl
    from kvcr_policy.bench_adapter import BenchBackend

    class {cls}(BenchBackend):
        name = "{name}"

    @hookimpl
    def kvcr_register_bench_backends(register):
        register({what})
"""


def _adapter(name: str = "toy", what: str = "Toy") -> str:
    return ADAPTER.format(cls="Toy", name=name, what=what)


def test_the_builtins_are_dram_and_peer_and_the_plugins_add_theirs() -> None:
    found = bench_backends()
    # The built-in backends register their adapters as the plugins do, from their own package.
    assert found["dram"].__module__ == "kvcr_policy.backends.dram.bench"
    assert found["peer"].__module__ == "kvcr_policy.backends.peer.bench"
    assert found["kvcr"].__module__ == "kvcr_policy_kvcr.bench"
    assert found["mooncake"].__module__ == "kvcr_policy_mooncake.bench"
    assert all(issubclass(adapter, BenchBackend) for adapter in found.values())


def test_a_blocked_plugin_takes_its_bench_backend_with_it() -> None:
    loaded = load_config("default", environ={"KVCR_POLICY_DISABLE_PLUGINS": "mooncake"})
    assert "mooncake" not in bench_backends(loaded) and "kvcr" in bench_backends(loaded)


def test_a_plugin_adds_a_backend_that_bench_resolves(fake_dist: Callable[..., None]) -> None:
    fake_dist("kvcr-test-toy", {"toy": "kvcr_test_toy"}, {"kvcr_test_toy": _adapter()})
    assert bench_backends()["toy"].__module__ == "kvcr_test_toy"
    plan = resolve(BenchSetup(geometry="small", tokens=256, repeat=1, backend="toy"))
    assert plan.backend.name == "toy"


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (_adapter(name="dram"), r"bench backend 'dram' is registered twice .*kvcr_test_toy"),
        (_adapter(what="object"), r"registered <class 'object'> as a bench backend"),
    ],
)
def test_a_bad_registration_is_one_clear_error(
    fake_dist: Callable[..., None], source: str, match: str
) -> None:
    fake_dist("kvcr-test-toy", {"toy": "kvcr_test_toy"}, {"kvcr_test_toy": source})
    with pytest.raises(BenchError, match=match):
        bench_backends()
