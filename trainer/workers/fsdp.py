"""Building the trainer's model and sharding it with FSDP2, in a fixed order:
load (fp32 master weights) -> activation checkpointing -> ``fully_shard`` each decoder layer
-> ``fully_shard`` the root. Model files hold no distributed code; this file holds all of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from trainer.config.actor import FSDPConfig, ModelConfig

__all__ = ["apply_fsdp", "decoder_layers", "full_tensors", "init_distributed", "load_model"]

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def init_distributed(rank: int, world_size: int, master: str, device: str) -> None:
    """Join the trainer's process group (gloo on CPU, NCCL on GPU)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(
        backend, init_method=f"tcp://{master}", rank=rank, world_size=world_size
    )


def load_model(path: str, config: ModelConfig, device: str) -> torch.nn.Module:
    """A transformers causal LM in float32 (master weights; compute dtype comes from FSDP)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=config.attn_implementation
    )
    model.config.use_cache = False
    if config.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (``model.model.layers`` in Llama/Qwen-style models)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no model.layers: FSDP2 sharding per decoder layer "
            "supports Llama/Qwen/Mistral-style causal LMs"
        )
    return list(layers)


def apply_fsdp(model: torch.nn.Module, config: FSDPConfig, device: str) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict = {"reshard_after_forward": config.reshard_after_forward}
    if device == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=_DTYPES[config.mixed_precision], reduce_dtype=torch.float32
        )
        if config.param_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_tensors(
    model: torch.nn.Module, *, skip_tied_head: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full CPU tensor) for every entry of the state dict, one at a time.

    Collective: every rank must iterate in step (each DTensor is all-gathered); only the
    values on rank 0 are meant to be used. ``skip_tied_head`` leaves out ``lm_head.weight``
    when it is the embedding (tied), so the largest matrix is not gathered twice.
    """
    tied = skip_tied_head and bool(getattr(model.config, "tie_word_embeddings", False))
    for name, value in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        yield name, value.detach().to("cpu", torch.float32)
