"""Trajectories as JSON lines: what ``agentloop-rollout`` writes, and what a training run dumps
each step with ``trainer.rollout_data_dir`` / ``trainer.validation_data_dir`` (verl's keys).

One line per sample (a gateway session's segment is a sample): the un-padded prompt and
response ids with their text, the loss mask and the engine's log-probs, the sample record (stop
reason, turns, tool calls, session and segment) and its reward: ``score`` (the weighted sum
training uses, turn rewards added) and ``scores`` (each named reward before weighting, ``turns``
the turn rewards' sum, ``env/<name>`` an environment's own reward functions). A training dump adds
``step``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentloop import RolloutBatch
    from trainer.rewards.manager import RewardOutput

__all__ = ["GenerationDump", "add_scores", "trajectory_records"]


def trajectory_records(batch: RolloutBatch, tokenizer: Any) -> list[dict[str, Any]]:
    """Un-padded JSON-ready trajectories of a ``RolloutBatch``."""
    p = batch.prompts.shape[1]
    records = []
    for i in range(len(batch)):
        attn = batch.attention_mask[i].bool()
        prompt_ids = batch.prompts[i][attn[:p]].tolist()
        n = int(attn[p:].sum())
        response_ids = batch.responses[i, :n].tolist()
        row, record = batch.rows[i], batch.records[i]
        records.append(
            {
                "uid": batch.uid[i],
                "rollout_n": row.get("rollout_n", 0),
                "index": row.get("index"),
                "data_source": row.get("data_source"),
                "agent_name": batch.agent_name[i],
                "num_turns": batch.num_turns[i],
                "stop_reason": record.stop_reason,
                "finish_reasons": record.finish_reasons,
                "tool_calls": batch.tool_calls[i],
                "tool_errors": batch.tool_errors[i],
                "tool_error_kinds": record.tool_error_kinds,
                "calls": [dataclasses.asdict(c) for c in record.calls],
                "tool_rewards": record.tool_rewards,
                "weight": record.weight,
                "session_id": record.session_id,
                "segment": record.segment,
                "branch_reason": record.branch_reason,
                "branch_point": record.branch_point,
                "error": record.error,
                "prompt_text": tokenizer.decode(prompt_ids, skip_special_tokens=False),
                "response_text": tokenizer.decode(response_ids, skip_special_tokens=False),
                "prompt_ids": prompt_ids,
                "response_ids": response_ids,
                "response_mask": batch.response_mask[i, :n].tolist(),
                "response_log_probs": batch.rollout_log_probs[i, :n].tolist(),
            }
        )
    return records


def add_scores(
    records: list[dict[str, Any]],
    batch: RolloutBatch,
    reward: RewardOutput,
    scored: list[int] | None = None,
) -> None:
    """Set ``score`` and ``scores`` on ``records[i]`` for each ``i`` of ``scored`` (all by
    default) from ``reward``, which scored exactly those samples in that order."""
    scored = list(range(len(records))) if scored is None else scored
    turns = None if reward.turn_rewards is None else reward.turn_rewards.sum(-1).tolist()
    values = reward.scores.tolist()
    for j, i in enumerate(scored):
        record = records[i]
        record["score"] = values[j] + (turns[j] if turns else 0.0)
        record["scores"] = {name: parts[j] for name, parts in reward.components.items()}
        if turns:
            record["scores"]["turns"] = turns[j]
        env = batch.records[i].reward_parts  # an environment's own reward functions
        record["scores"].update({f"env/{k}": v for k, v in env.items()})


@dataclasses.dataclass
class GenerationDump:
    """Writes each step's scored samples to ``<rollout_dir>/<step>.jsonl`` and each
    validation's to ``<validation_dir>/<step>.jsonl`` (step 0: before training); a None
    folder writes nothing."""

    tokenizer: Any
    rollout_dir: str | None = None
    validation_dir: str | None = None

    def write(
        self, step: int, batch: RolloutBatch, reward: RewardOutput, *, validate: bool = False
    ) -> Path | None:
        """The file written (None where that kind of dump is off)."""
        folder = self.validation_dir if validate else self.rollout_dir
        if folder is None:
            return None
        records = trajectory_records(batch, self.tokenizer)
        add_scores(records, batch, reward)
        path = Path(folder) / f"{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")  # a reader never sees half a step
        with part.open("w") as f:
            for record in records:
                f.write(json.dumps({"step": step, **record}) + "\n")
        part.replace(path)
        return path
