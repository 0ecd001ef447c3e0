"""What the replay's engines share: the check that the engine is installed, a temporary
folder for the runs (a fresh one per run), and a run's figures from its records."""

from __future__ import annotations

import tempfile
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ReplayError
from .figures import summarize
from .prompts import Prompt
from .setup import ReplaySetup

__all__ = ["RunsFolder", "run_figures"]


class RunsFolder:
    """An engine's runs over ``prompts`` (a context manager): :meth:`prepare` once on entry,
    then :meth:`folder_for` a fresh folder per run; all removed on exit."""

    #: The engine's module (None: found by the subclass) and what to say when it is missing.
    module: str = ""
    missing: str = ""
    prefix: str = "kvcr-replay-"
    #: Bytes a pool of the replay's tier holds (set by :meth:`prepare`).
    capacity: int = 0
    root: Path

    def __init__(self, setup: ReplaySetup, prompts: list[Prompt]) -> None:
        self.setup, self.prompts = setup, prompts
        self._runs = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> RunsFolder:
        spec = find_spec(self.module)
        if spec is None or spec.origin is None:  # a folder of that name is no engine
            raise ReplayError(self.missing)
        self._dir = tempfile.TemporaryDirectory(prefix=self.prefix)
        try:
            self.prepare(Path(self._dir.name))
        except BaseException:
            self._dir.cleanup()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._dir is not None:
            self._dir.cleanup()

    def prepare(self, root: Path) -> None:
        """Once, before the first run (the model files, a measured rate)."""
        self.root = root

    def folder_for(self, label: str) -> Path:
        """A folder of this run's own."""
        self._runs += 1
        folder = Path(self.root) / f"{self._runs:02d}-{label}"
        folder.mkdir()
        return folder


def run_figures(
    records: list[dict[str, Any]], label: str, passes: int, **figures: Any
) -> dict[str, Any]:
    """One run's figures: the measured (last) pass, every pass, the engine's own ``figures``,
    the greedy outputs and each request's TTFT in the measured pass, in request order (the
    replay compares them request by request, :mod:`.rounds`, and reports neither)."""
    return {
        "label": label,
        "measured": summarize(records, passes - 1),
        "passes": [summarize(records, n) for n in range(passes)],
        **figures,
        "outputs": [r["output"] for r in records],
        "request_ttft_s": [r["ttft_s"] for r in records if r["pass"] == passes - 1],
    }
