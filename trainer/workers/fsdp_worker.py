"""``FSDPWorker``: one rank of the trainer (a Ray actor). Holds an FSDP2 shard of the actor
(and of the frozen reference policy when a KL term needs one), computes log-probs, runs the
PPO update, streams weights to the rollout servers, saves and loads checkpoints.

With LoRA (``model.lora_rank > 0``, ``trainer.workers.lora``) only the adapter trains: the
optimizer holds state for it alone, the reference policy is the actor with its adapter
switched off (no second model), checkpoints hold the adapter and its optimizer state, and the
``hf_model`` export is a PEFT adapter folder (``hf_merged``: also the merged full model).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from servers.lora import write_adapter
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
from trainer.workers.batch import TrainBatch
from trainer.workers.fsdp import apply_fsdp, full_tensors, init_distributed, load_model
from trainer.workers.lora import (
    adapter_config,
    adapter_tensors,
    is_lora,
    merged_tensors,
    trainable_parameters,
)
from trainer.workers.policy_math import log_probs_in_micro_batches, update_policy

if TYPE_CHECKING:
    from trainer.workers.weight_send import WeightSender

__all__ = ["FSDPWorker", "WorkerSpec", "adamw", "write_model_files"]

logger = logging.getLogger(__name__)

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


@dataclass(kw_only=True, slots=True)
class WorkerSpec:
    """Everything one rank needs (the worker never sees the rest of the config)."""

    model_path: str
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    need_ref: bool
    device: str
    temperature: float = 1.0
    correction: str = "none"
    """``algorithm.rollout_correction.mode``"""
    correction_clip: float = 2.0
    threads: int = 1
    cpu_cores: list[int] | None = None
    """CPU only: the trainer's cores; rank r takes ``cpu_cores[r::world]`` (all of them when
    there are fewer cores than ranks) and runs that many threads."""
    gpu_share: float = 1.0
    """GPUs per rank requested from Ray (0.5 when colocated with rollout servers)."""
    total_steps: int = 0
    """Training steps of the run (``actor.optim.lr_warmup_steps_ratio`` is a fraction of it)."""


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


class FSDPWorker:
    def __init__(self, spec: WorkerSpec, rank: int, world_size: int, master: str) -> None:
        self.spec, self.rank, self.world_size, self.master = spec, rank, world_size, master
        self.model: torch.nn.Module | None = None
        self.ref_model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.updates = 0
        self._sender: WeightSender | None = None  # keeps its shared file between pushes

    # ---- set-up ---------------------------------------------------------------------------
    def init_model(self) -> dict[str, Any]:
        spec = self.spec
        if spec.device == "cpu":
            if spec.cpu_cores:
                mine = spec.cpu_cores[self.rank :: self.world_size] or spec.cpu_cores
                os.sched_setaffinity(0, mine)
                torch.set_num_threads(len(mine))
            else:
                torch.set_num_threads(max(1, spec.threads))
        init_distributed(self.rank, self.world_size, self.master, spec.device)
        torch.manual_seed(0)
        self.model = apply_fsdp(
            load_model(spec.model_path, spec.model, spec.device),
            spec.actor.fsdp_config,
            spec.device,
        )
        optim = spec.actor.optim
        self.optimizer = adamw(self.model, optim)
        warmup = optim.lr_warmup_steps or int(optim.lr_warmup_steps_ratio * spec.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        if spec.need_ref and not is_lora(self.model):  # LoRA: the actor without its adapter
            ref = load_model(spec.model_path, spec.model, spec.device)
            ref.requires_grad_(False)
            # The actor's sharding, with the reference's own offload setting.
            fsdp = replace(spec.actor.fsdp_config, param_offload=spec.ref.param_offload)
            self.ref_model = apply_fsdp(ref, fsdp, spec.device)
        params = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in trainable_parameters(self.model))
        return {
            "rank": self.rank,
            "local_params": params,
            "trainable_params": trainable,
            "device": spec.device,
        }

    # ---- compute --------------------------------------------------------------------------
    def _log_probs(
        self,
        model: torch.nn.Module,
        batch: TrainBatch,
        micro: int,
        entropy: bool,
        max_tokens: int,
    ):
        actor = self.spec.actor
        model.eval()
        try:
            return log_probs_in_micro_batches(
                model,
                batch,
                micro_batch_size=micro,
                temperature=self.spec.temperature,
                with_entropy=entropy,
                use_dynamic_bsz=actor.use_dynamic_bsz,
                max_token_len=max_tokens,
                remove_padding=self.spec.model.use_remove_padding,
                chunk_size=actor.log_prob_chunk_size,
            )
        finally:
            model.train()

    def compute_log_prob(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Actor log-probs and entropy [batch, R] of this rank's share."""
        assert self.model is not None
        actor = self.spec.actor
        return self._log_probs(
            self.model,
            batch,
            actor.log_prob_micro_batch_size,
            entropy=True,
            max_tokens=actor.log_prob_max_token_len,
        )

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        """Reference log-probs [batch, R]: the frozen copy's, or with LoRA the actor's with its
        adapter switched off (the model it started from, as in verl)."""
        assert self.model is not None
        ref, actor = self.spec.ref, self.spec.actor
        micro = ref.log_prob_micro_batch_size_per_gpu or actor.log_prob_micro_batch_size
        tokens = ref.log_prob_max_token_len_per_gpu or actor.log_prob_max_token_len
        if is_lora(self.model):
            with self.model.disable_adapter():
                return self._log_probs(self.model, batch, micro, False, tokens)[0]
        if self.ref_model is None:
            raise RuntimeError("no reference policy: it is only built when a KL term is used")
        return self._log_probs(self.ref_model, batch, micro, entropy=False, max_tokens=tokens)[0]

    def update_actor(self, batch: TrainBatch, samples_per_mini_batch: int, seed: int) -> dict:
        assert self.model is not None and self.optimizer is not None
        self.model.train()
        metrics = update_policy(
            self.model,
            self.optimizer,
            None,  # the learning rate moves once per training step, as in verl
            batch,
            self.spec.actor,
            samples_per_mini_batch=samples_per_mini_batch,
            temperature=self.spec.temperature,
            seed=seed,
            correction=self.spec.correction,
            correction_clip=self.spec.correction_clip,
            remove_padding=self.spec.model.use_remove_padding,
        )
        self.updates += int(metrics["actor/optimizer_steps"])
        assert self.scheduler is not None
        self.scheduler.step()
        return metrics

    def update_sft(
        self,
        batch: TrainBatch,
        micro_batch_size: int,
        use_dynamic_bsz: bool,
        max_token_len: int,
        grad_clip: float,
    ) -> dict[str, float]:
        """One SFT optimizer step on this rank's share (``trainer.workers.sft_step``)."""
        from trainer.workers.sft_step import sft_update

        assert self.model is not None and self.optimizer is not None
        self.model.train()
        metrics = sft_update(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            micro_batch_size=micro_batch_size,
            use_dynamic_bsz=use_dynamic_bsz,
            max_token_len=max_token_len,
            grad_clip=grad_clip,
            remove_padding=self.spec.model.use_remove_padding,
        )
        self.updates += 1
        return metrics

    # ---- weights out ----------------------------------------------------------------------
    def push_weights(
        self, servers: list[Any], bucket_bytes: int, route: str | None = None
    ) -> dict[str, float]:
        """Send the current weights to every server in the dtype they serve in (collective:
        every rank takes part, rank 0 talks to the servers). The route (shards written into
        shared memory, Ray buckets, or vLLM's NCCL/IPC transfer) is ``weight_send``'s
        choice unless ``route`` names one. Returns tensors and bytes sent."""
        from trainer.workers.weight_send import WeightSender  # Ray, servers, vLLM: only where used

        assert self.model is not None
        if self._sender is None:
            self._sender = WeightSender(self.model)
        return self._sender.push(servers, bucket_bytes, route)

    def full_state_dict(self, skip_tied_head: bool = False) -> dict[str, torch.Tensor] | None:
        """The whole model on rank 0 (None elsewhere) under transformers' names, float32; a
        LoRA model's with the adapter merged. Collective."""
        state = dict(self._model_tensors(skip_tied_head))
        return state if self.rank == 0 else None

    def adapter_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """A LoRA actor's adapter on rank 0 (None elsewhere): its float32 tensors under PEFT's
        file names, and its ``adapter_config.json``. Collective."""
        assert self.model is not None and is_lora(self.model)
        tensors = dict(adapter_tensors(self.model))
        return (tensors, adapter_config(self.model)) if self.rank == 0 else None

    def _model_tensors(self, skip_tied_head: bool) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.model is not None
        if is_lora(self.model):
            return merged_tensors(self.model, skip_tied_head=skip_tied_head)
        return full_tensors(self.model, skip_tied_head=skip_tied_head)

    def memory_stats(self) -> dict[str, float]:
        """This rank's memory: peak RSS, and the MB of its shards of the trainable parameters,
        of their gradients during an update (one per trainable parameter) and of the
        optimizer state."""
        assert self.model is not None and self.optimizer is not None
        mb = 1 / 2**20
        trainable = sum(_nbytes(p) for p in trainable_parameters(self.model))
        optim = sum(
            _nbytes(v)
            for state in self.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        )
        return {
            "rank": float(self.rank),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "trainable_mb": trainable * mb,
            "grad_mb": trainable * mb,
            "optimizer_mb": optim * mb,
        }

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: str, contents: list[str]) -> None:
        """Sharded model/optimizer (torch.distributed.checkpoint; with LoRA the adapter and its
        optimizer state only) and, with ``hf_model``, the export under
        ``directory/huggingface`` (``export_hf``); with ``hf_merged`` and LoRA, the merged full
        model under ``directory/huggingface_merged``."""
        import torch.distributed.checkpoint as dcp

        assert self.model is not None and self.optimizer is not None
        path = Path(directory)
        model_sd, optim_sd = self._sharded_state()
        state: dict[str, Any] = {}
        if "model" in contents:
            state["model"] = model_sd
        if "optimizer" in contents:
            state["optimizer"] = optim_sd
        if state:
            dcp.save(state, checkpoint_id=str(path / "dcp"))
        if self.rank == 0 and "optimizer" in contents:
            assert self.scheduler is not None
            torch.save(
                {"scheduler": self.scheduler.state_dict(), "updates": self.updates},
                path / "optim_extra.pt",
            )
        if "hf_model" in contents:
            self.export_hf(str(path / "huggingface"))
        if "hf_merged" in contents and is_lora(self.model):
            self.export_hf(str(path / "huggingface_merged"), merged=True)
        dist.barrier()

    def _sharded_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Model and optimizer state dicts of this rank's shards (no communication); a LoRA
        model's holds its adapter alone (the frozen base is the model folder's)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        assert self.model is not None and self.optimizer is not None
        lora = is_lora(self.model)
        options = StateDictOptions(ignore_frozen_params=lora)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        if lora:  # a tied head is no parameter of its own, so frozen-param filtering keeps it
            trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
            model_sd = {k: v for k, v in model_sd.items() if k in trainable}
        return model_sd, optim_sd

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        assert self.model is not None and self.optimizer is not None
        path = Path(directory)
        model_sd, optim_sd = self._sharded_state()
        state: dict[str, Any] = {"model": model_sd}
        has_optim = (path / "optim_extra.pt").is_file()
        if has_optim:
            state["optimizer"] = optim_sd
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        lora = is_lora(self.model)
        # LoRA: the state holds the adapter alone; the frozen base stays as loaded.
        options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
        if has_optim:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
                options=options,
            )
        else:
            set_model_state_dict(self.model, state["model"], options=options)
        if has_optim:
            extra = torch.load(path / "optim_extra.pt", weights_only=True)
            assert self.scheduler is not None
            self.scheduler.load_state_dict(extra["scheduler"])
            self.updates = int(extra["updates"])
        return {"optimizer": has_optim, "updates": self.updates}

    def export_hf(self, directory: str, merged: bool = False) -> None:
        """A transformers folder: config, model.safetensors, and the source folder's other files
        with the run's tokenizer (``write_model_files``). A LoRA actor's is a PEFT adapter folder
        (adapter_model.safetensors, adapter_config.json naming the model folder as its base, the
        same other files); with ``merged`` a transformers folder of the model with the adapter
        merged in. Collective."""
        from safetensors.torch import save_file

        assert self.model is not None
        adapter = is_lora(self.model) and not merged
        if adapter:
            state = dict(adapter_tensors(self.model))
        else:  # transformers re-ties the head on load
            state = dict(self._model_tensors(skip_tied_head=True))
        if self.rank != 0:
            return
        out = Path(directory)
        if adapter:
            write_adapter(out, state, adapter_config(self.model), exist_ok=True)
        else:
            out.mkdir(parents=True, exist_ok=True)
            save_file(
                {k: v.contiguous() for k, v in state.items()},
                out / "model.safetensors",
                metadata={"format": "pt"},
            )
            base = self.model.get_base_model() if is_lora(self.model) else self.model
            base.config.save_pretrained(out)
        write_model_files(self.spec.model_path, self.spec.model, out)

    def shutdown(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if dist.is_initialized():
            dist.destroy_process_group()


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes of this rank's part of ``tensor`` (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()
