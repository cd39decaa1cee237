"""LoRA adapters served by a vLLM server: the rank a server is started with, the check of a
PEFT adapter folder, and the folder each adapter version a server is sent is written into.

vLLM loads an adapter from a folder in PEFT's layout (``adapter_config.json`` +
``adapter_model.safetensors``) when it is added, and loads it again from there whenever it has
dropped it from its cache while requests still ask for it. So a server writes each version it is
sent into a folder of its own in shared memory, and keeps the folder of the version before the
current one (requests started on it may still run) until the next version replaces it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "VLLM_MAX_LORA_RANKS",
    "adapter_rank",
    "check_adapter_rank",
    "check_lora",
    "json_safe",
    "max_lora_rank",
    "write_adapter",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_WEIGHT_FILES = (ADAPTER_WEIGHTS, "adapter_model.bin")  # the files vLLM reads, in its order

VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (``vllm.config.lora.MaxLoRARanks``)."""


def max_lora_rank(rank: int) -> int:
    """The engine's ``max_lora_rank`` for a server started with ``lora_rank=rank``: the
    smallest value vLLM accepts that is at least ``rank`` (0: LoRA off)."""
    if rank <= 0:
        return 0
    return next(allowed for allowed in VLLM_MAX_LORA_RANKS if allowed >= rank)


def adapter_rank(config: Mapping[str, Any]) -> int:
    """The largest rank in a PEFT adapter config: ``r``, or a larger one in ``rank_pattern``."""
    return max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])


def check_lora(
    rank: int,
    adapter_path: str | None,
    *,
    rank_key: str = "lora_rank",
    path_key: str = "lora_adapter_path",
) -> None:
    """``ValueError`` for a LoRA rank vLLM cannot serve, or a starting adapter folder it cannot
    load, naming ``rank_key`` / ``path_key`` (callers with their own config keys pass them)."""
    largest = VLLM_MAX_LORA_RANKS[-1]
    if not 0 <= rank <= largest:
        raise ValueError(
            f"{rank_key} must be in [0, {largest}] (0: LoRA off; {largest} is vLLM's largest "
            f"max_lora_rank), got {rank}"
        )
    if adapter_path is None:
        return
    if rank == 0:
        raise ValueError(
            f"{path_key} is set but {rank_key}=0 (LoRA off): set {rank_key} to the adapter's rank"
        )
    folder = Path(adapter_path)
    if not folder.is_dir():
        raise ValueError(
            f"{path_key}={adapter_path!r} is not a folder: give a PEFT adapter folder "
            f"({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}, as PEFT's save_pretrained writes it)"
        )
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ValueError(
            f"{path_key}={adapter_path!r} has no {ADAPTER_CONFIG}: give a folder written by "
            "PEFT's save_pretrained"
        )
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        raise ValueError(
            f"{path_key}={adapter_path!r} has no {ADAPTER_WEIGHTS}: give a folder written by "
            "PEFT's save_pretrained"
        )
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        found = adapter_rank(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path_key}={adapter_path!r}: {ADAPTER_CONFIG} is not a LoRA adapter config with a "
            f"rank r ({type(exc).__name__}: {exc})"
        ) from None
    if found > max_lora_rank(rank):
        raise ValueError(
            f"{path_key}={adapter_path!r} holds a rank-{found} adapter, above {rank_key}={rank}: "
            f"set {rank_key} to {found} or more"
        )


def check_adapter_rank(config: Mapping[str, Any], lora_rank: int) -> None:
    """``ValueError`` unless a server started with ``lora_rank`` can load an adapter with this
    PEFT ``config``."""
    if lora_rank == 0:
        raise ValueError(
            "this server was started with lora_rank=0 and loads no LoRA adapters: start it with "
            "lora_rank set to the adapter's rank, or send the merged weights"
        )
    if "r" not in config:
        raise ValueError("adapter config has no rank r: send the config PEFT writes for it")
    rank = adapter_rank(config)
    if rank > max_lora_rank(lora_rank):
        raise ValueError(
            f"adapter rank {rank} is above the largest this server loads "
            f"({max_lora_rank(lora_rank)}, from lora_rank={lora_rank}): start it with "
            f"lora_rank={rank} or more"
        )


def write_adapter(
    folder: Path,
    tensors: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    *,
    exist_ok: bool = False,
) -> None:
    """Write an adapter into ``folder`` as PEFT's ``save_pretrained`` does: the tensors (names as
    in PEFT's saved file, ``base_model.model.<module>.lora_A.weight``) and the config
    (``json_safe``). ``folder`` must be new unless ``exist_ok`` (then it and its parents are
    made as needed, and other files in it are left alone). Nothing is left behind on an error.
    The trainer's ``hf_model`` export and each adapter version a server is sent use it."""
    made = not folder.exists()
    folder.mkdir(parents=exist_ok, exist_ok=exist_ok)
    written = [folder / ADAPTER_WEIGHTS, folder / ADAPTER_CONFIG]
    try:
        flat = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        save_file(flat, str(written[0]), metadata={"format": "pt"})
        written[1].write_text(json.dumps(json_safe(config), indent=2) + "\n")
    except BaseException:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for path in written:
                path.unlink(missing_ok=True)
        raise


def json_safe(value: Any) -> Any:
    """An adapter config as JSON data, as PEFT writes it: enums as their values, sets as sorted
    lists, tuples as lists, keys as strings. Anything else is left for ``json`` to take or
    refuse (``TypeError``)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(json_safe(v) for v in value)
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
