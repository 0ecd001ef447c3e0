"""``tune`` and ``tune --remeasure`` as functions: search, confirm, write; or re-measure a file.

:func:`tune` checks every input first (through the bench's resolve: exit 2 before anything is
measured), builds the search space from the starting config, searches within the budget,
confirms the best candidate against the start (:mod:`.verdict`) and writes it only if that
confirmation is evidence of a win. :func:`check` re-measures a written profile against its
base on the axes its ``[profile.tune]`` recorded.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bench import BenchResult, run_bench
from ..bench.resolve import resolve
from ..config.loading import load_config
from ..config.profiles import read_meta
from ..config.selection import bundled_profiles, resolve_base, resolve_profile
from ..config.sources import flatten
from .host import describe_host
from .search import Search, Trial, confirm_repeats
from .setup import MAX_BUDGET_S, SHAPE_KEYS, TuneError, TuneSetup
from .space import Knob, search_space
from .verdict import MIN_REPEATS, Verdict, judge
from .written import render_profile

__all__ = ["Outcome", "check", "start_reference", "tune"]

Say = Callable[[str], None]


@dataclass
class Outcome:
    """What a ``tune`` or ``tune --remeasure`` found; ``to_dict()`` is its JSON."""

    setup: TuneSetup
    start: str
    knobs: list[Knob] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    confirmation: BenchResult | None = None
    verdict: Verdict | None = None
    written: Path | None = None
    seconds: float = 0.0
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        c = self.confirmation
        return {
            "start": self.start,
            "axes": self.setup.record(),
            "budget_s": self.setup.budget_s,
            "seconds": round(self.seconds, 1),
            "knobs": [k.path for k in self.knobs],
            "trials": [t.to_dict() for t in self.trials],
            "best": self.best.to_dict() if self.best else None,
            "confirmation": None
            if c is None
            else {
                "repeat": c.repeat,
                "bytes": c.nbytes,
                "limit_gigabytes_per_s": round(c.limit_gbps, 3),
            },
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "written": str(self.written) if self.written else None,
            "message": self.message,
        }


def start_reference(start: str) -> str:
    """The start as a ``[profile] base`` names it from anywhere: a bundled name, or the
    profile's full path."""
    if start in bundled_profiles():
        return start
    return str(resolve_profile(start, "tune --profile"))


def _base_for(start: str, target: Path) -> str:
    """The start as the written file names it: a bundled name, else a path relative to the
    written file's folder (so the two can move together)."""
    if start in bundled_profiles():
        return start
    return os.path.relpath(start, target.resolve().parent)


def _context(setup: TuneSetup, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The target's values that differ from the start (``transport.name = "cuda"``): a
    profile tuned on a GPU pool is a GPU profile."""
    plain = flatten(load_config(profile=setup.start).config.model_dump(mode="json"))
    return {path: value for path, value in overrides.items() if plain.get(path) != value}


def _header(outcome: Outcome, command: str, wins: bool) -> list[str]:
    s, c, v, best = outcome.setup, outcome.confirmation, outcome.verdict, outcome.best
    assert c is not None and v is not None and best is not None
    host = describe_host(gpu=s.target == "cuda")
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    first = (
        f"tuned — fastest measured on this host against {outcome.start!r}; only values that "
        "differ from it"
    )
    if not wins:
        first = f"NOT a confirmed win against {outcome.start!r} (written on request)"
    lines = [first, *host.lines(), f"date: {now}", f"command: {command}"]
    lines.append(
        f"measured: target {s.target}, backend {c.backend}, {s.geometry} {s.layout}"
        f"{' mla' if s.mla else ''}, {s.tokens} tokens ({c.nbytes / 2**20:.0f} MiB a restore)"
        f"{', scattered slots' if s.scatter else ''}; every restored byte verified"
    )
    lines.append(
        f"confirm: {c.repeat} restores a side in each order, medians; gain = median of "
        "tuned/base rates taken in the same moment, spread = their interquartile range"
    )
    lines += [f"  {o.describe()}" for o in v.orders]
    searched = sum(1 for t in outcome.trials if t.scored)
    lines.append(
        f"search: {searched} candidates measured (optuna TPE, seed {s.seed}), search and "
        f"confirmation in {outcome.seconds:.0f} s of a {s.budget_s:.0f} s budget; best trial "
        f"{best.speedup or 0:.3f}x the base"
    )
    return lines


def tune(
    setup: TuneSetup,
    *,
    write: Path | None = None,
    always_write: bool = False,
    command: str = "kvcr-policy tune",
    say: Say = lambda message: None,
    on_trial: Callable[[Trial, Trial | None], None] = lambda trial, best: None,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Search, confirm, and write ``write`` only on a confirmed win (or ``always_write``)."""
    began = clock()
    if not 0 < setup.budget_s <= MAX_BUDGET_S:  # nan fails both comparisons
        message = (
            f"--budget: expected seconds > 0 and at most {MAX_BUDGET_S:g}, got {setup.budget_s}"
        )
        raise TuneError(message)
    if setup.repeat < MIN_REPEATS or setup.trial_repeat < 1:
        message = (
            f"--repeat: a confirmation needs at least {MIN_REPEATS} repeats (got "
            f"{setup.repeat}); --trial-repeat at least 1 (got {setup.trial_repeat})"
        )
        raise TuneError(message)
    start = start_reference(setup.start)
    setup = replace(setup, start=start)
    plan = resolve(setup.bench(start, start, 1))  # every input checked: BenchError, exit 2
    measured = {
        **plan.target.overrides,
        "placement.capacity_bytes": plan.measured.nbytes,
        **plan.backend.planned(),
        **setup.overrides,
    }
    knobs = search_space(
        load_config(profile=start, overrides=measured),
        fixed=set(setup.overrides),
        only=setup.only,
    )
    outcome = Outcome(setup, start, knobs)
    if not knobs:
        outcome.message = f"nothing to tune: no tunable knob applies to {start!r} here"
        return outcome
    with tempfile.TemporaryDirectory(prefix="kvcr-tune-") as folder:
        search = Search(
            setup,
            knobs,
            start,
            _context(setup, plan.target.overrides),
            Path(folder),
            deadline=began + setup.budget_s,
            say=say,
            on_trial=on_trial,
            clock=clock,
        )
        outcome.trials = search.run()
        outcome.best = best = search.best
        if best is None:
            errors = [t.error for t in outcome.trials if t.error]
            if errors:
                raise TuneError(f"no candidate could be measured; the first failed: {errors[0]}")
            outcome.message = f"{start!r} stands: no candidate that differs from it was measured"
            outcome.seconds = clock() - began
            return outcome
        repeat = confirm_repeats(setup, search.slowest, began + setup.budget_s - clock())
        say(f"confirming the best candidate: {repeat} repeats in both orders")
        profile = search.candidate(best.changed, "candidate")
        result = run_bench(setup.bench(str(profile), start, repeat), say)
    outcome.confirmation = result
    outcome.verdict = verdict = judge(result, setup.screen_pct)
    outcome.seconds = clock() - began
    if verdict.wins:
        outcome.message = (
            f"the tuned profile wins: at least {verdict.gain * 100:+.1f} % in each order"
        )
    else:
        outcome.message = f"{start!r} stands: " + "; ".join(verdict.reasons())
    if write is not None and (verdict.wins or always_write):
        text = render_profile(
            base=_base_for(start, write),
            values={**search.context, **best.changed},
            header=_header(outcome, command, verdict.wins),
            record=setup.record(),
        )
        write.write_text(text, encoding="utf-8")
        outcome.written = write
    return outcome


def _recorded(path: Path, fallback: TuneSetup) -> TuneSetup:
    """The axes ``[profile.tune]`` of ``path`` recorded; ``fallback``'s where it has none."""
    meta, issues = read_meta(path)
    if issues:
        raise TuneError("; ".join(issue.render() for issue in issues))
    if meta.base is None:
        message = f"{path} names no base profile ([profile] base = ...): nothing to check against"
        raise TuneError(message)
    tune = dict(meta.tune)
    known = {"target", "backend", "geometry", "layout", "tokens", "mla", "scatter", "set", "tp",
             *SHAPE_KEYS}  # fmt: skip
    unknown = sorted(set(tune) - known)
    if unknown:
        raise TuneError(f"{path} [profile.tune]: unknown key(s) {', '.join(unknown)}")
    sets = tune.pop("set", None)
    dims = {key: tune.pop(key) for key in SHAPE_KEYS if key in tune}
    if dims:
        missing = [key for key in SHAPE_KEYS if key not in dims]
        if missing:
            recorded = ", ".join(dims)
            message = f"{path} [profile.tune]: records {recorded} but not {', '.join(missing)}"
            raise TuneError(message)
        tune["dims"] = dims
    where = f"profile {path} [profile]"
    base = str(resolve_base(meta.base, path.resolve().parent, where))
    axes = {k: v for k, v in tune.items() if v is not None}
    return replace(fallback, start=base, overrides=dict(sets or fallback.overrides), **axes)


def check(path: Path, fallback: TuneSetup, say: Say = lambda message: None) -> Outcome:
    """Re-measure the profile at ``path`` against its base; the verdict says if it still wins."""
    if not path.is_file():
        raise TuneError(f"--remeasure: no profile file at {path}")
    load_config(profile=path)  # a profile that no longer loads: ConfigError, exit 2
    setup = _recorded(path, fallback)
    if setup.repeat < MIN_REPEATS:
        raise TuneError(f"--repeat: a check needs at least {MIN_REPEATS} repeats")
    began = time.monotonic()
    result = run_bench(setup.bench(str(path.resolve()), setup.start, setup.repeat), say)
    outcome = Outcome(setup, setup.start, confirmation=result)
    outcome.verdict = verdict = judge(result, setup.screen_pct)
    outcome.seconds = time.monotonic() - began
    if verdict.wins:
        outcome.message = f"{path} still wins: at least {verdict.gain * 100:+.1f} % in each order"
    else:
        outcome.message = f"{path} no longer wins: " + "; ".join(verdict.reasons())
    return outcome
