"""``WorkerGroup``: the driver's handle on the trainer ranks. Starts one ``FSDPWorker`` Ray
actor per rank, splits each batch into equal contiguous shares (rank order), and joins the
results back in order. A batch that does not split evenly (a gateway session's segments add
samples) is filled up with filler rows that train nothing (``pad_for_ranks``): every rank
runs the same forwards and optimizer steps, whatever the sample count. With ``balance``
(``trainer.balance_batch``) the rows of each mini-batch are spread so that the ranks get
similar token counts (``trainer.workers.balance``); results come back in the batch's order."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from trainer.workers.balance import RankLayout, rank_layout
from trainer.workers.batch import TrainBatch
from trainer.workers.fsdp_worker import FSDPWorker, WorkerSpec
from trainer.workers.placement import place_ranks

__all__ = ["TrainerWorkerDiedError", "WorkerGroup"]

logger = logging.getLogger(__name__)


class TrainerWorkerDiedError(RuntimeError):
    """A trainer rank's process died (OOM kill, node loss, segfault); the run cannot go on.
    ``node``: the rank's Ray node (``node_id``, ``ip``) when known."""

    def __init__(
        self, rank: int, method: str, cause: BaseException, node: dict[str, str] | None = None
    ) -> None:
        lines = str(cause).strip().splitlines()
        self.rank, self.method, self.node = rank, method, node
        where = ""
        if node is not None:
            where = f" on node {node['node_id']} ({node['ip']}"
            where += ", which left the cluster)" if _node_gone(node["node_id"]) else ")"
        super().__init__(
            f"trainer rank {rank}{where} died during {method} "
            f"({type(cause).__name__}: {lines[0] if lines else 'no detail'})"
        )


def _node_gone(node_id: str) -> bool:
    """Ray no longer lists ``node_id`` as alive (the node was lost, not only the process)."""
    import ray

    try:
        return not any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
    except Exception:  # noqa: BLE001 - a message detail, never a second failure
        return False


class WorkerGroup:
    def __init__(
        self,
        spec: WorkerSpec,
        world_size: int,
        balance: bool = False,
        *,
        nnodes: int = 1,
        node_resource: str | None = None,
    ) -> None:
        """``balance``: lay each batch out so that the ranks get similar token counts
        (``trainer.balance_batch``; ``trainer.workers.balance``). ``nnodes`` and
        ``node_resource``: where the ranks run (``trainer.workers.placement``)."""
        import ray

        self.world_size = world_size
        self.balance = balance
        self.shared = spec.model.use_remove_padding and bool(spec.actor.shared_prefix)
        """Families of rows that share a prefix stay together when balancing."""
        self.broken = False
        """A rank died: the others may be stuck in a collective, so only kill them."""
        self.placement = place_ranks(world_size, nnodes, spec.device, spec.gpu_share, node_resource)
        actor = ray.remote(FSDPWorker)
        self.workers = [
            actor.options(**self.placement.options[rank]).remote(spec, rank, world_size, None)
            for rank in range(world_size)
        ]
        self.nodes: list[dict[str, str]] = ray.get([w.node.remote() for w in self.workers])
        """Each rank's Ray node (``node_id``, ``ip``), in rank order."""
        # Rank 0 hosts the process group's store, on its own node's address.
        master = ray.get(self.workers[0].rendezvous.remote())
        info = ray.get([w.init_model.remote(master) for w in self.workers])
        logger.info(
            "%d FSDP2 rank(s) on %s, %d parameters per rank, %d trainable",
            world_size,
            spec.device,
            info[0]["local_params"],
            info[0]["trainable_params"],
        )

    def _each(self, method: Callable[..., Any], *args: Any) -> list[Any]:
        """``method`` (an ``FSDPWorker`` method, named by reference so that a rename or a
        typo fails where it is written) on every rank with the same ``args``."""
        name = method.__name__
        return self._gather(name, [getattr(w, name).remote(*args) for w in self.workers])

    def _scatter(self, method: Callable[..., Any], batch: TrainBatch, *args: Any) -> list[Any]:
        """``method`` on every rank with its share of ``batch`` (rank order) and ``args``."""
        name = method.__name__
        shares = batch.chunk(self.world_size)
        refs = [
            getattr(w, name).remote(s, *args) for w, s in zip(self.workers, shares, strict=True)
        ]
        return self._gather(name, refs)

    def _gather(self, method: str, refs: list[Any]) -> list[Any]:
        """Every rank's result; a rank that died raises ``TrainerWorkerDiedError`` at once
        (the other ranks would wait for it in a collective until the process-group timeout).
        A rank that fails because its peer died (gloo: connection closed) is reported as the
        death of that peer."""
        import ray

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as exc:
                    died = self._dead_rank(method, refs, exc, self.nodes)
                    if died is None:
                        raise
                    self.broken = True
                    raise died from died.__cause__
        return ray.get(refs)

    @staticmethod
    def _dead_rank(
        method: str,
        refs: list[Any],
        exc: BaseException,
        nodes: list[dict[str, str]] | None = None,
        wait_s: float = 10.0,
    ) -> TrainerWorkerDiedError | None:
        """The first rank whose actor died (``exc``'s or another's, waiting up to ``wait_s``
        for Ray to notice), or None when every rank is alive."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        def death(error: BaseException) -> bool:
            # A task error wrapping an actor error means the rank is alive: something it
            # called (a rollout server) died.
            return isinstance(error, RayActorError) and not isinstance(error, RayTaskError)

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0 if death(exc) else wait_s)
        for rank, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except Exception as error:  # noqa: BLE001 - only deaths are picked out
                if death(error):
                    node = nodes[rank] if nodes else None
                    died = TrainerWorkerDiedError(rank, method, error, node)
                    died.__cause__ = error
                    return died
        return None

    def _layout(self, batch: TrainBatch, mini_batches: int = 1) -> RankLayout:
        return rank_layout(batch, self.world_size, mini_batches, self.balance, self.shared)

    def compute_log_prob(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self._layout(batch)
        parts = self._scatter(FSDPWorker.compute_log_prob, layout.padded)
        order = layout.order
        return torch.cat([p[0] for p in parts])[order], torch.cat([p[1] for p in parts])[order]

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        layout = self._layout(batch)
        parts = self._scatter(FSDPWorker.compute_ref_log_prob, layout.padded)
        return torch.cat(parts)[layout.order]

    def update_actor_on_policy(
        self, batch: TrainBatch, seed: int = 0
    ) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """One optimizer step on a batch without old log-probs: each rank's update takes them
        from its own forward (``FSDPWorker.update_actor_on_policy``). Returns the metrics
        (``update_actor``'s) and those log-probs and entropies [batch, R] in batch order."""
        layout = self._layout(batch)
        parts = self._scatter(FSDPWorker.update_actor_on_policy, layout.padded, seed)
        metrics = parts[0][0] | self._layout_metrics(layout, batch)
        order = layout.order
        return (
            metrics,
            torch.cat([p[1] for p in parts])[order],
            torch.cat([p[2] for p in parts])[order],
        )

    def update_actor(
        self,
        batch: TrainBatch,
        samples_per_mini_batch: int | None = None,
        seed: int = 0,
        *,
        mini_batches: int | None = None,
    ) -> dict:
        """PPO epochs over ``mini_batches`` equal mini-batches of ``batch`` (one optimizer
        step each), or over mini-batches of ``samples_per_mini_batch`` samples (global; the
        last may be short); each rank takes its share of every mini-batch. Logs
        ``actor/filler_samples``: the filler rows that made the shares equal; with
        ``balance``, ``balance/imbalance_{before,after}``."""
        if (mini_batches is None) == (samples_per_mini_batch is None):
            raise ValueError("update_actor takes one of samples_per_mini_batch and mini_batches")
        if mini_batches is None:
            assert samples_per_mini_batch is not None
            mini_batches = -(-len(batch) // samples_per_mini_batch)
        layout = self._layout(batch, mini_batches)
        metrics = self._scatter(FSDPWorker.update_actor, layout.padded, layout.per_mini, seed)[0]
        return metrics | self._layout_metrics(layout, batch)

    def _layout_metrics(self, layout: RankLayout, batch: TrainBatch) -> dict[str, float]:
        """``actor/filler_samples`` and, with ``balance``, ``balance/imbalance_*``."""
        metrics = {"actor/filler_samples": float(len(layout.padded) - len(batch))}
        return metrics | layout.metrics() if self.balance else metrics

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """The critic's values [batch, R] (0 where ``response_mask`` is 0)."""
        layout = self._layout(batch)
        return torch.cat(self._scatter(FSDPWorker.compute_values, layout.padded))[layout.order]

    def update_critic(self, batch: TrainBatch, mini_batches: int, seed: int = 0) -> dict:
        """The critic's epochs over ``mini_batches`` equal mini-batches of ``batch`` (which
        carries ``values`` and ``returns``), each rank its share of every one."""
        layout = self._layout(batch, mini_batches)
        return self._scatter(FSDPWorker.update_critic, layout.padded, layout.per_mini, seed)[0]

    def save_critic(self, directory: str, contents: list[str]) -> None:
        self._each(FSDPWorker.save_critic, directory, contents)

    def load_critic(self, directory: str) -> dict[str, Any]:
        return self._each(FSDPWorker.load_critic, directory)[0]

    def update_sft(
        self,
        batch: TrainBatch,
        micro_batch_size: int,
        use_dynamic_bsz: bool,
        max_token_len: int,
        grad_clip: float,
    ) -> dict[str, float]:
        """One SFT optimizer step on the global ``batch`` (split evenly over the ranks)."""
        args = (micro_batch_size, use_dynamic_bsz, max_token_len, grad_clip)
        return self._scatter(FSDPWorker.update_sft, batch, *args)[0]

    def push_weights(
        self, servers: list[Any], bucket_bytes: int, route: str | None = None, delta: Any = None
    ) -> dict[str, Any]:
        """The current weights to ``servers`` (``FSDPWorker.push_weights``): tensors, bytes
        and each server's route; ``delta``: a ``DeltaSpec`` (delta sync)."""
        return self._each(FSDPWorker.push_weights, servers, bucket_bytes, route, delta)[0]

    def full_state_dict(self, critic: bool = False) -> dict[str, torch.Tensor]:
        """The whole model under transformers' names (a LoRA actor's merged), float32;
        ``critic``: the value model's."""
        return self._each(FSDPWorker.full_state_dict, False, critic)[0]

    def adapter_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A LoRA actor's adapter tensors (PEFT's file names, float32) and adapter config."""
        return self._each(FSDPWorker.adapter_state)[0]

    def memory_stats(self) -> list[dict[str, float]]:
        """Each rank's ``FSDPWorker.memory_stats``, in rank order."""
        return self._each(FSDPWorker.memory_stats)

    def save_checkpoint(self, directory: str, contents: list[str]) -> None:
        self._each(FSDPWorker.save_checkpoint, directory, contents)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        return self._each(FSDPWorker.load_checkpoint, directory)[0]

    def export_hf(self, directory: str, merged: bool = False) -> None:
        """``FSDPWorker.export_hf``: a transformers folder (LoRA: an adapter folder, or with
        ``merged`` the merged full model)."""
        self._each(FSDPWorker.export_hf, directory, merged)

    def shutdown(self) -> None:
        import ray

        try:
            if not self.broken:
                refs = [w.shutdown.remote() for w in self.workers]
                ray.wait(refs, num_returns=len(refs), timeout=30)
        finally:
            for w in self.workers:
                ray.kill(w)
            self.placement.release()
