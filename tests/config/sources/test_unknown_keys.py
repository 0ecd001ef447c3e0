"""Bounded work on every configuration input (red team 2026-12-c, C7): each source names its
first :data:`MAX_NAMED` unknown keys (each with the nearest valid name, which costs a difflib
search) and counts the rest in one issue; an error lists at most :data:`MAX_SHOWN` problems; JSON
nested past the interpreter's recursion limit is one problem, not a RecursionError.

The bound is asserted on what is done (suggestions made, issues kept), never on time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import load_config
from kvcr_policy.config.sources import common, env_source, override_source, profile_source
from kvcr_policy.config.sources.common import MAX_NAMED
from kvcr_policy.errors import MAX_SHOWN, ConfigError, ConfigIssue

MANY = 5000
DEEP = "[" * 30000 + "]" * 30000


@pytest.fixture
def suggestions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every word a nearest name was searched for."""
    searched: list[str] = []
    real = common.suggest

    def counted(word: str, candidates: list[str]) -> str | None:
        searched.append(word)
        return real(word, candidates)

    monkeypatch.setattr(common, "suggest", counted)
    return searched


def _bounded(issues: list[Any], searched: list[str]) -> None:
    assert len(issues) == MAX_NAMED + 1
    assert all(issue.message.startswith("unknown") for issue in issues[:MAX_NAMED])
    assert issues[-1].message.startswith(f"and {MANY - MAX_NAMED} more unknown keys")
    assert len(searched) <= MAX_NAMED


def test_a_profile_of_many_unknown_keys_names_the_first_and_counts_the_rest(
    tmp_path: Path, suggestions: list[str]
) -> None:
    path = tmp_path / "many.toml"
    path.write_text("[placement]\n" + "".join(f"k{i} = 1\n" for i in range(MANY)))
    leaves, issues = profile_source(path)
    assert leaves == {}
    _bounded(issues, suggestions)


def test_overrides_of_many_unknown_keys_are_bounded(suggestions: list[str]) -> None:
    leaves, issues = override_source({f"batching.k{i}": 1 for i in range(MANY)})
    assert leaves == {}
    _bounded(issues, suggestions)


def test_many_unknown_variables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvcr_policy.config.sources import env

    searched: list[str] = []
    monkeypatch.setattr(env, "suggest", lambda word, names: searched.append(word))
    leaves, issues = env_source({f"KVCR_POLICY_BATCHING__K{i}": "1" for i in range(MANY)})
    assert leaves == {}
    _bounded(issues, searched)


def test_many_unknown_options_are_bounded_and_the_message_too() -> None:
    options = {f"k{i}": 1 for i in range(MANY)}
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={}, overrides={"placement.options": options}, dotenv=False)
    issues = caught.value.issues
    assert len(issues) == MAX_NAMED + 1 and "more unknown keys" in issues[-1].message
    # However many problems a load finds, its message lists MAX_SHOWN and counts the rest.
    many = [ConfigIssue(f"batching.k{i}", "env", "unknown key") for i in range(MAX_SHOWN * 3)]
    lines = str(ConfigError(many)).splitlines()
    assert len(lines) == MAX_SHOWN + 2 and lines[0].endswith(f"{MAX_SHOWN * 3} problems")
    assert lines[-1] == f"  - ... and {MAX_SHOWN * 2} more (fix these first)"


@pytest.mark.parametrize(
    "load",
    [
        lambda: load_config(None, environ={"KVCR_POLICY_PLACEMENT__NUMA_NODES": DEEP}),
        lambda: load_config(None, environ={"KVCR_POLICY_BACKEND__OPTIONS": '{"a": ' + DEEP + "}"}),
        lambda: load_config(None, environ={}, overrides={"placement.numa_nodes": DEEP}),
        lambda: load_config(None, environ={}, overrides={"backend.options.master": DEEP}),
    ],
    ids=["env-list", "env-options", "override-list", "override-option"],
)
def test_json_nested_too_deeply_is_one_problem(load: Callable[[], object]) -> None:
    with pytest.raises(ConfigError, match="nested too deeply") as caught:
        load()
    assert len(caught.value.issues) == 1
