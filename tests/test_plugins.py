"""Tests for kvcr_policy.plugins and the example third-party plugin (plugins/kvcr-policy-example).

Tests of the example plugin skip unless it is installed (``pip install -e
plugins/kvcr-policy-example``; .ci/run does). Broken and duplicate plugins are fabricated as
real distributions: a temporary ``*.dist-info`` folder (METADATA + entry_points.txt) and a
module on ``sys.path``. That goes through the same ``importlib.metadata`` discovery as an
installed plugin, so the distribution name and version a report quotes are the real ones;
monkeypatching ``entry_points`` would skip exactly the part under test.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy import hookspecs
from kvcr_policy.cli import main
from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import BatchingSection, PluginsSection, PolicyConfig
from kvcr_policy.errors import ConfigError, PluginError
from kvcr_policy.plugins import make_plugin_manager
from kvcr_policy.registry import NoOptions, Registry, Spec
from kvcr_policy.strategies import BatchingStrategy

EXAMPLE_DIST = "kvcr-policy-example"

pytestmark = pytest.mark.usefixtures("clean_env")
needs_example = pytest.mark.usefixtures("example_plugin")

ProfileWriter = Callable[..., Path]
ADAPTIVE_PROFILE = """
    [batching]
    strategy = "adaptive"
    window_batches = 4

    [batching.options]
    page_bytes = "16MiB"
    target_batch_bytes = "256MiB"
"""


# --- fabricated distributions ---


REGISTERS = """
    from kvcr_policy import hookimpl

    @hookimpl
    def kvcr_register_strategies(register):
        {body}
"""


def _registering(body: str) -> str:
    return REGISTERS.format(body=body)


def test_plugin_that_fails_to_import_is_reported_and_skipped(
    fake_dist: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    fake_dist("kvcr-test-broken", {"broken": "kvcr_test_no_such_module"}, {})
    with caplog.at_level(logging.WARNING, logger="kvcr_policy.plugins"):
        registry = make_plugin_manager(environ={}).registry
    (broken,) = [b for b in registry.broken if b.name == "broken"]
    assert broken.distribution == "kvcr-test-broken"
    assert broken.reason.startswith("import failed: ModuleNotFoundError")
    assert not broken.blocked
    assert "plugin 'broken' (kvcr-test-broken) skipped" in caplog.text
    assert registry.find("batching", "fixed") is not None  # the rest still loads


def test_plugin_that_fails_to_import_raises_in_strict_mode(
    fake_dist: Callable[..., None], write_profile: ProfileWriter
) -> None:
    fake_dist("kvcr-test-broken", {"broken": "kvcr_test_no_such_module"}, {})
    strict = write_profile("[plugins]\nstrict = true\n")
    with pytest.raises(PluginError) as caught:
        load_config(strict, environ={})
    message = str(caught.value)
    assert "plugin 'broken' (kvcr-test-broken 1.2.3, kvcr_test_no_such_module)" in message
    assert "plugins.strict is true" in message
    assert (caught.value.plugin, caught.value.distribution) == ("broken", "kvcr-test-broken")


def test_plugin_failing_to_register_raises_naming_it_in_strict_mode(
    fake_dist: Callable[..., None], write_profile: ProfileWriter
) -> None:
    body = "register('bogus', 'thing', lambda section, options: None)"
    fake_dist(
        "kvcr-test-badkind",
        {"badkind": "kvcr_test_badkind"},
        {"kvcr_test_badkind": _registering(body)},
    )
    with pytest.raises(PluginError, match="unknown kind 'bogus'") as caught:
        load_config(write_profile("[plugins]\nstrict = true\n"), environ={})
    assert (caught.value.plugin, caught.value.distribution) == ("badkind", "kvcr-test-badkind")
    # The registering callback itself names the plugin too, before the manager wraps it.
    assert isinstance(caught.value.__cause__, PluginError)
    assert caught.value.__cause__.plugin == "badkind"


def test_broken_plugin_listed_by_the_cli(
    fake_dist: Callable[..., None], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_dist("kvcr-test-broken", {"broken": "kvcr_test_no_such_module"}, {})
    main(["plugins", "--format", "json"])
    skipped = {s["name"]: s for s in json.loads(capsys.readouterr().out)["skipped"]}
    assert skipped["broken"]["distribution"] == "kvcr-test-broken"
    assert skipped["broken"]["blocked"] is False


def test_plugin_failing_to_register_is_rolled_back(fake_dist: Callable[..., None]) -> None:
    body = (
        "register('batching', 'half', lambda section, options: None)\n"
        "        register('bogus', 'thing', lambda section, options: None)"
    )
    fake_dist(
        "kvcr-test-badkind",
        {"badkind": "kvcr_test_badkind"},
        {"kvcr_test_badkind": _registering(body)},
    )
    registry = make_plugin_manager(environ={}).registry
    (broken,) = [b for b in registry.broken if b.name == "badkind"]
    assert "unknown kind 'bogus'" in broken.reason
    assert registry.find("batching", "half") is None  # nothing of a skipped plugin remains


def test_duplicate_registration_names_both_plugins(fake_dist: Callable[..., None]) -> None:
    body = "register('batching', 'fixed', lambda section, options: None)"
    fake_dist("kvcr-test-dup", {"dup": "kvcr_test_dup"}, {"kvcr_test_dup": _registering(body)})
    registry = make_plugin_manager(environ={}).registry
    (broken,) = [b for b in registry.broken if b.name == "dup"]
    assert "batching 'fixed' is registered twice" in broken.reason
    assert "plugin 'builtin.batching' (kvcr-policy)" in broken.reason
    assert "plugin 'dup' (kvcr-test-dup)" in broken.reason
    assert registry.get("batching", "fixed").plugin == "builtin.batching"


def test_duplicate_registration_raises_in_strict_mode(
    fake_dist: Callable[..., None], write_profile: ProfileWriter
) -> None:
    body = "register('batching', 'fixed', lambda section, options: None)"
    fake_dist("kvcr-test-dup", {"dup": "kvcr_test_dup"}, {"kvcr_test_dup": _registering(body)})
    with pytest.raises(PluginError, match=r"by plugin 'builtin\.batching'.*by plugin 'dup'") as got:
        load_config(write_profile("[plugins]\nstrict = true\n"), environ={})
    assert (got.value.plugin, got.value.distribution) == ("dup", "kvcr-test-dup")


def test_registry_add_refuses_a_second_spec() -> None:
    def spec(plugin: str) -> Spec:
        return Spec("batching", "x", object, NoOptions, "", plugin, f"dist-{plugin}", "1")

    registry = Registry()
    registry.add(spec("a"))
    with pytest.raises(
        PluginError, match=r"plugin 'a' \(dist-a\) and by plugin 'b' \(dist-b\)"
    ) as caught:
        registry.add(spec("b"))
    assert (caught.value.plugin, caught.value.distribution) == ("b", "dist-b")  # the refused one


def test_unknown_name_is_a_plugin_error_about_no_plugin() -> None:
    with pytest.raises(PluginError, match="no batching named 'nothing'") as caught:
        Registry().get("batching", "nothing")
    assert (caught.value.plugin, caught.value.distribution) == (None, None)


def test_observer_exceptions_are_logged_not_raised(
    fake_dist: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    source = """
        from kvcr_policy import hookimpl

        @hookimpl
        def kvcr_pipeline_opened(pipeline):
            raise RuntimeError("observer broke")
    """
    fake_dist(
        "kvcr-test-observer", {"observer": "kvcr_test_observer"}, {"kvcr_test_observer": source}
    )
    pm = make_plugin_manager(environ={})
    with caplog.at_level(logging.ERROR, logger="kvcr_policy.plugins"):
        pm.call_safely("kvcr_pipeline_opened", pipeline=None)
    assert "plugin 'observer' failed in kvcr_pipeline_opened; ignored" in caplog.text


WATCHER = """
    from kvcr_policy import hookimpl

    OPENED = []

    @hookimpl
    def kvcr_pipeline_opened(pipeline):
        OPENED.append(pipeline)
"""


def _watched(build: Callable[[], object]) -> list[object]:
    """The pipelines the ``watch`` plugin saw open while ``build`` ran (none if not loaded)."""
    build()
    module = sys.modules.get("kvcr_test_watch")
    return list(getattr(module, "OPENED", []))


@pytest.mark.parametrize(
    ("name", "value"),
    [("KVCR_POLICY_DISABLE_PLUGINS", "watch"), ("KVCR_POLICY_PLUGINS", "")],
    ids=["blocked", "not-allowed"],
)
def test_blocked_plugin_stays_blocked_when_the_environment_changes_before_build(
    fake_dist: Callable[..., None], monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    from kvcr_policy.pipeline import build_pipeline

    fake_dist("kvcr-test-watch", {"watch": "kvcr_test_watch"}, {"kvcr_test_watch": WATCHER})
    monkeypatch.setenv(name, value)
    loaded = load_config()
    assert loaded.registry is not None
    assert "watch" in [b.name for b in loaded.registry.broken if b.blocked]
    monkeypatch.delenv(name)  # were it read again, nothing would keep the plugin out now
    assert _watched(lambda: build_pipeline(loaded).close()) == []
    # The same plugin, not kept out at load time, does see the pipeline: the check can fail.
    assert len(_watched(lambda: build_pipeline(load_config()).close())) == 1


def test_build_reuses_the_plugin_manager_of_the_load(fake_dist: Callable[..., None]) -> None:
    from kvcr_policy.pipeline import build_pipeline

    fake_dist("kvcr-test-watch", {"watch": "kvcr_test_watch"}, {"kvcr_test_watch": WATCHER})
    loaded = load_config(environ={})
    assert loaded.plugin_manager is not None
    assert loaded.registry is loaded.plugin_manager.registry
    pipeline = build_pipeline(loaded)
    pipeline.close()
    assert _watched(lambda: None) == [pipeline]
    assert "PluginManager" not in repr(loaded)
    assert loaded == load_config(environ={})  # managers are not compared


def test_loaded_config_without_a_manager_still_builds(registry: Registry) -> None:
    from kvcr_policy.config.loading import LoadedConfig
    from kvcr_policy.pipeline import build_pipeline

    given = load_config(environ={}, registry=registry)
    assert given.plugin_manager is None  # the caller's registry, no manager of the load's own
    older = LoadedConfig(given.config, given.origins, given.profile)
    with build_pipeline(older) as pipeline:
        assert pipeline.config == given.config


def test_environment_alone_does_not_block_a_plugin(fake_dist: Callable[..., None]) -> None:
    body = "register('batching', 'watched', lambda section, options: None)"
    fake_dist("kvcr-test-w2", {"w2": "kvcr_test_w2"}, {"kvcr_test_w2": _registering(body)})
    environ = {"KVCR_POLICY_DISABLE_PLUGINS": "w2", "KVCR_POLICY_PLUGINS": ""}
    registry = make_plugin_manager(PolicyConfig(), environ=environ).registry
    assert registry.find("batching", "watched") is not None  # allow/block: config only
    blocked = PolicyConfig(plugins=PluginsSection(block=("w2",)))
    assert make_plugin_manager(blocked).registry.find("batching", "watched") is None


COUNTING = """
    from kvcr_policy import hookimpl

    CALLS = []

    @hookimpl
    def kvcr_register_strategies(register):
        CALLS.append("kvcr_register_strategies")

    @hookimpl
    def kvcr_register_transports(register):
        CALLS.append("kvcr_register_transports")

    @hookimpl
    def kvcr_register_backends(register):
        CALLS.append("kvcr_register_backends")

    @hookimpl
    def kvcr_pipeline_opened(pipeline):
        CALLS.append("kvcr_pipeline_opened")

    @hookimpl
    def kvcr_pipeline_closed(pipeline, stats):
        CALLS.append("kvcr_pipeline_closed")
"""


@pytest.mark.parametrize("profile", ["default", "throughput"])
def test_hooks_run_when_a_pipeline_is_built_never_per_page(
    fake_dist: Callable[..., None], profile: str
) -> None:
    """A plugin implementing every hook sees each call: loading and building call hooks, moving
    1 page or 64 pages (64 batches) calls none, closing calls one."""
    import numpy as np

    from kvcr_policy import build_pipeline
    from kvcr_policy.geometry import PoolGeometry

    fake_dist(
        "kvcr-test-counting", {"counting": "kvcr_test_counting"}, {"kvcr_test_counting": COUNTING}
    )
    assert set(hookspecs.__dict__) >= {
        "kvcr_register_strategies", "kvcr_register_transports", "kvcr_register_backends",
        "kvcr_pipeline_opened", "kvcr_pipeline_closed",
    }  # fmt: skip
    overrides = {
        "batching.read_batch_pages": 1,
        "batching.read_batch_bytes": None,  # 64 batches of one page, not joined
        "placement.capacity_bytes": "1MiB",
    }
    loaded = load_config(profile, environ={}, overrides=overrides)
    import kvcr_test_counting  # type: ignore[import-not-found]  # imported by the load

    calls: list[str] = kvcr_test_counting.CALLS
    geo = PoolGeometry(
        name="kv", layout="page_first", layers=2, heads=2, head_dim=8, dtype="float16",
        page_size=2, tokens=2 * 256,
    )  # fmt: skip
    pool = np.zeros(geo.shape, dtype=np.float16)
    pipeline = build_pipeline(loaded)
    # Registration hooks ran while the config was loaded or the pipeline built (once each).
    assert calls.count("kvcr_register_strategies") >= 1
    assert calls[-1] == "kvcr_pipeline_opened" and calls.count("kvcr_pipeline_opened") == 1
    pipeline.register_pool("kv", geo, pool)
    before = len(calls)
    for n in (1, 64):
        keys = [f"{n}-{i}" for i in range(n)]
        tokens = np.arange(n * geo.page_size)
        assert pipeline.set(keys, tokens) == [True] * n
        assert pipeline.exists(keys) == n
        assert pipeline.get(keys, tokens + 128 * geo.page_size) == [True] * n
        assert pipeline.delete(keys) == n
    assert calls[before:] == [], "a hook ran while pages moved"
    assert pipeline.stats().batches >= 2 * 65
    pipeline.close()
    assert calls[before:] == ["kvcr_pipeline_closed"]


def test_trace_hooks_prints_hook_calls(capsys: pytest.CaptureFixture[str]) -> None:
    make_plugin_manager(environ={"KVCR_POLICY_TRACE_HOOKS": "1"})
    traced = capsys.readouterr().err
    assert "kvcr_register_strategies [hook]" in traced
    assert "kvcr_register_transports [hook]" in traced
    make_plugin_manager(environ={"KVCR_POLICY_TRACE_HOOKS": "0"})
    assert capsys.readouterr().err == ""


def test_builtins_are_registered_like_plugins() -> None:
    no_third_party = PolicyConfig(plugins=PluginsSection(allow=()))
    registry = make_plugin_manager(no_third_party).registry
    providers = {spec.plugin for spec in registry.specs.values()}
    assert {"builtin.batching", "builtin.coalescing", "builtin.fallback"} <= providers
    assert {spec.distribution for spec in registry.specs.values()} == {"kvcr-policy"}


def test_every_hook_is_documented() -> None:
    hooks = [name for name, _ in inspect.getmembers(hookspecs) if name.startswith("kvcr_")]
    assert len(hooks) >= 4
    for name in hooks:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called by" in doc, f"hook {name} does not say who calls it"


# --- the example plugin ---


@needs_example
def test_example_is_registered_with_its_distribution() -> None:
    spec = make_plugin_manager(environ={}).registry.get("batching", "adaptive")
    assert (spec.plugin, spec.distribution) == ("example", EXAMPLE_DIST)
    assert spec.version == metadata.version(EXAMPLE_DIST)


@needs_example
def test_example_listed_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plugins", "--format", "json"])
    listed = json.loads(capsys.readouterr().out)
    adaptive = {s["name"]: s for s in listed["strategies"]["batching"]}["adaptive"]
    assert adaptive["plugin"] == "example"
    assert adaptive["distribution"] == EXAMPLE_DIST
    assert adaptive["version"] == metadata.version(EXAMPLE_DIST)


@needs_example
def test_example_selected_from_a_profile_like_a_builtin(write_profile: ProfileWriter) -> None:
    path = write_profile(ADAPTIVE_PROFILE)
    loaded = load_config(path, environ={})
    section = loaded.config.batching
    assert section.strategy == "adaptive"
    assert section.options["page_bytes"] == 16 << 20
    assert section.options["first_batch_bytes"] is None  # defaults filled by its options model
    assert loaded.origin("batching.options.page_bytes") == f"profile {path} [batching.options]"
    assert loaded.origin("batching.options.max_batch_pages") == "default"
    assert loaded.registry is not None
    batching = loaded.registry.get("batching", "adaptive").create(section, options=section.options)
    assert isinstance(batching, BatchingStrategy)
    assert batching.read_batches(40) == [(0, 16), (16, 32), (32, 40)]
    assert batching.window.batches == 4


@needs_example
def test_example_options_come_from_env_too(write_profile: ProfileWriter) -> None:
    name = "KVCR_POLICY_BATCHING__OPTIONS__TARGET_BATCH_BYTES"
    loaded = load_config(write_profile(ADAPTIVE_PROFILE), environ={name: "1GiB"})
    assert loaded.config.batching.options["target_batch_bytes"] == 1 << 30
    assert loaded.origin("batching.options.target_batch_bytes") == f"env {name}"


@needs_example
def test_example_unknown_option_names_the_nearest(write_profile: ProfileWriter) -> None:
    path = write_profile(ADAPTIVE_PROFILE + "    target_batch_byte = 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    (issue,) = caught.value.issues
    assert issue.path == "batching.options.target_batch_byte"
    assert issue.origin == f"profile {path} [batching.options]"
    assert "did you mean 'target_batch_bytes'?" in issue.message


@needs_example
@pytest.mark.parametrize(
    ("options", "path", "needle"),
    [
        ("min_batch_pages = 9", "batching.options.page_bytes", "expected: field required"),
        (
            "page_bytes = 1\nmin_batch_pages = 9\nmax_batch_pages = 8",
            "batching.options",
            "min_batch_pages (9) must be at most batching.options.max_batch_pages (8)",
        ),
        ("page_bytes = 0", "batching.options.page_bytes", "greater than 0"),
    ],
)
def test_example_options_are_validated(
    write_profile: ProfileWriter, options: str, path: str, needle: str
) -> None:
    profile = write_profile(f"[batching]\nstrategy = 'adaptive'\n[batching.options]\n{options}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(profile, environ={})
    (issue,) = caught.value.issues
    assert issue.path == path
    assert issue.origin == f"profile {profile} [batching.options]"
    assert needle in issue.message


@needs_example
def test_blocked_example_cannot_be_selected(write_profile: ProfileWriter) -> None:
    path = write_profile(ADAPTIVE_PROFILE)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"KVCR_POLICY_DISABLE_PLUGINS": "example"})
    (issue,) = caught.value.issues
    assert issue.path == "batching.strategy"
    assert issue.origin == f"profile {path} [batching]"
    assert "unknown batching strategy 'adaptive'" in issue.message
    assert "registered: fixed" in issue.message
    assert "example (blocked by plugins.block)" in issue.message


@needs_example
def test_block_list_reports_the_plugin_as_blocked() -> None:
    registry = load_config(environ={"KVCR_POLICY_DISABLE_PLUGINS": "other, example"}).registry
    assert registry is not None
    assert registry.find("batching", "adaptive") is None
    (blocked,) = [b for b in registry.broken if b.name == "example"]
    assert (blocked.distribution, blocked.blocked) == (EXAMPLE_DIST, True)


@needs_example
@pytest.mark.parametrize(("allow", "loaded"), [("example", True), ("other", False), ("", False)])
def test_allow_list(allow: str, loaded: bool) -> None:
    registry = load_config(environ={"KVCR_POLICY_PLUGINS": allow}).registry
    assert registry is not None
    assert (registry.find("batching", "adaptive") is not None) is loaded
    assert registry.find("batching", "fixed") is not None  # built-ins always load
    if not loaded:
        (skipped,) = [b for b in registry.broken if b.name == "example"]
        assert skipped.reason == "not in plugins.allow"


@needs_example
def test_allow_list_from_a_profile(write_profile: ProfileWriter) -> None:
    path = write_profile(ADAPTIVE_PROFILE + "[plugins]\nallow = ['other']\n")
    with pytest.raises(ConfigError, match=r"not in plugins\.allow"):
        load_config(path, environ={})


def _adaptive(options: Mapping[str, object], **section: object) -> BatchingStrategy:
    from kvcr_policy_example import AdaptiveBatching, AdaptiveOptions

    return AdaptiveBatching(BatchingSection(**section), AdaptiveOptions(**options))


@needs_example
@pytest.mark.parametrize(
    ("page_bytes", "pages"), [("16KiB", 4096), ("256KiB", 1024), ("4MiB", 64), ("16MiB", 16)]
)
def test_example_sizes_batches_in_bytes(page_bytes: str, pages: int) -> None:
    batching = _adaptive({"page_bytes": page_bytes, "target_batch_bytes": "256MiB"})
    assert batching.read_batches(10_000)[0] == (0, pages)


@needs_example
def test_example_batches_fit_the_window() -> None:
    options = {"page_bytes": "16MiB", "target_batch_bytes": "1GiB"}
    assert _adaptive(options, read_batch_pages=8, window_pages=8).read_batches(9)[0] == (0, 8)
    assert _adaptive(options, window_bytes="64MiB").read_batches(9)[0] == (0, 4)


@needs_example
@given(
    n_pages=st.integers(0, 5000),
    page_kib=st.integers(1, 1 << 14),
    target_kib=st.integers(1 << 14, 1 << 20),
    first_kib=st.none() | st.integers(1, 1 << 14),
    window_pages=st.none() | st.integers(128, 4096),
)
def test_example_batches_cover_once_in_order_within_bounds(
    n_pages: int, page_kib: int, target_kib: int, first_kib: int | None, window_pages: int | None
) -> None:
    options = {
        "page_bytes": page_kib << 10,
        "target_batch_bytes": target_kib << 10,
        "first_batch_bytes": None if first_kib is None else first_kib << 10,
    }
    batching = _adaptive(options, window_pages=window_pages)
    batches = batching.read_batches(n_pages)
    assert [p for start, stop in batches for p in range(start, stop)] == list(range(n_pages))
    sizes = [stop - start for start, stop in batches]
    limit = max(1, min(4096, (target_kib // page_kib) or 1, window_pages or 4096))
    assert all(0 < size <= limit for size in sizes)
    assert sizes[:-1] == sorted(sizes[:-1])  # the ramp only grows
