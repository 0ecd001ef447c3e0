"""Built-in fallback: 'sparse' per-page retry (upstream), or 'miss' (no retry)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..config.schema import FallbackSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy

__all__ = ["MissFallback", "SparseFallback"]


class SparseFallback:
    """Retry a failed batch page by page; only pages that really arrived count."""

    def __init__(self, section: FallbackSection, options: NoOptions) -> None:
        self.attempts = section.max_retries

    def recover(self, n_pages: int, retry_page: Callable[[int], bool]) -> np.ndarray:
        ok = np.zeros(n_pages, dtype=bool)
        for page in range(n_pages):  # per page by design: this is the slow, rare path
            for _ in range(self.attempts):
                try:
                    if retry_page(page):
                        ok[page] = True
                        break
                except Exception:  # a page that fails again is a miss, not a crash
                    continue
        return ok


class MissFallback:
    """A failed batch is a miss for all of its pages."""

    def __init__(self, section: FallbackSection, options: NoOptions) -> None:
        pass

    def recover(self, n_pages: int, retry_page: Callable[[int], bool]) -> np.ndarray:
        return np.zeros(n_pages, dtype=bool)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("fallback", "sparse", SparseFallback)
    register("fallback", "miss", MissFallback)
