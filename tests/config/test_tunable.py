"""Tunable declarations: checked when made, carried by the field, shown by the schema, and every
declared candidate accepted by its own field (so a bound added later cannot silently empty a
search)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.config.tunable import TUNABLE_KEY, Tunable, tunable, tunable_fields
from kvcr_policy.errors import UsageError
from kvcr_policy.registry import Registry
from kvcr_policy.tune.space import declared_knobs, field_adapter
from tests.strategies import scalars


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "either choices or low and high"),
        ({"choices": (1, 2), "low": 1, "high": 2}, "either choices or low and high"),
        ({"low": 4, "high": 2}, "expected low < high"),
        ({"low": 0, "high": 2, "log": True}, "a log range needs low > 0"),
        ({"choices": ([1],)}, "choices must be scalars"),
        ({"choices": (1, 1)}, "choices repeat a value"),
    ],
)
def test_a_malformed_declaration_is_refused_where_it_is_made(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        tunable(**kwargs)


@given(
    st.one_of(
        st.lists(scalars, min_size=1, max_size=6, unique_by=repr).map(
            lambda c: Tunable(choices=tuple(c))
        ),
        st.tuples(st.integers(1, 100), st.integers(1, 100), st.booleans()).map(
            lambda t: Tunable(low=t[0], high=t[0] + t[1], log=t[2])
        ),
    ),
    st.booleans(),
)
def test_a_declaration_round_trips_through_its_json(declared: Tunable, cpus: bool) -> None:
    declared = Tunable(
        choices=declared.choices,
        low=declared.low,
        high=declared.high,
        log=declared.log,
        at_most_cpus=cpus,
        when=(("transport.name", ("cpu",)),),
    )
    assert Tunable.from_json(json.loads(json.dumps(declared.to_json()))) == declared


def test_when_and_at_most_cpus() -> None:
    declared = Tunable(choices=(1, 2, 4, 8), at_most_cpus=True, when=(("a.b", ("x",)),))
    assert declared.candidates(cpus=3) == (1, 2)
    assert declared.applies({"a.b": "x"}) and not declared.applies({"a.b": "y"})


def test_fields_carry_their_declaration() -> None:
    from kvcr_policy.config.schema import BatchingSection

    found = tunable_fields(BatchingSection)
    assert found["read_batch_pages"].choices[:3] == (32, 64, 128)
    assert "strategy" not in found


def _every_declaration(registry: Registry) -> list[tuple[str, str, Tunable, Any]]:
    rows = []
    for section, field in PolicyConfig.model_fields.items():
        model = field.annotation
        for name, declared in tunable_fields(model).items():  # type: ignore[arg-type]
            adapter = field_adapter(model.model_fields[name])  # type: ignore[union-attr]
            rows.append(("kvcr-policy", f"{section}.{name}", declared, adapter))
    for spec in registry.specs.values():
        for name, declared in tunable_fields(spec.options).items():
            adapter = field_adapter(spec.options.model_fields[name])
            rows.append((spec.distribution, f"{spec.kind}.options.{name}", declared, adapter))
    return rows


def test_every_declared_candidate_is_a_valid_value_of_its_field(registry: Registry) -> None:
    rows = _every_declaration(registry)
    assert len(rows) >= 12  # schema, cpu and cuda transports, the example plugin
    for owner, path, declared, adapter in rows:
        for value in declared.choices:
            adapter.validate_python(value)  # raises, naming the field, if a bound excludes it
        if not declared.choices:
            adapter.validate_python(declared.low)
            adapter.validate_python(declared.high)
        assert owner and path


def test_the_schema_shows_which_fields_are_tunable() -> None:
    from kvcr_policy.config.order import json_schema

    defs = json_schema()["$defs"]
    batching = defs["BatchingSection"]["properties"]
    assert batching["read_batch_pages"][TUNABLE_KEY]["choices"][0] == 32
    assert TUNABLE_KEY not in batching["query_batch_keys"]
    threads = defs["TransportSection"]["properties"]["threads"][TUNABLE_KEY]
    assert threads["at_most_cpus"] is True and threads["when"] == {"transport.name": ["cpu"]}


def test_schema_tunable_lists_built_in_and_third_party_knobs(example_plugin: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "schema", "--tunable"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["path"]: row for row in json.loads(done.stdout)}
    assert rows["transport.options.gather_below_bytes"]["chosen"] == "transport.name = 'cuda'"
    adaptive = rows["batching.options.target_batch_bytes"]
    assert adaptive["owner"].startswith("kvcr-policy-example")
    assert adaptive["chosen"] == "batching.strategy = 'adaptive'"


def test_declared_knobs_cover_the_registry(registry: Registry) -> None:
    paths = {d.path for d in declared_knobs(registry)}
    assert {"batching.read_batch_pages", "transport.options.min_parallel_bytes"} <= paths
