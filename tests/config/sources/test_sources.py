"""Tests for kvcr_policy.config.sources: each source alone, its leaves, origins and problems."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvcr_policy.config.sources import (
    dotenv_source,
    env_name,
    env_source,
    flatten,
    known_leaves,
    override_source,
    profile_source,
    read_dotenv,
    suggest,
)

pytestmark = pytest.mark.usefixtures("clean_env")


def test_known_leaves_cover_every_section_field() -> None:
    leaves = known_leaves()
    assert "batching.read_batch_pages" in leaves
    assert "placement.numa_nodes" in leaves
    assert "batching.options" in leaves  # an open table, checked later by the strategy
    assert not any(path.count(".") != 1 for path in leaves)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("batching.read_batch_pages", "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"),
        ("thread_tuning.switch_interval_s", "KVCR_POLICY_THREAD_TUNING__SWITCH_INTERVAL_S"),
        ("plugins.allow", "KVCR_POLICY_PLUGINS"),
        ("plugins.block", "KVCR_POLICY_DISABLE_PLUGINS"),
    ],
)
def test_env_name(path: str, name: str) -> None:
    assert env_name(path) == name


def test_flatten_keeps_option_values_whole() -> None:
    nested = {
        "batching": {"read_batch_pages": 8, "options": {"a": 1, "deep": {"b": 2}}},
        "placement": {"numa_nodes": [0, 1]},
    }
    assert flatten(nested) == {
        "batching.read_batch_pages": 8,
        "batching.options.a": 1,
        "batching.options.deep": {"b": 2},
        "placement.numa_nodes": [0, 1],
    }


def test_suggest_finds_near_names_only() -> None:
    assert suggest("read_batch_page", ["read_batch_pages", "query_batch_keys"]) == (
        "read_batch_pages"
    )
    assert suggest("zzz", ["read_batch_pages"]) is None


def test_profile_source_origins_name_file_and_table(write_profile: Callable[..., Path]) -> None:
    path = write_profile(
        """
        [batching]
        read_batch_pages = 64
        [batching.options]
        x = 1
        """
    )
    leaves, issues = profile_source(path)
    assert issues == []
    assert leaves == {
        "batching.read_batch_pages": (64, f"profile {path} [batching]"),
        "batching.options.x": (1, f"profile {path} [batching.options]"),
    }


def test_profile_source_reports_unknown_keys(write_profile: Callable[..., Path]) -> None:
    path = write_profile("[batching]\nread_batch_page = 64\nquery_batch_keys = 8\n")
    leaves, issues = profile_source(path)
    assert list(leaves) == ["batching.query_batch_keys"]
    (issue,) = issues
    assert issue.path == "batching.read_batch_page"
    assert issue.origin == f"profile {path} [batching]"
    assert "did you mean 'batching.read_batch_pages'?" in issue.message


def test_profile_source_reports_bad_toml(write_profile: Callable[..., Path]) -> None:
    path = write_profile("[batching\n")
    leaves, issues = profile_source(path)
    assert leaves == {}
    assert issues[0].origin == str(path)
    assert "not valid TOML" in issues[0].message


def test_profile_source_reports_unreadable_file(tmp_path: Path) -> None:
    leaves, issues = profile_source(tmp_path)  # a directory cannot be read as a file
    assert leaves == {}
    assert "cannot read the profile" in issues[0].message


def test_env_source_reads_only_prefixed_variables() -> None:
    leaves, issues = env_source(
        {
            "KVCR_POLICY_BATCHING__READ_BATCH_PAGES": "64",
            "KVCR_POLICY_PROFILE": "throughput",  # reserved: selects, is not a field
            "KVCR_POLICY_TRACE_HOOKS": "1",
            "HOME": "/root",
        }
    )
    assert issues == []
    name = "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"
    assert leaves == {"batching.read_batch_pages": ("64", f"env {name}")}


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("KVCR_POLICY_PLACEMENT__NUMA_NODES", "0, 1", ["0", "1"]),
        ("KVCR_POLICY_PLACEMENT__NUMA_NODES", "[0, 1]", [0, 1]),
        ("KVCR_POLICY_PLACEMENT__NUMA_NODES", "", []),
        ("KVCR_POLICY_BATCHING__WINDOW_PAGES", "none", None),
        ("KVCR_POLICY_PLUGINS", "a,b", ["a", "b"]),
        ("KVCR_POLICY_PLUGINS", "[]", []),
        ("KVCR_POLICY_PLUGINS", "", []),  # an empty allow-list: no third-party plugin loads
        ("KVCR_POLICY_PLUGINS", "none", None),  # no allow-list: every plugin loads
        ("KVCR_POLICY_DISABLE_PLUGINS", "", []),
        ("KVCR_POLICY_COALESCING__STRATEGY", "none", "none"),  # a name, not an unset value
        ("KVCR_POLICY_BATCHING__OPTIONS__PAGE_BYTES", "16", 16),
        ("KVCR_POLICY_BATCHING__OPTIONS__PAGE_BYTES", "16MiB", "16MiB"),
    ],
)
def test_env_source_decodes_values(name: str, raw: str, value: object) -> None:
    leaves, issues = env_source({name: raw})
    assert issues == []
    ((_, (got, origin)),) = leaves.items()
    assert (got, origin) == (value, f"env {name}")


def test_env_source_names_nearest_variable_for_a_typo() -> None:
    name = "KVCR_POLICY_BATCHING__READ_BATCH_PAGE"
    leaves, issues = env_source({name: "64"})
    assert leaves == {}
    (issue,) = issues
    assert issue.origin == f"env {name}"
    assert "KVCR_POLICY_BATCHING__READ_BATCH_PAGES (batching.read_batch_pages)" in issue.message


def test_env_source_reports_bad_json() -> None:
    _, issues = env_source({"KVCR_POLICY_PLACEMENT__NUMA_NODES": "[0,"})
    assert "cannot parse '[0,'" in issues[0].message


def test_env_source_reports_each_bad_variable_of_one_section() -> None:
    # pydantic-settings stops at the first bad value of a section; each variable is its own.
    leaves, issues = env_source(
        {
            "KVCR_POLICY_PLUGINS": "[a,",
            "KVCR_POLICY_DISABLE_PLUGINS": '["b"',
            "KVCR_POLICY_PLUGINS__STRICT": "true",
        }
    )
    assert leaves == {"plugins.strict": ("true", "env KVCR_POLICY_PLUGINS__STRICT")}
    assert [(i.path, i.origin) for i in issues] == [
        ("plugins.block", "env KVCR_POLICY_DISABLE_PLUGINS"),
        ("plugins.allow", "env KVCR_POLICY_PLUGINS"),
    ]
    assert all(i.message.startswith("cannot parse ") for i in issues)


def test_env_source_takes_a_json_options_table_leaf_by_leaf() -> None:
    name = "KVCR_POLICY_BATCHING__OPTIONS"
    leaves, issues = env_source({name: '{"page_bytes": "16MiB", "n": 2}'})
    assert issues == []
    assert leaves == {
        "batching.options.page_bytes": ("16MiB", f"env {name}"),
        "batching.options.n": (2, f"env {name}"),
    }


def test_env_source_keeps_the_variable_name_as_written() -> None:
    name = "kvcr_policy_Batching__Read_Batch_Pages"
    assert env_source({name: "8"}) == ({"batching.read_batch_pages": ("8", f"env {name}")}, [])


# --- .env files ---


def _dotenv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".env"
    path.write_text(text, encoding="utf-8")
    return path


def test_read_dotenv_reads_names_as_written_and_quoted_values(tmp_path: Path) -> None:
    path = _dotenv(
        tmp_path,
        "# a comment\nexport KVCR_POLICY_PROFILE=throughput\n"
        "KVCR_POLICY_PLACEMENT__NUMA_NODES='0, 1'  # inline comment\nOTHER_APP=x\n",
    )
    variables, issues = read_dotenv(path)
    assert issues == []
    assert variables == {
        "KVCR_POLICY_PROFILE": "throughput",
        "KVCR_POLICY_PLACEMENT__NUMA_NODES": "0, 1",
        "OTHER_APP": "x",
    }


def test_dotenv_source_origins_name_file_and_variable(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "KVCR_POLICY_PLACEMENT__NUMA_NODES=0,1\nOTHER_APP=x\n")
    leaves, issues = dotenv_source(read_dotenv(path)[0], path)
    assert issues == []
    name = "KVCR_POLICY_PLACEMENT__NUMA_NODES"
    assert leaves == {"placement.numa_nodes": (["0", "1"], f"dotenv {path} {name}")}


def test_dotenv_source_names_nearest_variable_for_a_typo(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "KVCR_POLICY_FALLBACK__MAX_RETRY=2\n")
    leaves, issues = dotenv_source(read_dotenv(path)[0], path)
    assert leaves == {}
    (issue,) = issues
    assert issue.origin == f"dotenv {path} KVCR_POLICY_FALLBACK__MAX_RETRY"
    assert "did you mean KVCR_POLICY_FALLBACK__MAX_RETRIES (fallback.max_retries)?" in (
        issue.message
    )
    assert f"remove it from {path}, or fix its name" in issue.message


def test_read_dotenv_reports_each_malformed_line(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, 'KVCR_POLICY_A=1\nKVCR_POLICY_B 2\nKVCR_POLICY_C="open\n')
    variables, issues = read_dotenv(path)
    assert [issue.origin for issue in issues] == [f"dotenv {path}"] * 2
    # The name only: the rest of a line that does not parse may be a secret's value.
    assert issues[0].message.startswith("line 2: cannot parse the line of KVCR_POLICY_B; expected")
    assert issues[1].message.startswith("line 3: cannot parse the line of KVCR_POLICY_C;")
    assert "open" not in issues[1].message
    assert variables == {"KVCR_POLICY_A": "1"}  # still checked, so the load reports it too


def test_dotenv_source_reports_a_name_without_value(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "KVCR_POLICY_FALLBACK__MAX_RETRIES\n")
    _, issues = dotenv_source(read_dotenv(path)[0], path)
    assert issues[0].message == "no value; write KVCR_POLICY_FALLBACK__MAX_RETRIES=VALUE"


def test_dotenv_source_refuses_variables_read_from_the_process_only(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "KVCR_POLICY_PROC_ROOT=/x\nKVCR_POLICY_TRACE_HOOKS=0\n")
    leaves, issues = dotenv_source(read_dotenv(path)[0], path)
    assert leaves == {}
    (issue,) = issues
    assert issue.origin == f"dotenv {path} KVCR_POLICY_PROC_ROOT"
    assert "read from the process environment only; export it instead" in issue.message


def test_read_dotenv_reports_an_unreadable_file(tmp_path: Path) -> None:
    variables, issues = read_dotenv(tmp_path / "missing.env")
    assert variables == {}
    assert issues[0].message == "cannot read the .env file: No such file or directory"


def test_override_source_takes_dotted_and_nested_keys() -> None:
    leaves, issues = override_source(
        {"batching.read_batch_pages": 64, "placement": {"numa_nodes": [0]}}
    )
    assert issues == []
    assert leaves == {
        "batching.read_batch_pages": (64, "override"),
        "placement.numa_nodes": ([0], "override"),
    }


def test_override_source_parses_strings_like_env() -> None:
    leaves, _ = override_source({"batching.window_pages": "none", "placement.numa_nodes": "0,1"})
    assert leaves["batching.window_pages"] == (None, "override")
    assert leaves["placement.numa_nodes"] == (["0", "1"], "override")


def test_override_source_reports_unknown_keys() -> None:
    leaves, issues = override_source({"batching.read_batch_page": 64})
    assert leaves == {}
    assert issues[0].origin == "override"
    assert "did you mean 'batching.read_batch_pages'?" in issues[0].message


@pytest.mark.parametrize(
    "name",
    [
        "KVCR_POLICY_SECURITY__TENANTS_DIR",
        "KVCR_POLICY_SECURITY__SECRET_FILE",
        "KVCR_POLICY_SECURITY__TENANT_QUOTA_BYTES",
        "KVCR_POLICY_BATCHING__WINDOW_PAGES",
    ],
)
def test_an_empty_value_never_unsets_an_optional_value(name: str) -> None:
    """An operator who meant to name a tenants folder got a server with one tenant (red team
    2026-12-b, B8): only ``none`` unsets."""
    leaves, issues = env_source({name: ""})
    assert leaves == {}
    (issue,) = issues
    assert "an empty value; write none to unset it" in issue.message
