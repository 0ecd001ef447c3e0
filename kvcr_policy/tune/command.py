"""``kvcr-policy tune``: the command behind the CLI's options (:mod:`kvcr_policy.cli.tune`
builds a :class:`TuneCommand` and hands it here).

Inputs are checked before anything is measured (exit 2 with one message). ``tune`` exits 0
whether it wrote a winning profile or the start stands (it says why); ``tune --remeasure`` exits 1
when the profile no longer wins, saying by how much. A restore that did not verify exits 1.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from .run import Outcome, check, tune
from .search import Trial
from .setup import TuneError, TuneSetup

__all__ = ["TuneCommand", "run"]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _changes(trial: Trial | None) -> str:
    if trial is None or not trial.changed:
        return "-"
    return ", ".join(f"{path.rsplit('.', 1)[-1]}={value}" for path, value in trial.changed.items())


class _Progress:
    """A bar over the budget with trials and the best so far, on stderr for people; one
    line per trial when stderr is not a terminal (logs keep the search's evidence)."""

    def __init__(self, budget_s: float, live: bool) -> None:
        self.live = live
        self.bar: Any = None
        if live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("tune"),
                BarColumn(),
                TextColumn("{task.fields[trials]} trials · best {task.fields[best]}"),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=err,
                transient=True,
            )
            self.task = self.bar.add_task("", total=budget_s, trials=0, best="-")

    @contextmanager
    def running(self) -> Iterator[None]:
        if self.bar is None:
            yield
            return
        with self.bar:
            yield

    def say(self, message: str) -> None:
        if self.bar is not None:
            elapsed = self.bar.tasks[0].elapsed or 0.0
            self.bar.update(self.task, completed=elapsed, description=message)

    def trial(self, trial: Trial, best: Trial | None) -> None:
        score = "failed: " + trial.error if trial.error else f"{trial.speedup or 0:.3f}x"
        best_text = f"{best.speedup:.3f}x ({_changes(best)})" if best and best.speedup else "-"
        if self.bar is not None:
            self.bar.update(self.task, trials=trial.number + 1, best=best_text)
        else:
            line = f"trial {trial.number}: {score} in {trial.seconds:.1f} s ({_changes(trial)})"
            err.print(line, markup=False, highlight=False)


def _print(outcome: Outcome, format: str) -> None:
    if format == "json":
        sys.stdout.write(json.dumps(outcome.to_dict(), indent=2, default=str) + "\n")
        return
    if outcome.trials:
        table = Table(title=f"kvcr-policy tune: {len(outcome.trials)} trials against the start")
        for column in ("trial", "speedup", "ratio to limit", "seconds", "changes"):
            table.add_column(column)
        for t in outcome.trials:
            speedup = f"failed: {t.error}" if t.error else f"{t.speedup or 0:.3f}"
            ratio = f"{t.ratio_to_limit:.3f}" if t.ratio_to_limit is not None else "-"
            table.add_row(str(t.number), speedup, ratio, f"{t.seconds:.1f}", _changes(t))
        out.print(table)
    if outcome.verdict is not None:
        for o in outcome.verdict.orders:
            out.print(o.describe(), markup=False, highlight=False)
    out.print(outcome.message, markup=False, highlight=False)
    if outcome.written is not None:
        out.print(f"wrote {outcome.written}", markup=False, highlight=False)


def _command_line(setup: TuneSetup, write: Path | None, always: bool = False) -> str:
    """The command as it ran, every axis spelled out (defaults included)."""
    args = ["--profile", setup.start, "--target", setup.target]
    if setup.backend is not None:
        args += ["--backend", setup.backend]
    if setup.dims is None:
        args += ["--geometry", setup.geometry]
    else:
        for key, value in setup.dims.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
    if setup.tp is not None:
        args += ["--tp", str(setup.tp)]
    args += ["--layout", setup.layout]
    args += ["--tokens", str(setup.tokens), "--budget", f"{setup.budget_s:g}"]
    args += ["--mla"] * setup.mla + ["--scatter"] * setup.scatter
    for key, value in setup.overrides.items():
        args += ["--set", f"{key}={value}"]
    for path in setup.only:
        args += ["--only", path]
    args += ["--repeat", str(setup.repeat), "--trial-repeat", str(setup.trial_repeat)]
    args += ["--seed", str(setup.seed)] + (["--output", str(write)] if write else [])
    args += ["--output-always"] * (always and write is not None)
    return "kvcr-policy tune " + shlex.join(args)


@dataclass(frozen=True, slots=True)
class TuneCommand:
    """One ``kvcr-policy tune`` command line, as typed (:mod:`kvcr_policy.cli.tune`)."""

    #: The search: its axes, budget and repeats (``--set`` values included).
    setup: TuneSetup
    #: ``--output``: the profile written if it wins (``always_write``: even if it loses).
    write: Path | None = None
    always_write: bool = False
    #: ``--remeasure``: re-measure this written profile against its base instead.
    check_path: Path | None = None
    json: bool = False
    #: ``--prefill``: calibrate the engine's prefill rate (:mod:`.prefill`) instead.
    prefill: bool = False


def run(command: TuneCommand) -> None:
    """Check, tune (or check a written profile), print; see the module docstring."""
    setup, write, check_path = command.setup, command.write, command.check_path
    if check_path is not None and write is not None:
        raise TuneError(
            "--remeasure re-measures a written profile; it writes nothing: drop --output"
        )
    if write is not None and write.exists() and write.is_dir():
        raise TuneError(f"--output: {write} is a directory; name the profile file to write")
    if command.prefill:
        _prefill(command)
        return
    progress = _Progress(setup.budget_s, live=sys.stderr.isatty())
    line = _command_line(setup, write, command.always_write)
    with progress.running():
        if check_path is not None:
            outcome = check(check_path, setup, say=progress.say)
        else:
            outcome = tune(
                setup,
                write=write,
                always_write=command.always_write,
                command=line,
                say=progress.say,
                on_trial=progress.trial,
            )
    _print(outcome, "json" if command.json else "table")
    verdict = outcome.verdict
    if verdict is not None and not verdict.verified:
        err.print("restored bytes did not match what was stored", markup=False)
        raise typer.Exit(1)
    if check_path is not None and verdict is not None and not verdict.wins:
        raise typer.Exit(1)


def _prefill(command: TuneCommand) -> None:
    """``tune --prefill``: the calibrated profile, written with ``--output`` (else printed)."""
    from .prefill import write_prefill

    if command.check_path is not None:
        raise TuneError("--prefill calibrates; --remeasure checks a search's profile: give one")
    write = command.write
    line = f"kvcr-policy tune --prefill --profile {shlex.quote(command.setup.start)}"
    line += f" --output {shlex.quote(str(write))}" if write is not None else ""
    text = write_prefill(command.setup.start, write, line)
    if write is None:
        out.print(text, markup=False, highlight=False, end="")
    else:
        out.print(f"wrote {write}", markup=False, highlight=False)
