"""``FSDPWorker``: one rank of the trainer (a Ray actor). Holds an FSDP2 shard of the actor
(and of the frozen reference policy when a KL term needs one), computes log-probs, runs the
PPO update, streams weights to the rollout servers, saves and loads checkpoints.

With LoRA (``model.lora_rank > 0``, ``trainer.workers.lora``) only the adapter trains: the
optimizer holds state for it alone, the reference policy is the actor with its adapter
switched off (no second model), checkpoints hold the adapter and its optimizer state, and the
``hf_model`` export is a PEFT adapter folder (``hf_merged``: also the merged full model).
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
from trainer.config.critic import CriticSpec
from trainer.workers.batch import TrainBatch
from trainer.workers.critic import Critic
from trainer.workers.fsdp import apply_fsdp, free_port, init_distributed, load_model
from trainer.workers.lora import adapter_config, adapter_tensors, is_lora, trainable_parameters
from trainer.workers.model_state import (
    adamw,
    export_hf,
    load_sharded,
    model_tensors,
    save_sharded,
    state_mb,
    warmup_scheduler,
    write_model_files,
)
from trainer.workers.policy_math import OwnLogProbs, log_probs_in_micro_batches, update_policy

if TYPE_CHECKING:
    from trainer.workers.weight_send import WeightSender

__all__ = ["FSDPWorker", "WorkerSpec", "adamw", "write_model_files"]

logger = logging.getLogger(__name__)


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
    correction: CorrectionSpec = CorrectionSpec()
    """``algorithm.rollout_correction`` resolved (``Config.correction``)."""
    threads: int = 1
    cpu_cores: list[int] | None = None
    """CPU only: the trainer's cores; rank r takes ``cpu_cores[r::world]`` (all of them when
    there are fewer cores than ranks) and runs that many threads."""
    gpu_share: float = 1.0
    """GPUs per rank requested from Ray (0.5 when colocated with rollout servers)."""
    total_steps: int = 0
    """Training steps of the run (``actor.optim.lr_warmup_steps_ratio`` is a fraction of it)."""
    critic: CriticSpec | None = None
    """The value model each rank also holds a shard of (PPO with GAE); None: no critic."""


class FSDPWorker:
    def __init__(self, spec: WorkerSpec, rank: int, world_size: int, master: str) -> None:
        self.spec, self.rank, self.world_size, self.master = spec, rank, world_size, master
        self.model: torch.nn.Module | None = None
        self.ref_model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.updates = 0
        self.critic: Critic | None = None
        self._sender: WeightSender | None = None  # keeps its shared file between pushes

    # ---- set-up ---------------------------------------------------------------------------
    def node(self) -> dict[str, str]:
        """This rank's Ray node: ``node_id`` and ``ip``."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
        }

    def rendezvous(self) -> str:
        """``ip:port`` where this rank (rank 0) hosts the process group's store: its own
        node's address and a port free there, so ranks on other nodes reach it."""
        return f"{self.node()['ip']}:{free_port()}"

    def init_model(self, master: str | None = None) -> dict[str, Any]:
        """Join the process group (at ``master``, else the address given at construction)
        and build the model, optimizer and the reference and critic models."""
        if master is not None:
            self.master = master
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
        self.optimizer = adamw(self.model, spec.actor.optim)
        self.scheduler = warmup_scheduler(self.optimizer, spec.actor.optim, spec.total_steps)
        if spec.need_ref and not is_lora(self.model):  # LoRA: the actor without its adapter
            ref = load_model(spec.model_path, spec.model, spec.device)
            ref.requires_grad_(False)
            # The actor's sharding, with the reference's own offload setting.
            fsdp = replace(spec.actor.fsdp_config, param_offload=spec.ref.param_offload)
            self.ref_model = apply_fsdp(ref, fsdp, spec.device)
        if spec.critic is not None:
            self.critic = Critic(spec.critic, spec.device, spec.total_steps)
        params = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in trainable_parameters(self.model))
        return {
            "rank": self.rank,
            "local_params": params,
            "trainable_params": trainable,
            "critic_params": self.critic.local_params() if self.critic is not None else 0,
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
                shared_prefix=bool(actor.shared_prefix),
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
        return self._update(batch, samples_per_mini_batch, seed)

    def update_actor_on_policy(
        self, batch: TrainBatch, seed: int
    ) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """One optimizer step on this rank's share of a batch without old log-probs: they
        are the update's own forward's, detached; returns the metrics and those log-probs
        and entropies [share, R] (no separate pass runs)."""
        own = OwnLogProbs.zeros(len(batch), batch.response_length)
        metrics = self._update(batch, len(batch), seed, own)
        return metrics, own.log_probs, own.entropy

    def _update(
        self,
        batch: TrainBatch,
        samples_per_mini_batch: int,
        seed: int,
        own: OwnLogProbs | None = None,
    ) -> dict:
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
            remove_padding=self.spec.model.use_remove_padding,
            own=own,
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
        self, servers: list[Any], bucket_bytes: int, route: str | None = None, delta: Any = None
    ) -> dict[str, Any]:
        """Send the current weights to every server in the dtype they serve in (collective:
        every rank takes part, rank 0 talks to the servers). The route of each server (shards
        written into shared memory, Ray buckets, or vLLM's NCCL/IPC transfer) is
        ``weight_send``'s choice unless ``route`` names one. Returns tensors and bytes sent
        and each server's route. ``delta``: a ``DeltaSpec``, delta sync to the servers that
        take it (``trainer.workers.weight_delta``)."""
        from trainer.workers.weight_send import WeightSender  # Ray, servers, vLLM: only where used

        assert self.model is not None
        if self._sender is None:
            self._sender = WeightSender(self.model)
        return self._sender.push(servers, bucket_bytes, route, delta)

    def full_state_dict(
        self, skip_tied_head: bool = False, critic: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """The whole model on rank 0 (None elsewhere) under transformers' names, float32; a
        LoRA model's with the adapter merged; ``critic``: the value model's. Collective."""
        if critic:
            state = dict(model_tensors(self._critic().model, skip_tied_head))
        else:
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
        return model_tensors(self.model, skip_tied_head)

    def memory_stats(self) -> dict[str, float]:
        """This rank's memory: peak RSS, and the MB of its shards of the trainable parameters,
        of their gradients during an update (one per trainable parameter) and of the
        optimizer state; with a critic, its trainable and optimizer MB as well."""
        assert self.model is not None and self.optimizer is not None
        trainable, optim = state_mb(self.model, self.optimizer)
        out = {
            "rank": float(self.rank),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "trainable_mb": trainable,
            "grad_mb": trainable,
            "optimizer_mb": optim,
        }
        if self.critic is not None:
            trainable, optim = state_mb(self.critic.model, self.critic.optimizer)
            out |= {"critic_trainable_mb": trainable, "critic_optimizer_mb": optim}
        return out

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: str, contents: list[str]) -> None:
        """Sharded model/optimizer (torch.distributed.checkpoint; with LoRA the adapter and its
        optimizer state only) and, with ``hf_model``, the export under
        ``directory/huggingface`` (``export_hf``); with ``hf_merged`` and LoRA, the merged full
        model under ``directory/huggingface_merged``."""
        assert self.model is not None and self.optimizer is not None
        assert self.scheduler is not None
        path = Path(directory)
        save_sharded(path, self.model, self.optimizer, self.scheduler, self.updates, contents)
        if "hf_model" in contents:
            self.export_hf(str(path / "huggingface"))
        if "hf_merged" in contents and is_lora(self.model):
            self.export_hf(str(path / "huggingface_merged"), merged=True)
        dist.barrier()

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None
        assert self.scheduler is not None
        updates = load_sharded(Path(directory), self.model, self.optimizer, self.scheduler)
        if updates is not None:
            self.updates = updates
        return {"optimizer": updates is not None, "updates": self.updates}

    def export_hf(self, directory: str, merged: bool = False) -> None:
        """``model_state.export_hf`` of the actor: a transformers folder (LoRA: a PEFT adapter
        folder, or with ``merged`` the model with the adapter merged in). Collective."""
        assert self.model is not None
        export_hf(self.model, self.spec.model_path, self.spec.model, directory, merged)

    # ---- critic (``trainer.workers.critic``) --------------------------------------------------
    def _critic(self) -> Critic:
        if self.critic is None:
            raise RuntimeError("no critic on this rank: it is built when critic.enable is on")
        return self.critic

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """The critic's values [batch, R] of this rank's share."""
        return self._critic().compute_values(batch)

    def update_critic(self, batch: TrainBatch, samples_per_mini_batch: int, seed: int) -> dict:
        return self._critic().update(batch, samples_per_mini_batch, seed)

    def save_critic(self, directory: str, contents: list[str]) -> None:
        self._critic().save(directory, contents)
        dist.barrier()

    def load_critic(self, directory: str) -> dict[str, Any]:
        return self._critic().load(directory)

    def shutdown(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if dist.is_initialized():
            dist.destroy_process_group()
