"""``kvcr-policy tune``: measure this host and write the profile that is fastest on it.

- :mod:`.space`: the knobs, from the tunable declarations (:mod:`kvcr_policy.config.tunable`) of the
  schema and of the options models the starting config names, built-in or third-party;
- :mod:`.search`: optuna's TPE sampler over them within a time budget, each trial one
  comparison against the start through the bench's runner (:mod:`kvcr_policy.bench`);
- :mod:`.verdict`: no win without evidence (both orders, repeats, the screen, the spread);
- :mod:`.written`, :mod:`.host`: the profile written, with its evidence in a comment header;
- :mod:`.run`: ``tune`` and ``tune --remeasure`` as functions; :mod:`.command`: the command.

Nothing but the CLI (and the tests) imports this package.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Outcome", "TuneError", "TuneSetup", "Verdict", "check", "judge", "tune"]

#: Where each name lives: imported on first use, so that the command line reads the budget's
#: bounds (:mod:`.setup`) without importing the bench.
_HOMES = {
    "Outcome": ".run",
    "check": ".run",
    "tune": ".run",
    "TuneError": ".setup",
    "TuneSetup": ".setup",
    "Verdict": ".verdict",
    "judge": ".verdict",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(import_module(_HOMES[name], __name__), name)
