"""The connector's worker half times the steps that only prefill (the engine's prefill rate
for the admission gate), and a scheduler of its own reads the workers' figures from the stats
vLLM hands it. The pipeline is a recorder here: what is tested is what the worker reports
(the whole connector runs inside a real vLLM engine in ``test_connector.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvcr_policy.integrations.vllm.jobs import StepPlan
from kvcr_policy.integrations.vllm.worker import WorkerHalf


class Recorder:
    def __init__(self) -> None:
        self.prefills: list[tuple[int, float]] = []
        self.squares: list[int | None] = []

    def prefill_observed(
        self, tokens: int, seconds: float, steps: int = 1, squares: int | None = None
    ) -> None:
        assert steps == 1  # the worker reports each step alone
        self.prefills.append((tokens, seconds))
        self.squares.append(squares)


def test_a_step_that_only_prefills_reports_its_tokens_and_seconds() -> None:
    pipeline = Recorder()
    worker = WorkerHalf(pipeline, 4, 1024)
    worker.step_ended(StepPlan(prefill_tokens=64))  # no step began: nothing to time
    worker.step_started()
    worker.step_ended(StepPlan(prefill_tokens=0))  # a decode step: not a prefill rate
    worker.step_started()
    worker.step_ended(StepPlan(prefill_tokens=64))
    worker.step_started()
    worker.step_ended(StepPlan(prefill_tokens=96, prefill_squares=128**2 - 32**2))
    assert [tokens for tokens, _ in pipeline.prefills] == [64, 96]
    assert pipeline.squares == [None, 128**2 - 32**2]  # none given: each step one prompt
    assert pipeline.prefills[0][1] >= 0
    stats = worker.take_stats()
    assert stats["prefill_tokens"] == 160 and "prefill_us" in stats
    assert stats["prefill_squares"] == 128**2 - 32**2
    assert stats["prefill_steps"] == 2  # a scheduler of its own fits per step, not per sum
    worker.close()


def test_a_separate_scheduler_reads_the_workers_figures(vllm: None) -> None:
    from kvcr_policy.integrations.vllm.connector import (
        KVCRPolicyConnectorStats,
        workers_moved,
        workers_prefilled,
    )

    data = {"load_bytes": 4096, "load_us": 2000, "save_bytes": 0, "prefill_tokens": 64}
    output = SimpleNamespace(kv_connector_stats=KVCRPolicyConnectorStats(data=data))
    assert workers_moved(output, "load") == (4096, 0.002, 1)
    assert workers_moved(output, "save") is None  # nothing saved
    assert workers_prefilled(output) is None  # tokens without seconds: not a rate
    assert workers_moved(SimpleNamespace(kv_connector_stats=None), "load") is None
    # Two workers' stats of the same two steps, aggregated as vLLM does: the sums.
    one = {"prefill_tokens": 96, "prefill_us": 30_000, "prefill_steps": 2}
    summed = KVCRPolicyConnectorStats(data=dict(one)).aggregate(
        KVCRPolicyConnectorStats(data=dict(one))
    )
    assert workers_prefilled(SimpleNamespace(kv_connector_stats=summed)) == (192, 0.06, 4, None)
    # With the prompts' squared spans (a prompt of 96 tokens after 32 cached: 128**2 - 32**2).
    one["prefill_squares"] = 128**2 - 32**2
    summed = KVCRPolicyConnectorStats(data=dict(one)).aggregate(
        KVCRPolicyConnectorStats(data=dict(one))
    )
    prefilled = workers_prefilled(SimpleNamespace(kv_connector_stats=summed))
    assert prefilled == (192, 0.06, 4, 2 * (128**2 - 32**2))


def test_a_separate_scheduler_fits_its_workers_steps_apart_from_their_fixed_cost(
    vllm: None,
) -> None:
    from kvcr_policy.admission import AdmissionDesk
    from kvcr_policy.builtin.admission import NoAdmission
    from kvcr_policy.config.schema import AdmissionSection
    from kvcr_policy.integrations.vllm.connector import (
        KVCRPolicyConnector,
        KVCRPolicyConnectorStats,
    )
    from kvcr_policy.registry import NoOptions

    desk = AdmissionDesk(NoAdmission(AdmissionSection(), NoOptions()))
    pipeline = SimpleNamespace(admission=desk, prefill_observed=desk.prefills.add)
    connector = KVCRPolicyConnector.__new__(KVCRPolicyConnector)  # its scheduler half only
    ended: list[str] = []
    scheduler = SimpleNamespace(loads_ended=ended.extend)
    connector._scheduler, connector._pipeline = scheduler, pipeline  # type: ignore[assignment]
    # Injected steps: 10 ms each, then 20,000 tokens/s; the stats of an interval sum them.
    for steps, tokens in [(2, 400), (1, 50), (3, 900), (1, 2000), (2, 64)]:
        micros = round((steps * 0.010 + tokens / 20_000) * 1e6)
        data = {"prefill_tokens": tokens, "prefill_us": micros, "prefill_steps": steps}
        data.update(load_bytes=1 << 20, load_us=10_000, save_bytes=1 << 20, save_us=10_000)
        stats = KVCRPolicyConnectorStats(data=data)
        output = SimpleNamespace(kv_connector_stats=stats, finished_recving={f"r{steps}"})
        connector.update_connector_output(output)
    assert desk.prefills.fit() == pytest.approx((20_000, 0.010), rel=1e-3)
    assert desk.stores.per_second == pytest.approx(100 * (1 << 20))
    # The workers' get calls are not the restore rate: the scheduler times each restore from
    # its lookup to the load's end, which the outputs report (``finished_recving``).
    assert desk.restores.per_second is None
    assert sorted(ended) == ["r1", "r1", "r2", "r2", "r3"]
