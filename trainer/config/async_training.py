"""``async_training`` (verl's key names) and the off-policy keys of ``algorithm``:
``rollout_correction`` (``trainer.config.rollout_correction``) and ``filter_groups``.
``Config.check_async`` holds the cross-key checks."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config.rollout_correction import CORRECTION_MODES, RolloutCorrectionConfig

__all__ = [
    "CORRECTION_MODES",
    "AsyncTrainingConfig",
    "FilterGroupsConfig",
    "RolloutCorrectionConfig",
]


@dataclass(kw_only=True, slots=True)
class AsyncTrainingConfig:
    enable: bool = False
    """True: rollout is a stream that never waits for the trainer (``trainer.loop.async_rollout``);
    False: each step rolls out, then trains, in turn."""
    staleness_threshold: int = 1
    """How many policy versions a sample may lag the policy it is trained on (0: on-policy;
    equals the sync trainer). A group is admitted only if it can be trained within it."""
    partial_rollout: bool | str = True
    """What a weight update does to the turns running: True aborts them and continues them
    from their sampled tokens under the new weights (their context prefilled again); False
    lets them finish on the weights they started with first; ``inflight`` (vLLM, host weight
    route) keeps them running in their engines, which load the new weights between two decode
    steps: no abort, no re-prefill, each token stamped with the version that sampled it."""
    recompute_kv_cache_after_weight_updates: bool = False
    """``partial_rollout=inflight``: the kept turns' context is prefilled again on the new
    weights (preempted in the engine, not aborted); False: their KV cache stays as the old
    weights computed it (NeMo-RL's key)."""
    trigger_parameter_sync_step: int = 1
    """Trainer steps between weight pushes to the servers."""
    require_batches: int | None = None
    """Mini-batches (of ``actor.ppo_mini_batch_size`` prompts) one async step trains on;
    null: ``data.train_batch_size`` prompts."""
    use_rollout_log_probs: bool = False
    """Use the engine's log-probs as the old policy's (skips the trainer's recompute)."""
    score_concurrency: int = 8
    """Finished groups scored at once, each on its own thread beside the rollout (a slow
    judge or sandbox delays only its group)."""
    wait_log_s: float = 60.0
    """A step that waits this long for its groups logs what it waits for (groups scored, in
    flight and due, their versions, the admission room), and again every as long."""

    def __post_init__(self) -> None:
        if isinstance(self.partial_rollout, str) and self.partial_rollout != "inflight":
            raise ValueError(
                f"async_training.partial_rollout={self.partial_rollout!r} is not supported; use "
                "true (abort and continue), false (let running turns finish) or inflight"
            )
        if self.recompute_kv_cache_after_weight_updates and self.partial_rollout != "inflight":
            raise ValueError(
                "async_training.recompute_kv_cache_after_weight_updates=True acts on the turns "
                "an in-flight update keeps running: set async_training.partial_rollout=inflight"
            )
        if self.staleness_threshold < 0:
            raise ValueError(
                "async_training.staleness_threshold must be >= 0 (0: on-policy, 1: a sample "
                "may come from the weights one update behind)"
            )
        if self.trigger_parameter_sync_step < 1:
            raise ValueError("async_training.trigger_parameter_sync_step must be >= 1")
        if self.score_concurrency < 1:
            raise ValueError("async_training.score_concurrency must be >= 1")
        if self.wait_log_s <= 0:
            raise ValueError("async_training.wait_log_s must be > 0 (seconds)")
        if self.require_batches is not None and self.require_batches < 1:
            raise ValueError("async_training.require_batches must be >= 1 (or null)")
        if self.staleness_threshold < self.trigger_parameter_sync_step - 1:
            raise ValueError(
                f"async_training.trigger_parameter_sync_step={self.trigger_parameter_sync_step} "
                f"leaves the servers up to {self.trigger_parameter_sync_step - 1} update(s) "
                f"behind, more than staleness_threshold={self.staleness_threshold} allows: "
                f"raise staleness_threshold to >= {self.trigger_parameter_sync_step - 1} or "
                "lower trigger_parameter_sync_step"
            )


@dataclass(kw_only=True, slots=True)
class FilterGroupsConfig:
    enable: bool = False
    """Drop GRPO groups whose samples all scored the same (no advantage, no gradient) and
    roll out more prompts in their place (DAPO's dynamic sampling)."""
    max_num_gen_batches: int = 0
    """Stop with an error after this many batches' worth of prompts per step (0: no limit)."""

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 0:
            raise ValueError("algorithm.filter_groups.max_num_gen_batches must be >= 0")
