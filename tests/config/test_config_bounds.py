"""Values the red team's config matrix (2026-12-01, S9) got accepted, through every source:
strict sizes, upper bounds on integers, finite and sane floats, policy names at load; every
bound in the JSON Schema and in the field's description; secrets never echoed, never read from
a profile or an override; a value echoed in an error cut to a sane length."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, get_origin

import pytest
from pydantic import BaseModel

from kvcr_policy import load_config
from kvcr_policy.backends.peer.options import UcxOptions
from kvcr_policy.config.order import json_schema, standard_bounds
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.config.sources import env_name, known_leaves
from kvcr_policy.errors import MAX_LINE, ArgumentError, ConfigError, PluginError
from kvcr_policy.registry import Registry
from kvcr_policy.values import parse_size, shorten

UCX = {"transport.name": "ucx"}

#: (leaf, value as text, what the message says); every one was accepted before.
REFUSED: list[tuple[str, str, str]] = [
    ("placement.capacity_bytes", "64GiB garbage", "nothing after it"),
    ("placement.capacity_bytes", "６４GiB", "ASCII digits"),
    ("placement.capacity_bytes", "1000EiB", "less than or equal"),
    ("placement.capacity_bytes", "64 gigs", "unknown size unit"),
    ("placement.capacity_bytes", "1.5", "whole number of bytes"),
    ("batching.window_bytes", "1.0001KiB", "whole number of bytes"),
    ("batching.window_bytes", "1GiB garbage", "nothing after it"),
    ("coalescing.split_bytes", "8MiB!", "nothing after it"),
    ("transport.stream_min_bytes", "1MiB 2", "nothing after it"),
    ("placement.eviction", "bogus", "'lru' or 'fifo'"),
    ("placement.eviction", "LRU", "'lru' or 'fifo'"),
    ("transport.threads", "1000000000000", "less than or equal to 1024"),
    ("transport.threads", "100000", "less than or equal to 1024"),
    ("batching.read_batch_pages", "1000000000000", "less than or equal to 65536"),
    ("batching.query_batch_keys", "1000000000000", "less than or equal to 1048576"),
    ("batching.window_batches", "1000000000000", "less than or equal to 65536"),
    ("fallback.max_retries", "1000000000000", "less than or equal to 100"),
    ("transport.op_timeout_s", "inf", "finite number"),
    ("transport.op_timeout_s", "1e30", "less than or equal to 86400"),
    ("transport.op_timeout_s", "1e-300", "greater than or equal to 0.001"),
    ("transport.op_timeout_s", "nan", "finite number"),
    ("thread_tuning.switch_interval_s", "1e-300", "greater than or equal to 0.000001"),
    ("thread_tuning.switch_interval_s", "nan", "finite number"),
    ("security.tenant_max_sessions", "1000000", "less than or equal to 1024"),
    ("security.idle_timeout_s", "inf", "finite number"),
    ("security.tenant_quota_bytes", "1PiB and more", "nothing after it"),
    ("transport.options.connect_timeout_s", "inf", "finite number"),
    ("transport.options.heartbeat_s", "1e30", "less than or equal to 600"),
    ("transport.options.max_tiers", "1000000000000", "less than or equal to 1024"),
    ("transport.options.tcp_seg_size", "512KiB junk", "nothing after it"),
    # Red team 2026-12-b, B8:
    ("observability.link_limit_gbps", "0.0001GB/s", "greater than or equal to 0.001"),
    ("observability.link_limit_gbps", "50", "got a bare number '50'"),
    ("observability.link_limit_gbps", "100Gbps", "400Gbit/s"),
    ("transport.options.heartbeat_s", "1e-300", "expected 0 (off) or 0.05..600 s"),
    ("transport.options.peer", "[::1:7480", "is not a bracketed IPv6 address"),
]


def _load(source: str, leaf: str, value: str, tmp_path: Path, registry: Registry) -> Any:
    base = UCX if leaf.startswith("transport.options.") else {}
    if source == "override":
        return load_config(environ={}, overrides={**base, leaf: value}, registry=registry)
    if source == "env":
        environ = {env_name(leaf): value, **{env_name(k): v for k, v in base.items()}}
        return load_config(environ=environ, registry=registry)
    table, key = leaf.rsplit(".", 1)
    head = "[transport]\nname = 'ucx'\n" if base else ""
    profile = tmp_path / "p.toml"
    profile.write_text(f"{head}[{table}]\n{key} = {value!r}\n".replace("'", '"'), "utf-8")
    return load_config(profile, environ={}, registry=registry)


@pytest.mark.parametrize("source", ["override", "env", "profile"])
@pytest.mark.parametrize(
    ("leaf", "value", "says"), REFUSED, ids=[f"{c[0]}={c[1]}" for c in REFUSED]
)
def test_values_once_accepted_are_refused_naming_field_and_origin(
    source: str, leaf: str, value: str, says: str, tmp_path: Path, registry: Registry
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(source, leaf, value, tmp_path, registry)
    (issue,) = info.value.issues
    assert issue.path == leaf
    assert says in issue.message, issue.message
    assert {"override": "override", "env": "env KVCR", "profile": "profile "}[
        source
    ] in issue.origin


@pytest.mark.parametrize("raw", ["64", "64GiB", " 1.5 GiB ", "512mib", "1048576"])
def test_well_formed_sizes_still_load(raw: str, registry: Registry) -> None:
    loaded = load_config(environ={}, overrides={"placement.capacity_bytes": raw}, registry=registry)
    assert int(loaded.config.placement.capacity_bytes) > 0


def _number_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if node.get("type") in ("integer", "number") else []
    for child in node.get("anyOf", []):
        found += _number_nodes(child)
    return found


def _numbers(model: type[BaseModel], schema: dict[str, Any], prefix: str) -> list[tuple]:
    """(path, JSON Schema of each number in the field, description) of ``model``'s fields."""
    found = []
    for name, field in model.model_fields.items():
        props = standard_bounds(schema["properties"][name])
        items = props.get("items", {})
        for number in [*_number_nodes(props), *_number_nodes(items)]:
            found.append((f"{prefix}{name}", number, field.description or ""))
    return found


def test_every_number_is_bounded_and_says_so() -> None:
    schema = json_schema()
    defs = schema.get("$defs", {})
    fields = []
    for section, field in PolicyConfig.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        fields += _numbers(model, defs[model.__name__], f"{section}.")
    fields += _numbers(UcxOptions, UcxOptions.model_json_schema(), "transport.options.")
    assert len(fields) >= 22
    for path, number, description in fields:
        assert "maximum" in number or "exclusiveMaximum" in number, path
        assert "minimum" in number or "exclusiveMinimum" in number, path
        top = str(number.get("maximum", number.get("exclusiveMaximum")))
        words = description.replace("..", " ").replace("(", " ").replace(")", " ")
        # The description names the bound: the number, or its size with a unit.
        assert top.rstrip("0").rstrip(".") in words or any(u in description for u in "KMGTP"), (
            path,
            description,
        )
    leaves = set(known_leaves())
    assert all(p in leaves or p.startswith("transport.options.") for p, *_ in fields)


def test_every_registered_options_model_is_bounded_and_strict(registry: Registry) -> None:
    """Built-in and plugin options alike (every installed plugin's strategies, transports and
    backends): each number bounded on both sides, each byte size strict text (the red team
    found raw ByteSize and unbounded integers in transport and plugin options)."""
    from pydantic import TypeAdapter, ValidationError

    checked = sizes = 0
    for (kind, name), spec in registry.specs.items():
        model = spec.options
        for path, number, _ in _numbers(model, model.model_json_schema(), f"{kind} {name}: "):
            assert "maximum" in number or "exclusiveMaximum" in number, path
            assert "minimum" in number or "exclusiveMinimum" in number, path
            checked += 1
        for field in model.model_fields.values():
            if "ByteSize" not in repr(field.annotation):
                continue
            annotation = field.annotation
            typed = Annotated[(annotation, *field.metadata)] if field.metadata else annotation
            adapter: TypeAdapter[Any] = TypeAdapter(typed)
            per_key = get_origin(annotation) is dict  # e.g. a size per tenant
            for bad in ("64GiB garbage", "1.5", "６４GiB"):
                with pytest.raises(ValidationError):
                    adapter.validate_python({"tenant": bad} if per_key else bad)
            sizes += 1
    assert checked >= 10 and sizes >= 3, (checked, sizes)


def test_a_secret_is_never_echoed_nor_read_from_a_profile_or_an_override(
    tmp_path: Path, registry: Registry, write_profile: Any
) -> None:
    secret = "s3cret-value-that-must-not-leak"
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={"security.secret": secret}, registry=registry)
    assert "never read from overrides" in str(info.value) and secret not in str(info.value)
    profile = write_profile(f'[security]\nsecret = "{secret}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(profile, environ={}, registry=registry)
    assert "never read from a profile" in str(info.value) and secret not in str(info.value)
    with pytest.raises(ConfigError) as info:  # too short: refused, and not shown
        load_config(environ={"KVCR_POLICY_SECURITY__SECRET": "short1"}, registry=registry)
    assert "16 to 4096 characters" in str(info.value) and "short1" not in str(info.value)
    loaded = load_config(environ={"KVCR_POLICY_SECURITY__SECRET": secret}, registry=registry)
    assert loaded.config.security.secret is not None
    assert loaded.config.security.secret.get_secret_value() == secret
    assert secret not in repr(loaded) and secret not in str(loaded.config.model_dump(mode="json"))
    shown = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "show", "--format", "json"],
        capture_output=True,
        text=True,
        env={"KVCR_POLICY_SECURITY__SECRET": secret, "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert shown.returncode == 0 and secret not in shown.stdout and "**********" in shown.stdout


def test_a_secret_comes_from_a_secrets_directory(tmp_path: Path, registry: Registry) -> None:
    (tmp_path / "kvcr_policy_security__secret").write_text("from-the-secrets-dir-123\n")
    loaded = load_config(environ={"KVCR_POLICY_SECRETS_DIR": str(tmp_path)}, registry=registry)
    assert loaded.config.security.secret is not None
    assert loaded.config.security.secret.get_secret_value() == "from-the-secrets-dir-123"
    assert loaded.origin("security.secret").startswith(f"secrets {tmp_path}")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(environ={"KVCR_POLICY_SECRETS_DIR": str(tmp_path / "no")}, registry=registry)


def test_a_huge_value_is_cut_in_the_message(registry: Registry) -> None:
    huge = "9" * 50_000_000
    with pytest.raises(ConfigError) as info:
        load_config(
            environ={}, overrides={"batching.read_batch_pages": huge + "x"}, registry=registry
        )
    assert len(str(info.value)) < 2_000
    assert len(shorten("x" * 10**6)) < 100
    # Names are looked up, not validated by pydantic: each echo is cut too (red team S11).
    for leaf in ("batching.strategy", "coalescing.strategy", "transport.name", "backend.name"):
        with pytest.raises(ConfigError) as info:
            load_config(environ={}, overrides={leaf: "n" * 100_000}, registry=registry)
        assert len(str(info.value)) < 2_000 and "registered:" in str(info.value), leaf
    with pytest.raises(PluginError) as error:
        registry.get("batching", "n" * 100_000)
    assert len(str(error.value)) < 1_000
    # Whatever a message quotes, no error's text holds a line longer than MAX_LINE.
    assert max(map(len, str(ArgumentError("v" * 10**6 + "\nfix: ...")).split("\n"))) <= MAX_LINE


def test_command_line_sizes_are_strict_and_bounded() -> None:
    assert parse_size("1GiB", what="--size") == 1 << 30
    for bad, says in (("0", "from 1"), ("1000EiB", "from 1"), ("1GiB garbage", "nothing after")):
        with pytest.raises(ArgumentError, match=says):
            parse_size(bad, what="--size")


def _float_fields(registry: Registry) -> list[tuple[str, type[BaseModel], str]]:
    """(where, model, field) of every float field: the schema's, the ucx transport's and each
    registered options model's."""
    models: list[tuple[str, type[BaseModel]]] = [
        (section, field.annotation)  # type: ignore[misc]
        for section, field in PolicyConfig.model_fields.items()
    ]
    models.append(("transport.options", UcxOptions))
    models += [(f"{kind} {name}", spec.options) for (kind, name), spec in registry.specs.items()]
    found = []
    for where, model in models:
        for name, field in model.model_fields.items():
            if "float" in repr(field.annotation):
                found.append((where, model, name))
    return found


def test_no_float_takes_nan_inf_or_a_vanishing_value(registry: Registry) -> None:
    """A float of 1e-300 passed every `gt=0` bound and made a poll or recheck loop spin (red
    team 2026-12-b, B8): every float is finite and has a sane least value (0 may mean off)."""
    fields = _float_fields(registry)
    assert len(fields) >= 12, fields
    for where, model, name in fields:
        for bad in ("nan", "inf", "-inf", "1e-300", "-1e-300"):
            try:
                model.model_validate({name: bad})
            except ValueError as err:  # pydantic's ValidationError is a ValueError
                errors = getattr(err, "errors", lambda: [])()
                assert any(e["loc"][:1] == (name,) for e in errors), (where, name, bad, errors)
            else:
                raise AssertionError(f"{where}.{name} = {bad} was accepted")


@pytest.mark.parametrize("names", ["../x", "a b", "ok,x/y", '["", "a"]'])
def test_admin_tenants_must_be_names_a_tenant_can_have(names: str, registry: Registry) -> None:
    """Without tenants_dir such names were silently ignored (red team 2026-12-b, B8)."""
    with pytest.raises(ConfigError, match="no tenant can have this name"):
        load_config(environ={env_name("security.admin_tenants"): names}, registry=registry)
