"""``kvcr-policy sglang-config``: the ``--hicache-storage-backend-extra-config`` for a profile.

Without ``--check`` it prints, on one line, the JSON object that loads this backend through
SGLang's dynamic loader with the profile and overrides given, after loading them exactly as the
backend will (a typo exits 2 with one message, here instead of at SGLang's start)::

    kvcr-policy sglang-config --profile throughput --set placement.capacity_bytes=64GiB

``--check VALUE`` reads a flag value the way SGLang reads it (JSON text or ``@FILE``) and checks
it the way SGLang's loader and the backend will (:mod:`kvcr_policy.integrations.sglang.check`):
any problem exits 2 with one message; a good value prints what the backend will run with. With
``--tp`` (``--pp``) and ``--mla`` it is checked as one rank of that engine loads it. SGLang
imports nothing here: this runs on a machine without it.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..config.loading import load_config
from .help import JsonOnly
from .options import err, overrides

__all__ = ["sglang_config"]


def sglang_config(
    profile: Annotated[
        str | None,
        typer.Option("--profile", "-p", help="Bundled profile name or path for the backend."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="An override the backend applies: KEY=VALUE."),
    ] = None,
    check: Annotated[
        str | None,
        typer.Option(
            "--check",
            help="Check a flag value (JSON text or @FILE) as SGLang and the backend read it.",
        ),
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", min=1, max=4096, help="--check as a rank of this TP size.")
    ] = 1,
    pp: Annotated[
        int, typer.Option("--pp", min=1, max=4096, help="--check as a rank of this PP size.")
    ] = 1,
    mla: Annotated[bool, typer.Option("--mla", help="--check for an MLA model.")] = False,
    format: Annotated[
        JsonOnly, typer.Option("--format", "-f", help="Both the value and a check are JSON.")
    ] = JsonOnly.json,
) -> None:
    """Print the SGLang --hicache-storage-backend-extra-config for a profile, or check one."""
    from ..integrations.sglang.config import extra_config_for

    if check is not None:
        from ..integrations.sglang.check import EngineRank, check_flag

        result = check_flag(check, EngineRank(tp, pp, mla))
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        for warning in result["warnings"]:
            err.print(f"warning: {warning}", markup=False, highlight=False)
        return
    pairs = overrides(set_)
    load_config(profile, None, pairs)  # as the backend will: fail here, not at start
    sys.stdout.write(json.dumps(extra_config_for(profile, pairs)) + "\n")
