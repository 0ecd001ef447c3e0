"""Page keys of vLLM's KV blocks: one key per full block of a prompt, chained over its prefix.

Block ``i``'s key is a BLAKE2b digest of block ``i - 1``'s digest and block ``i``'s token ids
(little-endian int64), so equal keys mean equal prefixes, as vLLM's own prefix hashes do; the
chain is ours rather than vLLM's ``block_hashes`` because those depend on ``PYTHONHASHSEED``
and vLLM's hash function setting, and a tier outlives one engine process. Every key starts
with a namespace (:func:`namespace`): a digest of the model, the KV layout, the block size and,
unless the model is MLA (the same latent KV on every rank), the tensor-parallel rank, so two
engines that could not use each other's pages never share a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["block_keys", "namespace"]

_DIGEST = 16  # bytes per block digest: 128 bits


def namespace(model: str, layout: str, block_size: int, rank: int, ranks: int, mla: bool) -> str:
    """The key prefix of one engine rank's blocks (see the module docstring)."""
    shard = "mla" if mla else f"tp{rank}of{ranks}"
    text = f"{model}\0{layout}\0{block_size}\0{shard}"
    return "vllm-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest() + ":"


def block_keys(tokens: Sequence[int], block_size: int, prefix: str, blocks: int) -> list[str]:
    """Keys of the first ``blocks`` full blocks of ``tokens`` (fewer if ``tokens`` is short)."""
    blocks = min(blocks, len(tokens) // block_size)
    if blocks <= 0:
        return []
    data = np.asarray(tokens[: blocks * block_size], dtype="<i8").tobytes()
    step = block_size * 8
    keys = []
    digest = b""
    for i in range(blocks):
        digest = hashlib.blake2b(
            digest + data[i * step : (i + 1) * step], digest_size=_DIGEST
        ).digest()
        keys.append(prefix + digest.hex())
    return keys
