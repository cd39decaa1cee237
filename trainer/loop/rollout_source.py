"""Where a training step's batch comes from: the one seam between the trainer and rollout.

``RayPPOTrainer`` runs the same step whatever the source (take a scored batch, update, sync
the weights); only the source knows whether the batch was generated for this step
(``SyncRollout``: one batch per step for the step's prompts) or taken from a stream that
never waits for the trainer (``AsyncRollout``: ``async_training.enable``). Checkpoints,
validation and the close ask the source for what only it knows: the prompts still in flight,
weights the servers may not hold yet, a producer thread to stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agentloop import RolloutBatch
from trainer.rewards.manager import RewardOutput

__all__ = ["RolloutSource", "StepBatch"]


@dataclass(slots=True)
class StepBatch:
    """A step's scored rollout, ready for the update."""

    rollout: RolloutBatch
    reward: RewardOutput
    epoch: int
    """The sampler's epoch of the step's prompts (verl's ``training/epoch``)."""
    baselines: torch.Tensor | None = None
    """[batch] ReMax's greedy score of each sample's prompt (None for other estimators)."""


class RolloutSource(Protocol):
    """What the trainer needs from rollout. Every method runs on the trainer's thread."""

    total_steps: int
    """Steps the run trains (a step's prompt count decides it, so the source says)."""

    def next_batch(self, step: int, metrics: dict[str, float]) -> StepBatch:
        """Step ``step``'s scored batch; adds the rollout's and the reward's metrics."""
        ...

    def after_update(self, step: int, batch: StepBatch) -> None:
        """The update of ``batch`` is done: tell the sampler (a curriculum's update)."""
        ...

    def sync_weights(self, step: int) -> dict[str, float]:
        """Push the updated weights to the servers (when due); returns their metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The source's part of a checkpoint (the sampler's position)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (``step`` and the ``state_dict`` keys)."""
        ...

    def before_validate(self) -> dict[str, float]:
        """Make the servers hold the step's weights before validation; its metrics."""
        ...

    def close(self) -> None:
        """Stop what the source runs itself (the rollout servers are the run's parts)."""
        ...
