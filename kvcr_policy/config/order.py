"""The ordered-field contract and the JSON Schema: generate, write and check schemas/ files.

``schemas/field-order.json`` pins the positional order of every public config type: a pinned
field may not move, be renamed or be removed; new fields are appended at the end.
``schemas/kvcr-policy.schema.json`` is the JSON Schema of PolicyConfig, each field annotated
with the environment variable that sets it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SchemaDriftError
from ..values import SIZE_PATTERN
from .schema import POSITIONAL_TYPES, PolicyConfig
from .sources import env_name, known_leaves

__all__ = [
    "FIELD_ORDER_FILE",
    "INTEGRATION_SIGNATURES",
    "JSON_SCHEMA_FILE",
    "REGENERATE",
    "check_field_order",
    "check_schemas",
    "current_field_order",
    "json_schema",
    "positional_parameters",
    "schemas_dir",
    "standard_bounds",
    "write_schemas",
]

FIELD_ORDER_FILE = "field-order.json"
JSON_SCHEMA_FILE = "kvcr-policy.schema.json"
REGENERATE = "kvcr-policy schema --write"


def schemas_dir() -> Path:
    """The committed schemas/ folder of the source tree."""
    return Path(__file__).resolve().parents[2] / "schemas"


# Integration constructors whose positional signature is pinned beside the config types:
# pinned name -> (module file under kvcr_policy/, class, method).
INTEGRATION_SIGNATURES: dict[str, tuple[str, str, str]] = {
    "KVCRPolicyStorage.__init__": (
        "integrations/sglang/storage.py",
        "KVCRPolicyStorage",
        "__init__",
    ),
}


def positional_parameters(path: Path, class_name: str, method: str) -> list[str]:
    """Positional parameter names of ``class_name.method`` in ``path``, without ``self``.

    Read with :mod:`ast`, not by import: the SGLang backend module imports SGLang, which the
    contract check must not need.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    params = [*item.args.posonlyargs, *item.args.args]
                    return [param.arg for param in params][1:]
    message = f"{path}: no method {class_name}.{method} found; update INTEGRATION_SIGNATURES"
    raise SchemaDriftError(message)


def extra_positional_types() -> dict[str, list[str]]:
    """Positional signatures pinned beside the config types (integration constructors)."""
    package = Path(__file__).resolve().parents[1]
    return {
        pinned: positional_parameters(package / module, class_name, method)
        for pinned, (module, class_name, method) in INTEGRATION_SIGNATURES.items()
    }


def current_field_order() -> dict[str, list[str]]:
    """The positional order of each public config type, as the code has it now."""
    order = {cls.__name__: list(cls.model_fields) for cls in POSITIONAL_TYPES}
    order.update(extra_positional_types())
    return order


def check_field_order(
    pinned: Mapping[str, list[str]], current: Mapping[str, list[str]]
) -> list[str]:
    """Every way ``current`` breaks ``pinned``: moved, renamed or removed fields, lost types."""
    problems = []
    for type_name, fields in pinned.items():
        now = current.get(type_name)
        if now is None:
            problems.append(f"{type_name}: the type is pinned but no longer exists")
            continue
        for position, name in enumerate(fields):
            if position >= len(now):
                problems.append(
                    f"{type_name}.{name}: pinned at position {position}, but the type now has "
                    f"only {len(now)} fields (removed)"
                )
            elif now[position] != name:
                where = (
                    f"now at position {now.index(name)}" if name in now else "renamed or removed"
                )
                problems.append(
                    f"{type_name}.{name}: pinned at position {position}, but position "
                    f"{position} is now {now[position]!r} ({name!r} {where})"
                )
    return problems


#: pydantic leaves the bounds of a field whose type is not a plain number (a byte size: a
#: string or an integer) as these keys beside it; JSON Schema spells them as below.
_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def standard_bounds(field_schema: dict[str, Any]) -> dict[str, Any]:
    """``field_schema`` with pydantic's ``gt``/``ge``/``lt``/``le`` keys (at any level of an
    ``anyOf``) moved onto the integer branches below them as JSON Schema's bound keywords."""
    bounds = {_BOUNDS[k]: field_schema.pop(k) for k in list(field_schema) if k in _BOUNDS}
    for child in field_schema.get("anyOf", []):
        standard_bounds(child)
        if bounds:
            _apply_bounds(child, bounds)
    return field_schema


def _apply_bounds(node: dict[str, Any], bounds: dict[str, Any]) -> None:
    if node.get("type") in ("integer", "number"):
        node.update(bounds)
    if node.get("type") == "string" and "pattern" in node:  # a size: the strict text rule
        node["pattern"] = SIZE_PATTERN
    for child in node.get("anyOf", []):
        _apply_bounds(child, bounds)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of PolicyConfig, each leaf annotated with ``x-env``."""
    schema = PolicyConfig.model_json_schema()
    defs = schema.get("$defs", {})
    for section, prop in schema["properties"].items():
        ref = prop.get("$ref", "")
        target = defs.get(ref.rsplit("/", 1)[-1]) if ref else None
        if target is None:
            continue
        for field, field_schema in target.get("properties", {}).items():
            standard_bounds(field_schema)
            field_schema["x-env"] = env_name(f"{section}.{field}")
    schema["x-env-prefix"] = "KVCR_POLICY_"
    schema["x-leaves"] = sorted(known_leaves())
    return schema


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write_schemas(folder: Path | None = None) -> list[Path]:
    """Regenerate both files; appended fields join the pin, pinned ones are kept in place."""
    folder = folder or schemas_dir()
    folder.mkdir(parents=True, exist_ok=True)
    order_path = folder / FIELD_ORDER_FILE
    current = current_field_order()
    if order_path.exists():
        pinned = json.loads(order_path.read_text(encoding="utf-8"))
        problems = check_field_order(pinned, current)
        if problems:
            message = (
                "refusing to rewrite the pinned field order, because the code breaks it:\n  "
                + "\n  ".join(problems)
                + "\nMove the field back (new fields go at the end), or, for a deliberate "
                "breaking release, delete schemas/field-order.json and run "
                f"`{REGENERATE}`"
            )
            raise SchemaDriftError(message)
    order_path.write_text(_dump(current), encoding="utf-8")
    schema_path = folder / JSON_SCHEMA_FILE
    schema_path.write_text(_dump(json_schema()), encoding="utf-8")
    return [order_path, schema_path]


def check_schemas(folder: Path | None = None) -> list[str]:
    """Every way the committed files differ from the code; empty when both are fresh."""
    folder = folder or schemas_dir()
    problems: list[str] = []
    order_path = folder / FIELD_ORDER_FILE
    try:
        pinned = json.loads(order_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [f"{order_path}: cannot read the pinned field order ({err}); run `{REGENERATE}`"]
    current = current_field_order()
    problems += check_field_order(pinned, current)
    for type_name, fields in current.items():
        extra = fields[len(pinned.get(type_name, [])) :]
        if extra and not problems:
            problems.append(
                f"{type_name}: new field(s) {', '.join(extra)} are not pinned yet; "
                f"run `{REGENERATE}` and commit schemas/"
            )
    schema_path = folder / JSON_SCHEMA_FILE
    try:
        committed = json.loads(schema_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        committed = None
        problems.append(f"{schema_path}: cannot read ({err}); run `{REGENERATE}`")
    if committed is not None and committed != json.loads(_dump(json_schema())):
        problems.append(f"{schema_path} is stale; run `{REGENERATE}` and commit schemas/")
    return problems
