"""kvcr-policy-example: a third-party kvcr_policy plugin.

It registers the ``adaptive`` batching strategy (batches sized in bytes), the ``pieces``
coalescing strategy (merged runs cut into N pieces), the ``s3fifo`` eviction strategy (S3-FIFO)
and the ``dict`` tier backend (pages as bytes in a dict). kvcr_policy finds this module through
the ``kvcr_policy`` entry-point group (name ``example``) and registers it exactly like its
built-in plugins: pluggy collects the ``kvcr_*`` hook implementations below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcr_policy.plugin_api import hookimpl

from . import batching, coalescing, dict_backend, s3fifo
from .batching import AdaptiveBatching, AdaptiveOptions
from .coalescing import Pieces, PiecesOptions
from .dict_backend import DictBackend, DictOptions
from .s3fifo import S3FIFO, S3FIFOOptions

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterBackend, RegisterStrategy

__all__ = [
    "S3FIFO",
    "AdaptiveBatching",
    "AdaptiveOptions",
    "DictBackend",
    "DictOptions",
    "Pieces",
    "PiecesOptions",
    "S3FIFOOptions",
    "kvcr_register_backends",
    "kvcr_register_strategies",
]


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    batching.kvcr_register_strategies(register)
    coalescing.kvcr_register_strategies(register)
    s3fifo.kvcr_register_strategies(register)


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    dict_backend.kvcr_register_backends(register)
