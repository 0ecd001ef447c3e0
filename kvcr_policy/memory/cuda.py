"""torch with a CUDA device, or one clear error: for everything that needs a GPU.

The cuda copy engine, bench's GPU targets and ``tune``'s host header ask here, so none of them
imports a backend to learn whether a GPU is visible.
"""

from __future__ import annotations

from typing import Any

from kvcr_policy.errors import CudaUnavailableError

__all__ = ["NO_CUDA", "require_cuda"]

NO_CUDA = "no CUDA device visible"


def require_cuda() -> Any:
    """torch, once it is known to see a CUDA device; else :class:`CudaUnavailableError`."""
    try:
        import torch
    except ImportError as err:
        message = f"{NO_CUDA}: torch is not installed; install a CUDA build of torch"
        raise CudaUnavailableError(message) from err
    if not torch.cuda.is_available():
        message = (
            f"{NO_CUDA}: torch {torch.__version__} reports torch.cuda.is_available() == False "
            "(a CPU-only build, or no GPU here); use transport.name = 'cpu' on this machine"
        )
        raise CudaUnavailableError(message)
    return torch
