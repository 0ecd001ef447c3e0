"""kvcr-policy: the command line, one module per command.

Each command module declares its options and builds what the code that runs it takes (a typed,
frozen object where the work lives elsewhere: :class:`~kvcr_policy.plan.command.PlanCommand`,
:class:`~kvcr_policy.bench.command.BenchCommand`, :class:`~kvcr_policy.tune.command.TuneCommand`,
:class:`~kvcr_policy.backends.peer.serve.ServeSetup`); nothing below this package imports it::

    cli/
      __init__.py  the app, its root callback, main: errors shaped into one message and a code
      options.py   the options and output several commands share
      help.py      help at 80 columns (value names, never Python types), --version
      numbers.py   every number bounded on both sides, every float finite
      figure.py    --plot PATH checked before any work starts
      config.py    show, validate, profiles, schema (and the TOML writer of show)
      plugins.py   plugins
      audit.py     audit
      plan.py      plan
      bench.py     bench
      tune.py      tune
      serve.py     serve (the peer tier, kvcr_policy.backends.peer.serve)
      sglang.py    sglang-config
      replay.py    replay (kvcr_policy.replay)
      geometry.py  the geometry options of plan, bench and tune, declared once

Errors print one clear message on stderr and exit 2 (schema drift and a failed regression
screen exit 1); a traceback is a bug.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..errors import KVCRPolicyError
from . import audit, bench, config, plan, plugins, replay, serve, sglang, tune
from .help import PlainGroup, plain_help, version_callback
from .options import err

__all__ = ["app", "main"]

app = typer.Typer(
    name="kvcr-policy",
    cls=PlainGroup,
    help="Delivery and placement policies for KV-cache storage tiers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Delivery and placement policies for KV-cache storage tiers."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors exit 2 with one message on stderr."""
    try:
        # Not standalone, so our errors print our way; click then *returns* the code of a
        # typer.Exit raised by a command (validate, schema --check) instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except KVCRPolicyError as error:
        err.print(f"kvcr-policy: {error}", markup=False, highlight=False)
        sys.exit(2)
    except typer.Exit as stop:
        sys.exit(stop.exit_code)
    except typer.Abort:
        err.print("aborted", markup=False)
        sys.exit(130)
    except Exception as error:
        # click's usage errors arrive here in non-standalone mode. Recent typer vendors click
        # (typer._click), so `click.ClickException` does not match them: test the shape instead.
        exit_code = getattr(error, "exit_code", None)
        if callable(getattr(error, "show", None)) and isinstance(exit_code, int):
            error.show()  # type: ignore[attr-defined]
            sys.exit(exit_code)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


# In the order `kvcr-policy --help` lists them.
for _name, _command in (
    ("show", config.show),
    ("validate", config.validate),
    ("profiles", config.profiles),
    ("schema", config.schema),
    ("plugins", plugins.plugins),
    ("plan", plan.plan),
    ("audit", audit.audit),
    ("bench", bench.bench),
    ("tune", tune.tune),
    ("serve", serve.serve),
    ("sglang-config", sglang.sglang_config),
    ("replay", replay.replay),
):
    app.command(_name)(_command)
plain_help(app)
