"""Tests for kvcr_policy.config.order: schemas/ is fresh and the pinned field order holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvcr_policy.config.order import (
    FIELD_ORDER_FILE,
    JSON_SCHEMA_FILE,
    REGENERATE,
    check_field_order,
    check_schemas,
    current_field_order,
    json_schema,
    schemas_dir,
    write_schemas,
)
from kvcr_policy.config.schema import POSITIONAL_TYPES
from kvcr_policy.config.sources import known_leaves
from kvcr_policy.errors import SchemaDriftError


def test_committed_schemas_are_fresh() -> None:
    problems = check_schemas()
    assert not problems, f"schemas/ is stale; run `{REGENERATE}`:\n" + "\n".join(problems)


def test_every_positional_type_is_pinned() -> None:
    pinned = json.loads((schemas_dir() / FIELD_ORDER_FILE).read_text(encoding="utf-8"))
    assert {cls.__name__ for cls in POSITIONAL_TYPES} <= set(pinned)
    assert pinned["KVCRPolicyStorage.__init__"] == ["storage_config", "kwargs"]


def test_json_schema_names_the_env_var_of_each_leaf() -> None:
    schema = json_schema()
    batching = schema["$defs"]["BatchingSection"]["properties"]
    assert batching["read_batch_pages"]["x-env"] == "KVCR_POLICY_BATCHING__READ_BATCH_PAGES"
    assert schema["x-leaves"] == sorted(known_leaves())


@pytest.fixture
def schemas_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "schemas"
    shutil.copytree(schemas_dir(), folder)
    return folder


def _edit_pin(folder: Path, type_name: str, edit: object) -> None:
    path = folder / FIELD_ORDER_FILE
    pinned = json.loads(path.read_text(encoding="utf-8"))
    pinned[type_name] = edit(pinned[type_name])  # type: ignore[operator]
    path.write_text(json.dumps(pinned, indent=2) + "\n", encoding="utf-8")


def _swap(fields: list[str]) -> list[str]:
    fields[1], fields[2] = fields[2], fields[1]
    return fields


def test_swapped_pin_fails_naming_the_field(schemas_copy: Path) -> None:
    _edit_pin(schemas_copy, "BatchingSection", _swap)
    problems = check_schemas(schemas_copy)
    assert any(
        p.startswith("BatchingSection.query_batch_keys: pinned at position 1") for p in problems
    )
    assert any("BatchingSection.read_batch_pages" in p for p in problems)


def test_write_refuses_to_repin_a_moved_field(schemas_copy: Path) -> None:
    _edit_pin(schemas_copy, "BatchingSection", _swap)
    with pytest.raises(SchemaDriftError, match=r"BatchingSection\.query_batch_keys"):
        write_schemas(schemas_copy)


def test_removed_field_is_detected() -> None:
    pinned = current_field_order()
    current = {**pinned, "FallbackSection": ["strategy", "options"]}
    problems = check_field_order(pinned, current)
    assert problems[0].startswith("FallbackSection.max_retries: pinned at position 1")
    assert "renamed or removed" in problems[0]


def test_renamed_field_is_detected() -> None:
    pinned = current_field_order()
    renamed = ["strategy", "retries", "options"]
    problems = check_field_order(pinned, {**pinned, "FallbackSection": renamed})
    assert "FallbackSection.max_retries" in problems[0]
    assert "now 'retries'" in problems[0]


def test_removed_last_field_and_removed_type_are_detected() -> None:
    pinned = current_field_order()
    current = {k: v for k, v in pinned.items() if k != "PluginsSection"}
    current["FallbackSection"] = ["strategy", "max_retries"]
    problems = check_field_order(pinned, current)
    assert any("FallbackSection.options" in p and "(removed)" in p for p in problems)
    assert any(p.startswith("PluginsSection: the type is pinned") for p in problems)


def test_appended_fields_are_allowed() -> None:
    pinned = current_field_order()
    current = {**pinned, "FallbackSection": [*pinned["FallbackSection"], "backoff_s"]}
    assert check_field_order(pinned, current) == []


def test_an_unpinned_appended_field_asks_to_regenerate(schemas_copy: Path) -> None:
    _edit_pin(schemas_copy, "PluginsSection", lambda fields: fields[:-1])
    (problem,) = check_schemas(schemas_copy)
    assert "PluginsSection: new field(s) block are not pinned yet" in problem
    assert REGENERATE in problem
    write_schemas(schemas_copy)  # appending is allowed: the rewrite pins it at the end
    assert check_schemas(schemas_copy) == []


def test_stale_json_schema_names_the_regenerate_command(schemas_copy: Path) -> None:
    path = schemas_copy / JSON_SCHEMA_FILE
    schema = json.loads(path.read_text(encoding="utf-8"))
    schema["x-leaves"] = schema["x-leaves"][1:]
    path.write_text(json.dumps(schema), encoding="utf-8")
    (problem,) = check_schemas(schemas_copy)
    assert problem.endswith(f"is stale; run `{REGENERATE}` and commit schemas/")


def test_missing_folder_is_reported(tmp_path: Path) -> None:
    (problem,) = check_schemas(tmp_path)
    assert "cannot read the pinned field order" in problem
    assert REGENERATE in problem
