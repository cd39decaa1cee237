"""A trained model's state on one rank, for the actor and the critic alike: its optimizer and
learning-rate schedule, sharded checkpoints (torch.distributed.checkpoint; with LoRA the
adapter and its optimizer state only), and the transformers (or PEFT adapter) export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from servers.lora import write_adapter
from trainer.config.actor import ModelConfig, OptimConfig
from trainer.workers.dist import this_rank
from trainer.workers.fsdp import full_tensors
from trainer.workers.lora import (
    adapter_config,
    adapter_tensors,
    is_lora,
    merged_tensors,
    trainable_parameters,
)

__all__ = [
    "adamw",
    "export_hf",
    "load_sharded",
    "model_tensors",
    "save_sharded",
    "sharded_state",
    "state_mb",
    "warmup_scheduler",
    "write_model_files",
]

_NOT_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
}


def write_model_files(model_path: str, model: ModelConfig, out: Path) -> None:
    """An exported folder's files besides its weights and ``config.json``: the source model
    folder's other files (generation config, remote code, tokenizer), and, when the run's
    tokenizer came from ``tokenizer_path`` or had ``custom_chat_template``, that tokenizer
    saved in place of the folder's, so the export renders chats as training did."""
    from agentloop.tokenizer import TokenizerSource

    source = Path(model_path)
    tokenizer_dir = model.tokenizer_path or model_path
    own_tokenizer = Path(tokenizer_dir) != source
    for item in source.iterdir():
        if (
            item.is_file()
            and not item.name.endswith(_NOT_WEIGHTS)
            and item.name not in ("config.json", "model.safetensors.index.json")
            and not (own_tokenizer and item.name in _TOKENIZER_FILES)
        ):
            shutil.copy2(item, out / item.name)
    if own_tokenizer or model.custom_chat_template is not None:
        tokenizer = TokenizerSource(
            path=tokenizer_dir,
            trust_remote_code=model.trust_remote_code,
            chat_template=model.custom_chat_template,
        )
        tokenizer.load().save_pretrained(out)
    (out / "agentloop_export.json").write_text(
        json.dumps({"source": str(source), "tokenizer": tokenizer_dir})
    )


def adamw(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """The actor's optimizer as ``actor.optim`` describes it, over the trainable parameters
    (a LoRA model's adapter)."""
    return torch.optim.AdamW(
        trainable_parameters(model),
        lr=optim.lr,
        betas=(optim.betas[0], optim.betas[1]),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
    )


def warmup_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``optim.lr_warmup_steps`` (or that fraction of ``total_steps``),
    then constant; it moves once per training step, as in verl."""
    warmup = optim.lr_warmup_steps or int(optim.lr_warmup_steps_ratio * total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    )


def model_tensors(model: torch.nn.Module, skip_tied_head: bool):
    """(name, full float32 tensor) of the whole model, a LoRA model's with its adapter merged.
    Collective."""
    if is_lora(model):
        return merged_tensors(model, skip_tied_head=skip_tied_head)
    return full_tensors(model, skip_tied_head=skip_tied_head)


def sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state dicts of this rank's shards (no communication); a LoRA
    model's holds its trainable part alone (the frozen base is the model folder's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    lora = is_lora(model)
    options = StateDictOptions(ignore_frozen_params=lora)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    if lora:  # a tied head is no parameter of its own, so frozen-param filtering keeps it
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return model_sd, optim_sd


def save_sharded(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    updates: int,
    contents: list[str],
) -> None:
    """``model``/``optimizer`` of ``contents`` under ``path/dcp``, the schedule and update count
    in ``path/optim_extra.pt`` (with the optimizer). Collective."""
    import torch.distributed.checkpoint as dcp

    model_sd, optim_sd = sharded_state(model, optimizer)
    state: dict[str, Any] = {}
    if "model" in contents:
        state["model"] = model_sd
    if "optimizer" in contents:
        state["optimizer"] = optim_sd
    if state:
        dcp.save(state, checkpoint_id=str(path / "dcp"))
    rank = this_rank()
    if rank == 0 and "optimizer" in contents:
        torch.save(
            {"scheduler": scheduler.state_dict(), "updates": updates}, path / "optim_extra.pt"
        )


def load_sharded(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int | None:
    """Load what ``save_sharded`` wrote into the model (and, when saved, the optimizer and
    schedule). Returns the saved update count, or None when no optimizer state was saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_state_dict,
    )

    model_sd, optim_sd = sharded_state(model, optimizer)
    state: dict[str, Any] = {"model": model_sd}
    has_optim = (path / "optim_extra.pt").is_file()
    if has_optim:
        state["optimizer"] = optim_sd
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    lora = is_lora(model)
    # LoRA: the state holds the adapter alone; the frozen base stays as loaded.
    options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
    if not has_optim:
        set_model_state_dict(model, state["model"], options=options)
        return None
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=options,
    )
    extra = torch.load(path / "optim_extra.pt", weights_only=True)
    scheduler.load_state_dict(extra["scheduler"])
    return int(extra["updates"])


def export_hf(
    model: torch.nn.Module,
    model_path: str,
    model_config: ModelConfig,
    directory: str,
    merged: bool = False,
) -> None:
    """A transformers folder: config, model.safetensors, and the source folder's other files
    with the run's tokenizer (``write_model_files``). A LoRA model's is a PEFT adapter folder
    (adapter_model.safetensors, adapter_config.json naming the model folder as its base, the
    same other files); with ``merged`` a transformers folder of the model with the adapter
    merged in. Collective: rank 0 writes."""
    from safetensors.torch import save_file

    adapter = is_lora(model) and not merged
    if adapter:
        state = dict(adapter_tensors(model))
    else:  # transformers re-ties the head on load
        state = dict(model_tensors(model, skip_tied_head=True))
    if this_rank() != 0:
        return
    out = Path(directory)
    if adapter:
        write_adapter(out, state, adapter_config(model), exist_ok=True)
    else:
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            out / "model.safetensors",
            metadata={"format": "pt"},
        )
        base = model.get_base_model() if is_lora(model) else model
        base.config.save_pretrained(out)
    write_model_files(model_path, model_config, out)


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes of this rank's part of ``tensor`` (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def state_mb(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[float, float]:
    """MB of this rank's shards of ``model``'s trainable parameters (as many again for their
    gradients during an update) and of ``optimizer``'s state."""
    mb = 1 / 2**20
    trainable = sum(_nbytes(p) for p in trainable_parameters(model))
    optim = sum(
        _nbytes(v)
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    return trainable * mb, optim * mb
