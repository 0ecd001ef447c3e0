"""``kvcr-policy bench``: one runner over three axes, one result type.

- target (:mod:`.targets`): where the engine's pool lives, ``cpu`` or ``cuda``;
- backend (:mod:`.backends`): where the tier lives, ``dram`` or ``peer`` (a
  ``kvcr-policy serve`` process, :mod:`.server`); a new backend adds one small class;
- comparison (:mod:`.sides`, :mod:`.hicache`): P against profile Q, or against a peer
  implementation (``hicache-file``).

:func:`run_bench` (:mod:`.runner`) checks a :class:`BenchSetup` into a plan (:mod:`.resolve`,
:mod:`.plan`), runs the one loop and returns a :class:`BenchResult` (:mod:`.result`), whose
``to_dict()`` is the JSON of ``kvcr-policy bench --format json``; :mod:`.command` is the command
itself, :mod:`.plot` its PNG. Nothing outside this package (and the tests) imports it:
benchmark-only support code such as the torchvision stand-in (:mod:`.torchvision_stub`) stays
off the runtime import path.
"""

from __future__ import annotations

from .result import BenchResult, Run, Screen
from .runner import run_bench
from .setup import BenchError, BenchSetup

__all__ = ["BenchError", "BenchResult", "BenchSetup", "Run", "Screen", "run_bench"]
