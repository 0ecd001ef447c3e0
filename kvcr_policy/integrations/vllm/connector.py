"""KVCRPolicyConnector: kvcr_policy as a vLLM KV connector (v1 API, vLLM 0.32).

vLLM loads it by name from ``--kv-transfer-config``::

    {"kv_connector": "KVCRPolicyConnector", "kv_role": "kv_both",
     "kv_connector_module_path": "kvcr_policy.integrations.vllm",
     "kv_connector_extra_config": {"profile": "throughput", "overrides": {...}}}

and builds one per role: the scheduler's (:mod:`.scheduler`: lookups, the step's plan) and each
worker's (:mod:`.worker`: the bytes, on threads of their own). The worker registers vLLM's own
KV blocks as the pipeline's pool (:mod:`.layout`) and moves pages straight between them and
the tier. Counters reach vLLM's connector stats (``get_kv_connector_stats``) and
:func:`.jobs.totals`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ...pipeline import build_pipeline
from ...strategies import Admission
from .config import parse_options
from .jobs import StepPlan, count
from .keys import namespace
from .layout import POOL, pool_of, scheduler_geometry
from .scheduler import SchedulerHalf
from .shared import publish, published, withdraw
from .startup import load, log_start
from .worker import WorkerHalf

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "KVCRPolicyConnector",
    "KVCRPolicyConnectorStats",
    "StepMetadata",
    "workers_moved",
    "workers_prefilled",
]

log = logging.getLogger("kvcr_policy.integrations.vllm")


class StepMetadata(KVConnectorMetadata):
    """One step's :class:`~.jobs.StepPlan`, as vLLM hands it to the workers."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class KVCRPolicyConnectorStats(KVConnectorStats):
    """Counters of the last interval (pages, bytes, lookups), summed over workers."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


def shared_by(config: VllmConfig) -> str | None:
    """Why the scheduler and workers need a tier they share, or None (one process)."""
    parallel = config.parallel_config
    executor = parallel.distributed_executor_backend
    if executor == "uni" and parallel.world_size == 1:
        return None
    return (
        f"vLLM executor {executor!r}, tp {parallel.tensor_parallel_size}, "
        f"pp {parallel.pipeline_parallel_size}"
    )


class KVCRPolicyConnector(KVConnectorBase_V1):
    """See the module docstring."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self.options = parse_options(transfer.kv_connector_extra_config)
        self.shared_by = shared_by(vllm_config)
        self.engine_id = str(transfer.engine_id)
        self.block = int(vllm_config.cache_config.block_size)
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        rank = parallel.rank % parallel.tensor_parallel_size
        mla = bool(getattr(model, "use_mla", False))
        self.prefix = namespace(
            str(model.model),
            str(vllm_config.cache_config.cache_dtype),
            self.block,
            rank,
            parallel.tensor_parallel_size,
            mla,
        )
        self.loaded = load(self.options, shared_by=self.shared_by)
        self._pipeline: Any = None
        self._worker: WorkerHalf | None = None
        self._scheduler: SchedulerHalf | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerHalf(
                self.block,
                self.prefix,
                self._lookup,
                self._declined,
                self._declines,
                self._restored,
            )
            if self.shared_by is not None:
                self._pipeline = build_pipeline(self.loaded)
                self._pipeline.register_pool(
                    POOL,
                    scheduler_geometry(kv_cache_config, self.block),
                    _one_page(kv_cache_config, self.block),
                )
        else:
            self._pipeline = build_pipeline(self.loaded)
        if self._pipeline is not None:
            # The scheduler times each restore from its lookup to vLLM's report that the load
            # ended (:meth:`_restored`); a worker's get call is only part of it.
            self._pipeline.admission.engine_times_restores = True
        log_start(
            f"vLLM connector ({role.name.lower()}, {self.shared_by or 'one process'})",
            self.options,
            self.loaded,
        )

    # ---- worker ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        pool = pool_of(kv_caches, self.block)
        self._pipeline.register_pool(POOL, pool.geometry, pool.buffer)
        self._worker = WorkerHalf(
            self._pipeline, self.block, pool.block_bytes * pool.geometry.layers
        )
        if self.shared_by is None:
            publish(self.engine_id, self._pipeline)

    def _plan(self) -> StepPlan:
        meta = self._get_connector_metadata()
        return meta.plan if isinstance(meta, StepMetadata) else StepPlan()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:  # before the step's forward pass (loads start after it)
            self._worker.step_started()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.submit(self._plan(), loads=True)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: vLLM schedules a request once its load is reported

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # whole blocks are saved once per step, in wait_for_save

    def wait_for_save(self) -> None:
        if self._worker is not None:
            plan = self._plan()
            self._worker.step_ended(plan)
            self._worker.submit(plan, loads=False)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        return self._worker.finished(set(finished_req_ids))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.load_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The last interval's counters: the scheduler's lookups and hits, or a worker's pages
        and bytes loaded and saved."""
        half = self._worker or self._scheduler
        if half is None:
            return None
        stats = half.take_stats()
        return KVCRPolicyConnectorStats(data=stats) if stats and any(stats.values()) else None

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVCRPolicyConnectorStats(data=dict(data or {}))

    # ---- scheduler ------------------------------------------------------------------------

    def _lookup(self, keys: list[str]) -> tuple[int, int]:
        """``(present, admitted)`` leading blocks of ``keys``."""
        pipeline = self._pipeline or published(self.engine_id)
        if pipeline is None:
            return 0, 0  # the worker has not registered its blocks yet
        # The admission strategy may report fewer (``admission.strategy``; none: all): a
        # block not reported is computed by vLLM instead of loaded, and noted by the
        # admission (not saved again: :meth:`_declined`).
        present = int(pipeline.exists(keys, POOL))
        return present, pipeline.admit(present, [POOL], keys)

    def _declines(self, pages: int) -> Admission | None:
        """The admission's decision when it would report none of a lookup's ``pages``
        blocks, present or not (:meth:`~kvcr_policy.pipeline.Pipeline.declines`, which counts
        it, every block declined): the scheduler answers "no hit" at once, without asking the
        tier (vLLM computes them, present or not, and its saves of them are planned without
        waiting). None otherwise, or before the pool is known."""
        pipeline = self._pipeline or published(self.engine_id)
        return None if pipeline is None else pipeline.declines(pages, [POOL])

    def _restored(self, pages: int, seconds: float) -> None:
        """A request waited ``seconds`` for its ``pages`` restored blocks, from the lookup that
        asked the tier to vLLM's report that the load ended: the admission's restore rate
        (the worker's get call alone leaves out the lookup's round trip and vLLM's steps)."""
        pipeline = self._pipeline or published(self.engine_id)
        if pipeline is not None:
            pipeline.restored(pages, seconds, [POOL])

    def _declined(self, keys: Sequence[str]) -> list[bool] | None:
        """Per key of a planned save, whether a lookup declined it (then forgotten); None
        when none was (:meth:`kvcr_policy.declined.DeclinedKeys.split`)."""
        pipeline = self._pipeline or published(self.engine_id)
        return None if pipeline is None else pipeline.admission.declined.split(POOL, keys)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        if num_external_tokens > 0:
            self._scheduler.allocated(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._scheduler is not None
        plan = self._scheduler.plan(scheduler_output)
        if plan.saves:
            count(save_pages_planned=sum(len(job.keys) for job in plan.saves))
        return StepMetadata(plan)

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        return self._scheduler.finished(request), None

    def update_connector_output(self, connector_output: Any) -> None:
        """The loads the workers reported ended time the requests' restores (:meth:`_restored`,
        in every executor). A scheduler in a process of its own (``mp`` executor, several
        ranks) moves nothing itself: the workers' saves of the step (bytes and seconds, in the
        stats they return to it) feed its admission's store rate, and their prefill its
        prefill rate, as a worker's own do in one process."""
        if self._scheduler is None:
            return
        self._scheduler.loads_ended(getattr(connector_output, "finished_recving", None) or ())
        if self._pipeline is None:
            return
        moved = workers_moved(connector_output, "save")
        if moved is not None:
            self._pipeline.admission.stores.add(*moved)
        prefilled = workers_prefilled(connector_output)
        if prefilled is not None:
            self._pipeline.prefill_observed(*prefilled)

    # ---- both -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()
        if self._pipeline is not None:
            withdraw(self.engine_id, self._pipeline)
            self._pipeline.close()


def _stats(connector_output: Any) -> dict[str, Any]:
    stats = getattr(connector_output, "kv_connector_stats", None)
    return getattr(stats, "data", None) or {}


def workers_moved(connector_output: Any, name: str) -> tuple[int, float, int] | None:
    """The bytes the workers loaded (``name`` load) or saved (save), their seconds and how
    many calls they sum (each sum keeps seconds = fixed * calls + bytes / rate), from a step's
    ``KVConnectorOutput`` (its ``kv_connector_stats``: :class:`KVCRPolicyConnectorStats`);
    None when there were none."""
    data = _stats(connector_output)
    nbytes, micros = int(data.get(f"{name}_bytes", 0)), int(data.get(f"{name}_us", 0))
    calls = max(1, int(data.get(f"{name}_calls", 1)))
    return (nbytes, micros / 1e6, calls) if nbytes > 0 and micros > 0 else None


def workers_prefilled(connector_output: Any) -> tuple[int, float, int, int | None] | None:
    """The tokens the workers' prefill-only steps computed, their seconds, how many steps and
    their prompts' squared spans (None where the stats carry none) (summed over the
    interval's steps and the workers: each sum keeps seconds = fixed * steps + tokens / rate
    + quadratic * squares), from a step's ``KVConnectorOutput``; None when there were none."""
    data = _stats(connector_output)
    tokens, micros = int(data.get("prefill_tokens", 0)), int(data.get("prefill_us", 0))
    steps = int(data.get("prefill_steps", 0))
    squares = int(data.get("prefill_squares", 0)) or None
    if tokens > 0 and micros > 0 and steps > 0:
        return tokens, micros / 1e6, steps, squares
    return None


def _one_page(kv_cache_config: Any, block: int) -> Any:
    import torch

    geometry = scheduler_geometry(kv_cache_config, block)
    dtype = getattr(torch, geometry.dtype)
    return torch.zeros((geometry.layers, block, 1, geometry.head_dim), dtype=dtype)
