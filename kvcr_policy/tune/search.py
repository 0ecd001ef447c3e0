"""The search: optuna's TPE sampler over the knobs, each trial one bench comparison.

A trial writes its candidate as a profile that extends the start (the same file ``--output``
would produce, so the candidate is loaded exactly as it will be), and measures it against the
start with the bench's runner: both orders, every restored byte verified, each restore beside a
limit probed right before it. The score is the bench's ``speedup_vs_baseline``: the median over
repeats and orders of the candidate's rate over the start's, taken in the same moment, which a
shared machine's drifting bandwidth affects least.

Trials run one at a time; the search stops when the next trial, plus the confirmation, would no
longer fit the budget (each estimated from the slowest trial so far).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bench import run_bench
from ..errors import KVCRPolicyError
from .setup import TuneError, TuneSetup
from .space import Knob
from .verdict import MIN_REPEATS
from .written import render_profile

__all__ = ["Search", "Trial", "confirm_repeats"]

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Trial:
    """One candidate: the knobs it changes from the start, and what it scored."""

    number: int
    changed: Mapping[str, Any]
    speedup: float | None
    ratio_to_limit: float | None
    seconds: float
    error: str | None = None

    @property
    def scored(self) -> bool:
        return self.speedup is not None and bool(self.changed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "changed": dict(self.changed),
            "speedup": None if self.speedup is None else round(self.speedup, 4),
            "ratio_to_limit": None
            if self.ratio_to_limit is None
            else round(self.ratio_to_limit, 4),
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }


def confirm_repeats(setup: TuneSetup, slowest_trial_s: float, left_s: float) -> int:
    """Repeats the confirmation can afford in ``left_s``: a trial's time per repeat bounds a
    repeat's cost (it also holds the trial's fixed costs), between 3 and ``setup.repeat``."""
    per_repeat = slowest_trial_s / setup.trial_repeat
    fits = math.floor(left_s / per_repeat) if per_repeat > 0 else setup.repeat
    return max(MIN_REPEATS, min(setup.repeat, fits))


@dataclass
class Search:
    """Runs trials until the budget says stop; ``trials`` holds every one, in order."""

    setup: TuneSetup
    knobs: list[Knob]
    #: The start as a candidate's ``[profile] base`` names it (a bundled name or a full path).
    start: str
    #: Values every candidate carries besides its knobs (the target's, e.g. the cuda transport).
    context: Mapping[str, Any]
    folder: Path
    deadline: float
    say: Say = lambda message: None
    on_trial: Callable[[Trial, Trial | None], None] = lambda trial, best: None
    clock: Callable[[], float] = time.monotonic
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial | None:
        scored = [t for t in self.trials if t.scored]
        return max(scored, key=lambda t: t.speedup or 0.0) if scored else None

    @property
    def slowest(self) -> float:
        """The longest trial, the first left out once others ran: it also pays the imports and
        first allocations of the process."""
        seconds = [t.seconds for t in self.trials]
        return max(seconds[1:] or seconds or [0.0])

    def candidate(self, changed: Mapping[str, Any], name: str) -> Path:
        """Write the profile of a candidate that changes ``changed`` from the start."""
        path = self.folder / f"{name}.toml"
        path.write_text(
            render_profile(base=self.start, values={**self.context, **changed}), encoding="utf-8"
        )
        return path

    def _objective(self, trial: Any) -> float:
        started = self.clock()
        changed: dict[str, Any] = {}
        speedup = ratio = error = None
        try:
            for knob in self.knobs:
                value = knob.suggest(trial)
                if not knob.same(value):
                    changed[knob.path] = value
            if not changed:  # the start itself: it is the baseline of every trial already
                speedup = 1.0
                return speedup
            profile = self.candidate(changed, f"trial-{trial.number}")
            bench = self.setup.bench(str(profile), self.start, self.setup.trial_repeat)
            result = run_bench(bench, self.say)
            if not result.verified:
                raise TuneError("restored bytes did not match what was stored")
            speedup, ratio = result.speedup_vs_baseline, result.ratio_to_limit("P")
            return speedup
        except KVCRPolicyError as err:
            error = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise
        finally:
            done = Trial(trial.number, changed, speedup, ratio, self.clock() - started, error)
            self.trials.append(done)
            self.on_trial(done, self.best)

    def _stop_when_full(self, study: Any, frozen: Any) -> None:
        reserve = self.slowest * self.setup.repeat / self.setup.trial_repeat
        if self.clock() + self.slowest + reserve > self.deadline:
            study.stop()

    def run(self) -> list[Trial]:
        """Search until the budget is spent; at least one trial runs."""
        import optuna

        # Failed trials are reported by on_trial; optuna would log each one again as a warning.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        sampler = optuna.samplers.TPESampler(seed=self.setup.seed)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(self._objective, catch=(KVCRPolicyError,), callbacks=[self._stop_when_full])
        return self.trials
