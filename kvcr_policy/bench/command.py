"""``kvcr-policy bench``: the command behind the CLI's options (:mod:`kvcr_policy.cli.bench`
builds a :class:`BenchCommand` and hands it here).

Every input is checked before the run starts (exit 2 with one message); a restore that did
not verify, or a failed ``--screen``, exits 1 after the figures are printed.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from ..model.shape import ShapeOptions, resolve_shape
from ..observability.exposition import MetricsServer, check_public, serve_metrics
from .headline import headline, ratio_note
from .plot import write_plot
from .progress import progress
from .resolve import choosing, resolve
from .runner import run_plan, steps
from .setup import BenchError, BenchSetup
from .targets import TARGETS
from .tp import parse_devices

__all__ = ["BenchCommand", "run"]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _backend(transport: str, backend: str | None) -> str | None:
    """``--transport ucx`` is ``--backend peer``; otherwise --backend or the profile's."""
    if transport != "ucx":
        return backend
    if backend not in (None, "peer"):
        message = f"--transport ucx runs the peer backend; --backend {backend} contradicts it"
        raise BenchError(message)
    return "peer"


@dataclass(frozen=True, slots=True)
class BenchCommand:
    """One ``kvcr-policy bench`` command line, as typed (:mod:`kvcr_policy.cli.bench`)."""

    #: P (a profile) against Q (``vs``), or against a peer implementation (``peer``).
    profile: str = "throughput"
    vs: str = "default"
    peer: str | None = None
    #: ``--set`` (both sides) and ``--vs-set`` (Q only, after ``--set``).
    overrides: Mapping[str, str] = field(default_factory=dict)
    vs_overrides: Mapping[str, str] = field(default_factory=dict)
    #: The pool: the model's page shape, the layout and size, where it lives, the store order.
    shape: ShapeOptions = field(default_factory=ShapeOptions)
    layout: str = "layer_first"
    tokens: int = 8192
    scatter: bool = False
    target: str = "cpu"
    #: The tier: ``--transport`` (``local`` or ``ucx``), ``--backend`` and the peer's UCX
    #: transports.
    transport: str = "local"
    backend: str | None = None
    ucx_tls: str = "auto"
    repeat: int = 5
    ranks: int = 1
    devices: str | None = None
    #: The regression screen in percent, a PNG (its path checked by the command line), JSON.
    screen_pct: float | None = None
    plot: str | None = None
    json: bool = False
    #: ``--metrics HOST:PORT`` and how long /metrics stays up after the run.
    metrics: str | None = None
    metrics_hold: float | None = None
    #: Every page shape of the target's matrix, one table (:mod:`.sweep_command`).
    sweep: bool = False

    def setup(self) -> BenchSetup:
        """The run's axes and sizes (checked by :func:`~.resolve.resolve`)."""
        model = resolve_shape(self.shape, default="qwen3-32b")
        return BenchSetup(
            self.profile,
            self.vs,
            model.name,
            self.layout,
            self.tokens,
            self.repeat,
            model.mla,
            self.scatter,
            dict(self.overrides),
            target=self.target,
            backend=_backend(self.transport, self.backend),
            peer=self.peer,
            tls=self.ucx_tls,
            vs_overrides=dict(self.vs_overrides),
            metrics=self.metrics is not None,
            ranks=self.ranks,
            devices=parse_devices(self.devices, self.ranks),
            dims={key: value for key, value in model.dims().items() if key != "mla"},
            tp=self.shape.tp,
        )


def run(command: BenchCommand) -> None:
    """Check, run, print; see the module docstring."""
    metrics = command.metrics
    if command.sweep:
        from .sweep_command import check_sweep

        check_sweep(command.shape, command.layout, command.tokens, command.scatter,
                    command.ranks, command.devices, command.plot, metrics)  # fmt: skip
    if metrics is not None:  # a bad or public address is refused before anything starts
        from ..config.loading import load_config

        chosen = TARGETS.get(command.target, TARGETS["cpu"]).overrides
        loaded = load_config(profile=command.profile, overrides=choosing(chosen, command.overrides))
        public = loaded.config.observability
        check_public(metrics, public.metrics_public)
    setup = command.setup()
    screen_pct = command.screen_pct
    if screen_pct is not None and not 0 <= screen_pct < 100:
        raise BenchError(f"--screen: expected a percent in [0, 100), got {screen_pct}")
    if command.sweep:
        from .sweep_command import run_sweep_command

        run_sweep_command(setup, screen_pct, "json" if command.json else "table")
        return
    plan = resolve(setup)
    exposed = serve_metrics(metrics) if metrics is not None else None
    try:
        if exposed is not None:
            err.print(f"metrics: {exposed.url}", markup=False, highlight=False)
        shown, say = progress(steps(setup), err)
        with shown:
            result = run_plan(plan, say)
        if exposed is None:
            _report(result, screen_pct, command.plot, command.json)
        else:
            # The signals are caught before the figures are printed: a reader that stops the
            # hold as soon as it has them must not kill the process mid-hand-over.
            with stopping() as stop:
                _report(result, screen_pct, command.plot, command.json)
                hold(exposed, command.metrics_hold, stop)
    finally:
        if exposed is not None:
            exposed.close()


def _report(result: Any, screen_pct: float | None, plot: str | None, json_format: bool) -> None:
    """Print the figures, then exit 1 if a restore did not verify or the screen failed."""
    line = headline(result.to_dict(), result.baseline)
    data = {"verdict": line, **result.to_dict()}
    note = ratio_note(data)
    if note is not None:
        data["ratio_note"] = note
    verdict = result.screen(screen_pct) if screen_pct is not None else None
    if verdict is not None:
        data["screen"] = verdict.to_dict()
    if plot:
        write_plot(data, plot)
    if json_format:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        out.print(line, markup=False, highlight=False)
        if note is not None:
            out.print(note, markup=False, highlight=False)
        _print_table(data, result.baseline)
        for said in _outcome_lines(verdict, plot):
            out.print(said, markup=False, highlight=False)
    sys.stdout.flush()  # before /metrics is held up: a reader of a pipe sees the figures now
    if not result.verified:
        err.print("restored bytes did not match what was stored", markup=False)
        raise typer.Exit(1)
    if verdict is not None and not verdict.passed:
        orders = ", ".join(verdict.failed_orders)
        err.print(f"regression screen failed in order(s) {orders}", markup=False)
        raise typer.Exit(1)


def _outcome_lines(verdict: Any, plot: str | None) -> list[str]:
    """What the text output says of ``--screen`` (passed or not) and ``--plot`` (where)."""
    lines = []
    if verdict is not None:
        lines.append(
            f"screen {verdict.percent:g} %: passed (P's median within {verdict.percent:g} % of "
            "the baseline's in both orders)"
            if verdict.passed
            else f"screen {verdict.percent:g} %: FAILED in order(s) "
            + ", ".join(verdict.failed_orders)
        )
    if plot:
        lines.append(f"plot: wrote {plot}")
    return lines


@contextmanager
def stopping() -> Iterator[threading.Event]:
    """An event SIGINT or SIGTERM sets while the block runs (their handlers restored after)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def hold(exposed: MetricsServer, seconds: float | None, stop: threading.Event) -> None:
    """Keep /metrics up after the run: ``seconds`` (None: no end), or until ``stop`` is set."""
    until = "until interrupted" if seconds is None else f"for {seconds:g} s"
    err.print(f"serving {exposed.url} {until}", markup=False, highlight=False)
    stop.wait(seconds)


def _print_table(data: Mapping[str, Any], baseline: str) -> None:
    names = {label: p.get("name") or label for label, p in data.get("profiles", {}).items()}
    compared = f"P = {names.get('P', 'P')}, {baseline} = {names.get(baseline, baseline)}"
    table = Table(title=f"kvcr-policy bench: {compared}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in data.items():
        if isinstance(value, (dict, list)) or key in ("verdict", "ratio_note"):
            continue
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    out.print(table)
