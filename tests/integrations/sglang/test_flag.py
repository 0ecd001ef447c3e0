"""The extra-config flag read as SGLang reads it: JSON text or @FILE, one clear error each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcr_policy.errors import ConfigError
from kvcr_policy.integrations.sglang.config import parse_extra_config
from kvcr_policy.integrations.sglang.flag import read_flag, read_object

OBJECT = {"backend_name": "kvcr_policy", "profile": "throughput", "overrides": {"a.b": 1}}


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml", ".yml"])
def test_at_file_in_every_format_sglang_reads(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"extra{suffix}"
    if suffix == ".toml":
        path.write_text(
            'backend_name = "kvcr_policy"\nprofile = "throughput"\n[overrides]\n"a.b" = 1\n'
        )
    elif suffix == ".json":
        path.write_text(json.dumps(OBJECT))
    else:
        path.write_text("backend_name: kvcr_policy\nprofile: throughput\noverrides: {a.b: 1}\n")
    assert read_flag(f"@{path}") == OBJECT
    assert read_flag(json.dumps(OBJECT)) == OBJECT


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"profile": "x",}', "not valid JSON (Expecting property name"),
        ("@/nonexistent/extra.toml", "cannot read the file (No such file or directory)"),
        ("@extra.ini", "SGLang reads only .json, .toml, .yaml, .yml files after '@'; got .ini"),
        ("[1, 2]", "expected a JSON object (a table), got list"),
    ],
)
def test_bad_input_is_one_clear_message(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_flag(value)
    text = str(caught.value)
    assert expected in text and "SGLang --hicache-storage-backend-extra-config" in text
    assert len(caught.value.issues) == 1


def test_a_file_that_is_not_what_its_name_says(tmp_path: Path) -> None:
    path = tmp_path / "extra.toml"
    path.write_text('profile = "throughput"\nprofile = "default"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_flag(f"@{path}")
    path = tmp_path / "extra.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_flag(f"@{path}")


def test_an_object_is_taken_as_is_and_other_types_are_refused() -> None:
    assert read_object({"x": 1}, "p", "o") == {"x": 1}
    with pytest.raises(ConfigError, match="expected a JSON object, JSON text or @FILE; got int"):
        read_object(3, "extra_config.overrides", "somewhere")


SECRET = "rt3-SECRET-5555-abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("secret.yaml", SECRET + "\n"),  # a scalar: "expected a JSON object, got str ..."
        ("broken.yaml", f"a: [{SECRET}\n"),  # PyYAML quotes the line it stopped at
        ("broken.json", f'{{"a": {SECRET}}}'),
        ("broken.toml", f"a = {SECRET}\n"),
        ("list.json", json.dumps([SECRET])),
    ],
)
def test_what_a_file_holds_is_never_shown_in_an_error(tmp_path: Path, name: str, text: str) -> None:
    """A file named after '@' may be (or link to) a secret: its errors say where and why, never
    what it holds (red team 2026-12-c, C11: 80 characters of a YAML secret were echoed)."""
    path = tmp_path / name
    path.write_text(text)
    for read in (
        lambda: read_flag(f"@{path}"),
        lambda: parse_extra_config({"overrides": f"@{path}"}),
    ):
        with pytest.raises(ConfigError) as caught:
            read()
        message = str(caught.value)
        assert path.name in message and "SECRET" not in message, message


def test_json_nested_too_deeply_is_one_message() -> None:
    deep = "[" * 60000 + "]" * 60000
    with pytest.raises(ConfigError, match="nested too deeply") as caught:
        read_flag(json.dumps({"overrides": "x"})[:-1] + f', "deep": {deep}}}')
    assert len(caught.value.issues) == 1
    with pytest.raises(ConfigError, match="nested too deeply"):
        read_object(deep, "extra_config.overrides", "here")
