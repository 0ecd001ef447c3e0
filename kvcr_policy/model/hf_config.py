"""A model's KV-cache dimensions from its Hugging Face ``config.json`` (``--model-config PATH``).

Read the way SGLang 0.5.23 reads them (``sglang/srt/configs/model_config.py``), so the pages
measured are the pages the engine's host pool holds:

- **MLA** (DeepSeek V2 and V3, Kimi K2 and their kin: the config has ``kv_lora_rank``): one
  latent head of ``kv_lora_rank + qk_rope_head_dim`` per token and layer, the same on every
  tensor-parallel rank.
- **MHA and GQA** otherwise: ``num_key_value_heads`` KV heads (absent or null:
  ``num_attention_heads``, plain MHA) of ``head_dim`` (absent or null: ``hidden_size /
  num_attention_heads``).
- ``num_hidden_layers`` layers (DeepSeek's multi-token-prediction layers,
  ``num_nextn_predict_layers``, hold no pages of the main pool and are not counted);
  ``torch_dtype`` (``dtype`` in newer transformers) as the KV dtype, SGLang's
  ``--kv-cache-dtype auto``.
- A multimodal config keeps its language model's fields under ``text_config``.

The page size is SGLang's ``--page-size``, not the model's: it is never read here. Not
modelled: hybrid models whose layers differ (sliding-window or linear-attention layers), whose
pools SGLang sizes per layer kind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ArgumentError
from ..geometry import DTYPE_ITEMSIZE

__all__ = ["MAX_CONFIG_BYTES", "read_model_config"]

#: A config.json is a few KiB; a larger file is not one (and is not read whole).
MAX_CONFIG_BYTES = 4 << 20

_OPTION = "--model-config"


def _refuse(path: Path, what: str) -> ArgumentError:
    return ArgumentError(f"{_OPTION} {path}: {what}")


def _load(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise _refuse(path, "no such file; give the model's config.json") from None
    except IsADirectoryError:
        raise _refuse(path, "is a directory; give the config.json inside it") from None
    except OSError as err:
        raise _refuse(path, f"cannot be read ({err.strerror or err})") from err
    if len(raw) > MAX_CONFIG_BYTES:
        raise _refuse(path, f"more than {MAX_CONFIG_BYTES} bytes: not a model's config.json")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _refuse(path, f"not JSON ({err}); give the model's config.json") from None
    if not isinstance(data, dict):
        got = type(data).__name__
        raise _refuse(path, f"expected a JSON object (a model's config.json), got a {got}")
    return data


def _positive(path: Path, config: Mapping[str, Any], key: str, where: str) -> int | None:
    """``config[key]`` as a positive int; None when absent or null."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(path, f"{where}{key} = {value!r}: expected a positive integer")
    return value


def _required(path: Path, config: Mapping[str, Any], key: str, where: str, option: str) -> int:
    value = _positive(path, config, key, where)
    if value is None:
        message = f"has no {where}{key}: not a decoder's config.json? give {option} instead"
        raise _refuse(path, message)
    return value


def _dtype(path: Path, config: Mapping[str, Any], where: str) -> tuple[str, str] | None:
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is None:
            continue
        name = str(value).removeprefix("torch.")
        if name not in DTYPE_ITEMSIZE:
            known = ", ".join(DTYPE_ITEMSIZE)
            message = (
                f"{where}{key} = {value!r} is not a KV dtype this project knows ({known}); "
                "give --dtype (SGLang's --kv-cache-dtype)"
            )
            raise _refuse(path, message)
        return name, key
    return None


def _name(path: Path, config: Mapping[str, Any]) -> str:
    named = config.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named.rstrip("/").rsplit("/", 1)[-1]
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    kind = config.get("model_type")
    return kind if isinstance(kind, str) and kind else path.resolve().parent.name or path.stem


def read_model_config(path: Path) -> tuple[str, dict[str, tuple[Any, str]]]:
    """The model's name and ``{field: (value, origin)}`` for the fields its config gives:
    ``layers``, ``heads``, ``head_dim``, ``mla`` and, when it names one, ``dtype``."""
    data = _load(path)
    text = data.get("text_config")
    config: Mapping[str, Any] = data
    where = ""
    if isinstance(text, dict) and "num_hidden_layers" in text:
        config, where = text, "text_config."
    origin = f"{_OPTION} {path}"
    found: dict[str, tuple[Any, str]] = {}
    found["layers"] = (
        _required(path, config, "num_hidden_layers", where, "--layers"),
        f"{origin}: {where}num_hidden_layers",
    )
    latent = _positive(path, config, "kv_lora_rank", where)
    if latent is not None:
        rope = _positive(path, config, "qk_rope_head_dim", where) or 0
        found["mla"] = (True, f"{origin}: {where}kv_lora_rank (MLA)")
        found["heads"] = (1, f"{origin}: MLA, one latent head")
        found["head_dim"] = (
            latent + rope,
            f"{origin}: {where}kv_lora_rank {latent} + qk_rope_head_dim {rope}",
        )
    else:
        attention = _positive(path, config, "num_attention_heads", where)
        kv = _positive(path, config, "num_key_value_heads", where)
        heads = kv or attention
        if heads is None:
            message = f"has no {where}num_key_value_heads nor num_attention_heads; give --heads"
            raise _refuse(path, message)
        key = "num_key_value_heads" if kv else "num_attention_heads (no GQA)"
        found["mla"] = (False, f"{origin}: no kv_lora_rank (MHA)")
        found["heads"] = (heads, f"{origin}: {where}{key}")
        head_dim = _positive(path, config, "head_dim", where)
        if head_dim is not None:
            found["head_dim"] = (head_dim, f"{origin}: {where}head_dim")
        else:
            hidden = _required(path, config, "hidden_size", where, "--head-dim")
            if attention is None or hidden % attention:
                message = (
                    f"has no {where}head_dim, and {where}hidden_size {hidden} is not a multiple "
                    f"of num_attention_heads {attention}; give --head-dim"
                )
                raise _refuse(path, message)
            found["head_dim"] = (
                hidden // attention,
                f"{origin}: {where}hidden_size / num_attention_heads",
            )
    dtype = _dtype(path, config, where)
    if dtype is None and config is not data:
        dtype = _dtype(path, data, "")
    if dtype is not None:
        found["dtype"] = (dtype[0], f"{origin}: {dtype[1]}")
    return _name(path, data), found
