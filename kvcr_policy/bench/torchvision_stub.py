"""Import SGLang's host pools on a CPU-only machine, where torchvision cannot be installed.

``sglang.srt.mem_cache.pool_host`` imports model configs that import torchvision at module level
(``sglang/srt/configs/deepseek_ocr.py``: ``from torchvision.transforms import InterpolationMode``),
and PyPI's torchvision wheel needs a CUDA torch ("operator torchvision::nms does not exist").
Nothing on the storage path uses torchvision, so an empty stand-in package satisfies those
imports. transformers must not see it: it probes torchvision with ``find_spec`` and, when found,
imports parts of it for real; its probe is cached, so it is asked first, before the stub exists.

Used by the HiCacheFile comparison (:mod:`.hicache`) and the SGLang tests; never by the backend
itself, which imports no host pool (importing ``kvcr_policy.integrations.sglang`` never loads
this module: ``tests/bench/test_bench_import_path.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types

__all__ = ["stub_torchvision"]

log = logging.getLogger("kvcr_policy.bench")


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchvision`` and every submodule as an empty package."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def stub_torchvision() -> bool:
    """Install the stand-in unless torchvision is installed; True if it was installed now."""
    if any(isinstance(finder, _TorchvisionStub) for finder in sys.meta_path):
        return False
    if importlib.util.find_spec("torchvision") is not None:
        return False
    try:  # cache transformers' "torchvision is absent" before the stub can answer its probe
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
    except ImportError:
        pass
    sys.meta_path.insert(0, _TorchvisionStub())
    log.info("torchvision is not installed: an empty stand-in satisfies SGLang's imports")
    return True
