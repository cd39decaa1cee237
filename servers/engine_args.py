"""Extra engine constructor arguments (``ServerConfig.engine_kwargs``), checked before an engine
starts.

They go to the engine as they are (vLLM's ``AsyncEngineArgs``, ``sglang.Engine``), except the
arguments the server builds itself from its own config: one of those in ``engine_kwargs`` would
silently fight the setting that owns it, so it is refused with the name of that setting. A name
the engine does not take is refused too, with the closest names it does take: vLLM would
otherwise fail deep inside the engine's start (``TypeError: unexpected keyword argument``).

Callers with their own config keys (the trainer's rollout section) pass ``key``,
the prefix their users write, and ``owners``, their key for each ``ServerConfig`` field.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

__all__ = ["OWN_ARGS", "check_engine_kwargs", "check_known_args", "refuse_own_args"]

_FIXED = ""
"""An argument the server sets with no setting of its own to change it."""

OWN_ARGS: dict[str, dict[str, str]] = {
    "vllm": {
        "model": "model",
        "tokenizer": "tokenizer",
        "trust_remote_code": "trust_remote_code",
        "served_model_name": "served_model_name",
        "dtype": "dtype",
        "tensor_parallel_size": "tensor_parallel_size",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "max_model_len": "max_model_len",
        "enforce_eager": "enforce_eager",
        "enable_prefix_caching": "enable_prefix_caching",
        "logprobs_mode": "logprobs_mode",
        "scheduling_policy": "scheduling_policy",
        "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "seed": "seed",
        "weight_transfer_config": "weight_transfer",
        "enable_lora": "lora_rank",
        "max_lora_rank": "lora_rank",
        "max_loras": "max_loras",
        "enable_sleep_mode": _FIXED,  # on with a GPU: colocated servers sleep during updates
        "worker_extension_cls": _FIXED,  # the workers' weight loader
        "disable_log_stats": _FIXED,
    },
    "sglang": {
        "model_path": "model",
        "trust_remote_code": "trust_remote_code",
        "dtype": "dtype",
        "tp_size": "tensor_parallel_size",
        "mem_fraction_static": "gpu_memory_utilization",
        "context_length": "max_model_len",
        "disable_cuda_graph": "enforce_eager",
        "disable_radix_cache": "enable_prefix_caching",
        "random_seed": "seed",
        "skip_tokenizer_init": _FIXED,  # the server takes and returns token ids
        "enable_memory_saver": _FIXED,  # sleep / wake_up release the GPU memory
    },
}
"""Per backend: each engine argument the server sets -> the ``ServerConfig`` field it comes
from (``""``: the server fixes it)."""

_ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def _owner(backend: str, name: str, owners: Mapping[str, str] | None) -> str:
    """The setting that sets own argument ``name`` (``""``: none; the server fixes it)."""
    field = OWN_ARGS[backend][name]
    return field if owners is None or not field else owners.get(field, _FIXED)


def refuse_own_args(
    backend: str,
    kwargs: Mapping[str, Any],
    *,
    key: str = "engine_kwargs",
    owners: Mapping[str, str] | None = None,
) -> None:
    """``ValueError`` for the first argument in ``kwargs`` that the server sets itself, naming
    the setting to change instead (``owners`` maps a ``ServerConfig`` field to the caller's key
    for it; a field missing there is fixed for the caller's users)."""
    for name in kwargs:
        if name not in OWN_ARGS[backend]:
            continue
        setting = _owner(backend, name, owners)
        if setting:
            raise ValueError(
                f"{key}.{name}: the server sets this engine argument from {setting}; set "
                f"{setting} instead"
            )
        raise ValueError(
            f"{key}.{name}: the server sets this engine argument itself and it cannot be "
            "changed; remove it"
        )


def _engine_arg_names(backend: str) -> set[str] | None:
    """The keyword arguments the backend's engine takes; None when it is not installed here."""
    try:
        if backend == "vllm":
            from vllm.engine.arg_utils import AsyncEngineArgs as args_cls
        else:
            from sglang.srt.server_args import ServerArgs as args_cls
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(args_cls) if f.init}


def check_known_args(
    backend: str,
    kwargs: Mapping[str, Any],
    *,
    key: str = "engine_kwargs",
    owners: Mapping[str, str] | None = None,
) -> None:
    """``ValueError`` for the first name in ``kwargs`` that the backend's engine does not take,
    with the closest name it does take (imports the engine; skipped where the engine is not
    installed, as on a driver without SGLang: the server checks again when it starts)."""
    if not kwargs:
        return
    known = _engine_arg_names(backend)
    if known is None:
        return
    for name in kwargs:
        if name in known:
            continue
        hint = ""
        for close in difflib.get_close_matches(name, sorted(known), n=1):
            hint = f" (did you mean {close}?)"
            if close in OWN_ARGS[backend]:
                setting = _owner(backend, close, owners)
                how = f"set {setting} for it" if setting else "the server sets it itself"
                hint = f" (did you mean {close}? {how})"
        raise ValueError(
            f"{key}.{name} is not an engine argument of {_ENGINE_NAMES[backend]}{hint}: fix the "
            "name or remove it"
        )


def check_engine_kwargs(
    backend: str,
    kwargs: Mapping[str, Any],
    *,
    key: str = "engine_kwargs",
    owners: Mapping[str, str] | None = None,
) -> None:
    """``refuse_own_args``, then ``check_known_args``."""
    refuse_own_args(backend, kwargs, key=key, owners=owners)
    check_known_args(backend, kwargs, key=key, owners=owners)
