"""The sync rollout source: each step draws its prompts, generates their groups on the
servers, scores them, and pushes the updated weights before the next step generates.

ReMax (``algorithm.adv_estimator=remax``) also rolls out one greedy response per prompt,
whose score is the baseline of the prompt's samples.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import torch

from agentloop import RolloutBatch, TraceContext
from trainer.config.schema import Config
from trainer.data.sampler import PromptSampler
from trainer.loop.assembly import RunParts
from trainer.loop.rollout_source import StepBatch

__all__ = ["SyncRollout"]


class SyncRollout:
    """A batch per step for the step's prompts (``RolloutSource``)."""

    def __init__(self, config: Config, parts: RunParts, sampler: PromptSampler) -> None:
        self.config, self.sampler = config, sampler
        self.manager, self.rewards, self.sync = parts.manager, parts.rewards, parts.sync
        self.total_steps = config.trainer.total_steps(len(sampler))

    def next_batch(self, step: int, metrics: dict[str, float]) -> StepBatch:
        """Generate and score the step's groups (and ReMax's greedy ones)."""
        rows = self.sampler.next_batch()
        epoch = self.sampler.epoch
        remax = self.config.algorithm.adv_estimator == "remax"
        if remax:  # the greedy rollout's groups must be the sampled rollout's
            rows = [{**row, "uid": row.get("uid") or uuid.uuid4().hex} for row in rows]
        # timing_s/gen inside its metrics
        rollout = self.manager.generate_sequences(rows, trace=TraceContext(step=step))
        metrics |= rollout.metrics
        metrics["timing_s/tools"] = rollout.metrics.get("agent_loop/tool_s/mean", 0.0)
        greedy = self._greedy_rollout(step, rows, metrics) if remax else None
        self.sync.release_servers()
        start = time.perf_counter()
        reward = self.rewards.score(rollout)
        metrics["timing_s/reward"] = time.perf_counter() - start
        metrics |= reward.metrics
        baselines = None if greedy is None else self._greedy_baselines(greedy, rollout, metrics)
        return StepBatch(rollout, reward, epoch, baselines)

    def _greedy_rollout(
        self, step: int, rows: list[dict[str, Any]], metrics: dict[str, float]
    ) -> RolloutBatch:
        """ReMax's baseline rollout: one greedy response per prompt (``timing_s/gen_max``)."""
        rollout = self.config.actor_rollout_ref.rollout
        greedy = {**rollout.sampling_params(), "temperature": 0.0, "top_p": 1.0, "top_k": -1}
        start = time.perf_counter()
        batch = self.manager.generate_sequences(
            rows, n=1, sampling_params=greedy, trace=TraceContext(step=step)
        )
        metrics["timing_s/gen_max"] = time.perf_counter() - start
        return batch

    def _greedy_baselines(
        self, greedy: RolloutBatch, rollout: RolloutBatch, metrics: dict[str, float]
    ) -> torch.Tensor:
        """[batch] each sample's prompt's greedy score (a session's last segment's)."""
        scored = self.rewards.score(greedy)
        by_uid = dict(zip(greedy.uid, scored.scores.tolist(), strict=True))  # last one wins
        metrics["remax/baseline_mean"] = sum(by_uid.values()) / max(len(by_uid), 1)
        return torch.tensor([by_uid[uid] for uid in rollout.uid], dtype=torch.float32)

    def after_update(self, step: int, batch: StepBatch) -> None:
        self.sampler.after_step(step, batch.rollout, batch.reward.scores)

    def sync_weights(self, step: int) -> dict[str, float]:
        """Every step: the next step generates with the weights it trains."""
        return self.sync.push()

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def before_validate(self) -> dict[str, float]:
        """Nothing to do: the servers got the last update's weights with it."""
        return {}

    def close(self) -> None:
        """Nothing of its own to stop."""
