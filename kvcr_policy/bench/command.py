"""``kvcr-policy bench``: the command behind the CLI's options (cli.py only dispatches here).

Every input is checked before the run starts (exit 2 with one message); a restore that did
not verify, or a failed ``--screen``, exits 1 after the figures are printed.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Mapping
from enum import Enum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from ..model_shape import ShapeOptions, resolve_shape
from ..observability.exposition import MetricsServer, check_public, serve_metrics
from .headline import headline, ratio_note
from .plot import check_plot, write_plot
from .progress import progress
from .resolve import choosing, resolve
from .runner import run_plan, steps
from .setup import BenchError, BenchSetup
from .targets import TARGETS
from .tp import parse_devices

__all__ = ["run_command"]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _text(value: Any) -> Any:
    """An option's value: typer hands str enums for choices."""
    return value.value if isinstance(value, Enum) else value


def _backend(transport: str, backend: str | None) -> str | None:
    """``--transport ucx`` is ``--backend peer``; otherwise --backend or the profile's."""
    if transport != "ucx":
        return backend
    if backend not in (None, "peer"):
        message = f"--transport ucx runs the peer backend; --backend {backend} contradicts it"
        raise BenchError(message)
    return "peer"


def run_command(
    *,
    profile: str,
    vs: str,
    shape: ShapeOptions,
    layout: str,
    tokens: int,
    target: str,
    transport: str,
    backend: str | None,
    peer: str | None,
    ucx_tls: str,
    repeat: int,
    scatter: bool,
    set_: Mapping[str, str],
    screen_pct: float | None,
    plot: str | None,
    format: str,
    vs_set: Mapping[str, str] | None = None,
    metrics: str | None = None,
    metrics_hold: float | None = None,
    ranks: int = 1,
    devices: str | None = None,
    sweep: bool = False,
) -> None:
    """Check, run, print; see the module docstring."""
    if sweep:
        from .sweep_command import check_sweep

        check_sweep(shape, layout, tokens, scatter, ranks, devices, plot, metrics)
    if metrics is not None:  # a bad or public address is refused before anything starts
        from ..loading import load_config

        chosen = TARGETS.get(_text(target) or "", TARGETS["cpu"]).overrides
        loaded = load_config(profile=profile, overrides=choosing(chosen, set_))
        public = loaded.config.observability
        check_public(metrics, public.metrics_public)
    model = resolve_shape(shape, default="qwen3-32b")
    dims = {key: value for key, value in model.dims().items() if key != "mla"}
    setup = BenchSetup(
        profile,
        vs,
        model.name,
        layout,
        tokens,
        repeat,
        model.mla,
        scatter,
        dict(set_),
        target=_text(target),
        backend=_backend(_text(transport), backend),
        peer=_text(peer),
        tls=ucx_tls,
        vs_overrides=dict(vs_set or {}),
        metrics=metrics is not None,
        ranks=ranks,
        devices=parse_devices(devices, ranks),
        dims=dims,
        tp=shape.tp,
    )
    if screen_pct is not None and not 0 <= screen_pct < 100:
        raise BenchError(f"--screen: expected a percent in [0, 100), got {screen_pct}")
    if plot:
        check_plot(plot)
    if sweep:
        from .sweep_command import run_sweep_command

        run_sweep_command(setup, screen_pct, _text(format))
        return
    plan = resolve(setup)
    exposed = serve_metrics(metrics) if metrics is not None else None
    try:
        if exposed is not None:
            err.print(f"metrics: {exposed.url}", markup=False, highlight=False)
        shown, say = progress(steps(setup), err)
        with shown:
            result = run_plan(plan, say)
        _report(result, screen_pct, plot, format)
        if exposed is not None:
            hold(exposed, metrics_hold)
    finally:
        if exposed is not None:
            exposed.close()


def _report(result: Any, screen_pct: float | None, plot: str | None, format: str) -> None:
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
    if _text(format) == "json":
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        out.print(line, markup=False, highlight=False)
        if note is not None:
            out.print(note, markup=False, highlight=False)
        _print_table(data, result.baseline)
    sys.stdout.flush()  # before /metrics is held up: a reader of a pipe sees the figures now
    if not result.verified:
        err.print("restored bytes did not match what was stored", markup=False)
        raise typer.Exit(1)
    if verdict is not None and not verdict.passed:
        orders = ", ".join(verdict.failed_orders)
        err.print(f"regression screen failed in order(s) {orders}", markup=False)
        raise typer.Exit(1)


def hold(exposed: MetricsServer, seconds: float | None) -> None:
    """Keep /metrics up after the run: ``seconds``, or until SIGINT or SIGTERM (None)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        until = "until interrupted" if seconds is None else f"for {seconds:g} s"
        err.print(f"serving {exposed.url} {until}", markup=False, highlight=False)
        stop.wait(seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
