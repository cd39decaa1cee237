"""LoRA on the FSDP2 actor (``actor_rollout_ref.model.lora_rank > 0``): only a PEFT adapter
trains; the transformers model under it stays frozen.

``apply_lora`` wraps the loaded causal LM in a ``peft.PeftModel`` (a new adapter, or the one at
``lora_adapter_path``) before sharding; FSDP2 then shards each decoder layer, frozen base
weights and trainable adapter in one unit, and the root. Around it:

- the optimizer sees only ``trainable_parameters`` (optimizer state for the adapter alone);
- the reference policy is the same model with the adapter switched off
  (``model.disable_adapter()``), as in verl: no second copy of the weights;
- checkpoints hold the adapter and its optimizer state (``FSDPWorker.save_checkpoint``).

Weights leave the shards in two forms, both collective (every rank iterates in step, each
DTensor is all-gathered; only rank 0's values are meant to be used):

- ``adapter_tensors``: the adapter under the names of PEFT's ``adapter_model.safetensors``
  (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), which vLLM loads; with
  ``adapter_config`` it is an adapter folder. Weight sync to servers that load adapters.
- ``merged_tensors``: the whole model under transformers' own names with every adapted weight
  merged, ``W + scaling * B @ A`` in float32, one entry at a time. Weight sync to servers that
  cannot load adapters, and the merged export.

``peft`` is imported only where LoRA is on (it takes seconds to import).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch

from servers.lora import json_safe
from trainer.config.actor import ModelConfig
from trainer.workers.gather import gather_tensor, gather_tensors

__all__ = [
    "ADAPTER",
    "adapter_config",
    "adapter_tensors",
    "apply_lora",
    "is_lora",
    "merged_tensors",
    "trainable_parameters",
]

ADAPTER = "default"
"""PEFT's name of the one adapter trained here."""


def apply_lora(
    model: torch.nn.Module, config: ModelConfig, task_type: str = "CAUSAL_LM"
) -> torch.nn.Module:
    """``model`` (a transformers causal LM) with a LoRA adapter: ``config.lora_adapter_path``'s,
    trainable, or a new one (``lora_rank``, ``lora_alpha``, ``target_modules``,
    ``exclude_modules``, no dropout; B starts at zero, so the model's outputs do not change).
    The base weights are frozen and the adapter is float32. ``model`` unchanged when
    ``config.lora_rank`` is 0. Call it before the model is sharded. ``task_type``
    ``TOKEN_CLS``: a critic, whose value head trains whole beside the adapter."""
    if config.lora_rank == 0:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    if config.lora_adapter_path is not None:
        wrapped = PeftModel.from_pretrained(
            model, config.lora_adapter_path, adapter_name=ADAPTER, is_trainable=True
        )
    else:
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            target_modules=_plain(config.target_modules),
            exclude_modules=_excluded(config.exclude_modules, task_type == "TOKEN_CLS"),
            lora_dropout=0.0,
            bias="none",
            task_type=task_type,
        )
        wrapped = get_peft_model(model, lora, adapter_name=ADAPTER)
    _check_supported(wrapped, config, value_head=task_type == "TOKEN_CLS")
    for param in trainable_parameters(wrapped):
        param.data = param.data.float()  # float32 master weights, whatever the base's dtype
    return wrapped


def _excluded(modules: str | list[str] | None, value_head: bool) -> Any:
    """PEFT's ``exclude_modules``; a value model's head (``score``), which trains whole, is
    never adapted as well (``all-linear`` would pick it)."""
    plain = _plain(modules)
    if not value_head:
        return plain
    if plain is None:
        return ["score"]
    if isinstance(plain, str):  # one regex
        return f"(?:{plain})|(?:.*\\bscore)"
    return [*plain, "score"]


def is_lora(model: torch.nn.Module) -> bool:
    """``model`` is a PEFT model (``apply_lora``'s), sharded or not."""
    peft = sys.modules.get("peft")  # not imported: no model can be one
    return peft is not None and isinstance(model, peft.PeftModel)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer updates: the adapter of a LoRA model, every parameter otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_config(model: torch.nn.Module) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` as PEFT's ``save_pretrained`` writes it (sets as
    sorted lists, enums as their values, ``inference_mode`` true), JSON-safe;
    ``base_model_name_or_path`` is the folder the model was loaded from."""
    config = model.peft_config[ADAPTER]
    out = json_safe(config.to_dict())
    out["inference_mode"] = True
    out["base_model_name_or_path"] = getattr(
        model.get_base_model(), "name_or_path", out.get("base_model_name_or_path")
    )
    return out


def adapter_tensors(
    model: torch.nn.Module, *, dtype: torch.dtype = torch.float32, device: str | None = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every adapter weight, named as in PEFT's
    ``adapter_model.safetensors`` (``peft.get_peft_model_state_dict``). Cast to ``dtype``
    before the all-gather; ``device`` as in ``trainer.workers.fsdp.full_tensors``.

    Collective: every rank must iterate in step."""
    from peft import get_peft_model_state_dict

    # The sharded state dict (DTensors, no communication), renamed and filtered by PEFT.
    named = get_peft_model_state_dict(
        model, state_dict=model.state_dict(), adapter_name=ADAPTER, save_embedding_layers=False
    )
    # One collective for the whole adapter, not one per tensor (hundreds of small ones).
    gathered = gather_tensors(list(named.values()), dtype=dtype, device=device)
    yield from zip(named, gathered, strict=True)


def merged_tensors(
    model: torch.nn.Module,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | None = "cpu",
    skip_tied_head: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every entry of the un-wrapped transformers model's state dict
    (``model.layers.0.self_attn.q_proj.weight``: no ``base_model.model.``, ``base_layer`` or
    adapter entries), with each adapted weight merged: ``W + scaling * B @ A``, computed in
    float32 on the trainer's device, then cast to ``dtype``. One entry at a time: never a
    copy of the whole model. ``skip_tied_head``: without ``lm_head.weight`` when it is the
    embedding. ``device`` as in ``trainer.workers.fsdp.full_tensors``.

    Collective: every rank must iterate in step."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    tied = skip_tied_head and bool(getattr(base.config, "tie_word_embeddings", False))
    for key, value in base.state_dict().items():
        if tied and key == "lm_head.weight":
            continue
        owner = _lora_owner(key, layers)
        if owner is None:
            yield key, gather_tensor(value, dtype=dtype, device=device)
            continue
        rest = key[len(owner) + 1 :]
        if not rest.startswith("base_layer."):
            continue  # the adapter's own entries: merged below
        name = f"{owner}.{rest[len('base_layer.') :]}"
        if rest != "base_layer.weight":  # a bias: not adapted
            yield name, gather_tensor(value, dtype=dtype, device=device)
            continue
        layer = layers[owner]
        weight = gather_tensor(value, dtype=torch.float32, device=None)  # [out, in]
        a = gather_tensor(layer.lora_A[ADAPTER].weight, dtype=torch.float32, device=None)
        b = gather_tensor(layer.lora_B[ADAPTER].weight, dtype=torch.float32, device=None)
        delta = (b @ a) * layer.scaling[ADAPTER]  # [out, r] @ [r, in]
        merged = (weight + (delta.T if layer.fan_in_fan_out else delta)).to(dtype)
        yield name, merged if device is None else merged.to(device)


# ---- helpers ------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A Hydra/OmegaConf list as a plain list (PEFT checks ``isinstance(..., list)``)."""
    return list(value) if value is not None and not isinstance(value, str) else value


def _lora_owner(key: str, layers: dict[str, torch.nn.Module]) -> str | None:
    """The LoRA layer a state-dict key lies under (``a.b.q_proj`` for
    ``a.b.q_proj.base_layer.weight``), or None."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in layers:
            return prefix
    return None


def _check_supported(model: torch.nn.Module, config: ModelConfig, value_head: bool) -> None:
    """Plain LoRA on linear layers only: what ``merged_tensors`` merges and vLLM serves (a
    critic's value head, which PEFT trains whole, aside)."""
    from peft.tuners.lora import Linear, LoraLayer

    source = (
        f"the adapter at {config.PREFIX}.lora_adapter_path={config.lora_adapter_path}"
        if config.lora_adapter_path
        else f"{config.PREFIX}.target_modules={config.target_modules}"
    )
    lora = model.peft_config[ADAPTER]
    if lora.use_dora or lora.bias != "none" or (lora.modules_to_save and not value_head):
        raise ValueError(
            f"{source}: only plain LoRA adapters train here (no DoRA, no trained biases, no "
            "modules_to_save)"
        )
    base = model.get_base_model()
    head = base.get_output_embeddings()
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, Linear):
            raise ValueError(
                f"{source} puts LoRA on {name} ({type(module.base_layer).__name__}): only "
                "linear layers can be adapted here"
            )
        if tied and module is head:
            raise ValueError(
                f"{source} puts LoRA on the LM head {name}, which is tied to the input "
                "embedding: leave it out (all-linear already does)"
            )
