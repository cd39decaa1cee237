"""Validation (``trainer.test_freq``): the same in sync and async runs, on whatever weights
the servers hold (the rollout source pushes the step's weights first where they may lag).

Each validation prompt gets ``rollout.val_kwargs.n`` responses sampled with ``val_kwargs``
(greedy by default); the metrics count one value per session, its last segment, which holds
the final answer.
"""

from __future__ import annotations

import time
from typing import Any

from agentloop import AgentLoopManager, TraceContext
from trainer.loop.trajectories import GenerationDump
from trainer.metrics.trace_tags import TraceTagger
from trainer.metrics.validation import validation_metrics
from trainer.rewards.manager import RewardManager

__all__ = ["validate"]


def validate(
    manager: AgentLoopManager,
    rewards: RewardManager,
    tagger: TraceTagger | None,
    rows: list[dict[str, Any]],
    *,
    n: int,
    step: int,
    dump: GenerationDump | None = None,
) -> dict[str, float]:
    """Mean reward overall and per data_source (``val/*``), and verl's ``val-core`` /
    ``val-aux`` metrics; ``tagger`` (or None) tags the traces with their rewards, ``dump``
    (or None) writes the scored samples (``trainer.validation_data_dir``)."""
    start = time.perf_counter()
    batch = manager.generate_sequences(rows, n=n, trace=TraceContext(step=step, validate=True))
    reward = rewards.score(batch)
    if tagger is not None:
        tagger.submit(batch.records, reward.scores.tolist(), reward.components)
    if dump is not None:
        dump.write(step, batch, reward, validate=True)
    # One value per session: a session's last segment (it holds the final answer).
    last = [i for i in range(len(batch)) if i + 1 == len(batch) or batch.segment[i + 1] == 0]
    scores = reward.scores[last]
    num_turns = [batch.num_turns[i] for i in last]
    tool_calls = [batch.tool_calls[i] for i in last]
    extra_info = {k: [v[i] for i in last] for k, v in reward.extra_info.items()}
    out = {
        "val/reward/mean": float(scores.mean()),
        "val/num_turns/mean": float(sum(num_turns) / len(last)),
        "val/tool_calls/mean": float(sum(tool_calls) / len(last)),
    }
    sources = [str(batch.rows[i].get("data_source", "unknown")) for i in last]
    by_source: dict[str, list[float]] = {}
    for source, score in zip(sources, scores.tolist(), strict=True):
        by_source.setdefault(source, []).append(score)
    for source, values in by_source.items():
        out[f"val/{source}/reward/mean"] = sum(values) / len(values)
    uid = [batch.uid[i] for i in last]
    out |= validation_metrics(sources, uid, scores.tolist(), extra_info, num_turns)
    out["timing_s/validate"] = time.perf_counter() - start
    return out
