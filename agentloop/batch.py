"""Padding agent-loop outputs into a training batch, and the rollout metrics.

Prompts are left-padded to ``prompt_length`` and responses right-padded to
``response_length``, so ``input_ids = [prompt | response]`` has the response at a fixed
offset (the layout verl trainers expect).

One output is one session (one sample of one prompt); a session whose later calls did not
extend its earlier tokens (a gateway agent that edited its history) returns further training
samples in ``AgentLoopOutput.segments``. ``collate`` gives every segment its own row, right
after the session's first, with the session's dataset row (same ``uid``, same
``rollout_n``): a batch has at least one row per session, and the rows of a session carry
its ``record.weight`` (1/k each by default) so that together they weigh one session.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from agentloop.base import AgentLoopOutput
from agentloop.records import SampleRecord, ToolCallRecord
from agentloop.workspace.loop_hook import workspace_metrics

__all__ = ["RolloutBatch", "collate", "rollout_metrics", "session_samples", "tool_metrics"]


@dataclass(slots=True)
class RolloutBatch:
    prompts: torch.Tensor
    """[batch, prompt_length] left-padded prompt ids."""
    responses: torch.Tensor
    """[batch, response_length] right-padded response ids (model and tool tokens)."""
    input_ids: torch.Tensor
    """[batch, prompt_length + response_length]"""
    attention_mask: torch.Tensor
    """[batch, prompt_length + response_length] 1 on real tokens."""
    position_ids: torch.Tensor
    """[batch, prompt_length + response_length] 0.. over real tokens (0 on left padding)."""
    response_mask: torch.Tensor
    """[batch, response_length] 1 where the model sampled the token (the loss mask)."""
    rollout_log_probs: torch.Tensor
    """[batch, response_length] float32 engine log-probs, 0 where response_mask is 0."""
    rollout_versions: torch.Tensor
    """[batch, response_length] int64 policy version that sampled each token, -1 where
    response_mask is 0 (async training: a resumed turn spans versions)."""
    uid: list[str]
    """Group id: samples of the same prompt share it (GRPO groups)."""
    rows: list[dict[str, Any]]
    """The dataset row of each sample (data_source, reward_model, extra_info, ...)."""
    agent_name: list[str]
    num_turns: list[int]
    reward_score: list[float | None]
    records: list[SampleRecord]
    """Each sample's record (stop reason, turns, tool calls, tool rewards, trace id, weight)."""
    segment: list[int]
    """Each sample's index among its session's samples (0: the session's output itself,
    1..: its ``segments`` in order); the rows of a session are consecutive."""
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def tool_calls(self) -> list[int]:
        """Tool calls that ran per sample (from ``records``)."""
        return [int(r.tool_calls) for r in self.records]

    @property
    def tool_errors(self) -> list[int]:
        """Failed or unparsable tool calls per sample (from ``records``)."""
        return [int(r.tool_errors) for r in self.records]

    @property
    def weights(self) -> list[float]:
        """Each sample's weight in its group's statistics and in the loss (from ``records``)."""
        return [float(r.weight) for r in self.records]

    @property
    def num_sessions(self) -> int:
        """Sessions (outputs of the agent loops) in the batch; ``len`` counts samples."""
        return sum(s == 0 for s in self.segment)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, indices: list[int]) -> RolloutBatch:
        """The samples at ``indices``, in that order (metrics kept)."""
        out: dict[str, Any] = {}
        index = torch.tensor(indices, dtype=torch.long)
        for f in fields(RolloutBatch):
            value = getattr(self, f.name)
            if f.name == "metrics":
                out[f.name] = dict(value)
            elif isinstance(value, torch.Tensor):
                out[f.name] = value.index_select(0, index)
            else:
                out[f.name] = [value[i] for i in indices]
        return RolloutBatch(**out)

    @staticmethod
    def cat(batches: list[RolloutBatch]) -> RolloutBatch:
        """One batch of several (same prompt/response lengths), in order; metrics of the
        first (callers set their own)."""
        if not batches:
            raise ValueError("RolloutBatch.cat needs at least one batch")
        out: dict[str, Any] = {}
        for f in fields(RolloutBatch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "metrics":
                out[f.name] = dict(values[0])
            elif isinstance(values[0], torch.Tensor):
                out[f.name] = torch.cat(values)
            else:
                out[f.name] = [x for v in values for x in v]
        return RolloutBatch(**out)


def session_samples(outputs: list[AgentLoopOutput]) -> list[AgentLoopOutput]:
    """Every training sample of ``outputs``, in batch order: each output, then its
    ``segments``."""
    return [sample for out in outputs for sample in (out, *out.segments)]


def collate(
    outputs: list[AgentLoopOutput],
    rows: list[dict[str, Any]],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
) -> RolloutBatch:
    """Pad ``outputs`` (one per row) into a batch of one row per training sample: each
    output, then its ``segments``, which get a copy of the output's dataset row."""
    if len(outputs) != len(rows):
        raise ValueError(f"{len(outputs)} outputs for {len(rows)} rows")
    samples: list[AgentLoopOutput] = []
    sample_rows: list[dict[str, Any]] = []
    segment: list[int] = []
    names: list[str] = []  # "sample i" or "sample i segment j", for errors
    for i, (out, row) in enumerate(zip(outputs, rows, strict=True)):
        for j, sample in enumerate((out, *out.segments)):
            if j and sample.segments:
                raise ValueError(
                    f"sample {i} segment {j} has segments of its own: a session's further "
                    "samples are one flat list, AgentLoopOutput.segments of its first"
                )
            samples.append(sample)
            sample_rows.append(row if j == 0 else dict(row))
            segment.append(j)
            names.append(f"sample {i}" if j == 0 else f"sample {i} segment {j}")
    b, p, r = len(samples), prompt_length, response_length
    prompts = np.full((b, p), pad_token_id, dtype=np.int64)
    responses = np.full((b, r), pad_token_id, dtype=np.int64)
    prompt_mask = np.zeros((b, p), dtype=np.int64)
    resp_attn = np.zeros((b, r), dtype=np.int64)
    resp_mask = np.zeros((b, r), dtype=np.int64)
    logp = np.zeros((b, r), dtype=np.float32)
    versions = np.full((b, r), -1, dtype=np.int64)
    for i, out in enumerate(samples):
        np_, nr = len(out.prompt_ids), len(out.response_ids)
        if np_ > p or nr > r:
            raise ValueError(
                f"{names[i]} has {np_} prompt / {nr} response tokens, over the "
                f"prompt_length={p} / response_length={r} budget"
            )
        prompts[i, p - np_ :] = out.prompt_ids
        prompt_mask[i, p - np_ :] = 1
        responses[i, :nr] = out.response_ids
        resp_attn[i, :nr] = 1
        resp_mask[i, :nr] = out.response_mask
        logp[i, :nr] = out.response_log_probs
        if out.response_versions is not None:
            versions[i, :nr] = out.response_versions
        else:
            versions[i, :nr] = np.where(np.asarray(out.response_mask) == 1, 0, -1)
    attention = np.concatenate([prompt_mask, resp_attn], axis=1)
    position = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
    return RolloutBatch(
        prompts=torch.from_numpy(prompts),
        responses=torch.from_numpy(responses),
        input_ids=torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        attention_mask=torch.from_numpy(attention),
        position_ids=torch.from_numpy(position),
        response_mask=torch.from_numpy(resp_mask),
        rollout_log_probs=torch.from_numpy(logp),
        rollout_versions=torch.from_numpy(versions),
        uid=[str(row["uid"]) for row in sample_rows],
        rows=sample_rows,
        agent_name=[str(row["agent_name"]) for row in sample_rows],
        num_turns=[o.num_turns for o in samples],
        reward_score=[o.reward_score for o in samples],
        records=[o.record for o in samples],
        segment=segment,
    )


def _spread(prefix: str, values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {
        f"{prefix}/mean": float(arr.mean()),
        f"{prefix}/max": float(arr.max()),
        f"{prefix}/min": float(arr.min()),
    }


def rollout_metrics(outputs: list[AgentLoopOutput], wall_s: float) -> dict[str, float]:
    """Per-phase timing spread over sessions (``outputs``), the slowest session's breakdown;
    turn, length and tool counts over training samples (each output and its ``segments``,
    the rows of the batch); sessions, samples and segments per session; with context
    compaction on, ``agent_loop/compactions`` (the step's count), the share of sessions
    compacted and the samples stopped ``context_full``; ``agent_loop/env/<key>/mean``: an
    environment's state numbers (turns, tool calls, steps, return) over the sessions that
    report them. ``timing_s/gen`` is the wall time of the whole rollout."""
    if not outputs:
        return {"timing_s/gen": wall_s}
    metrics = {"timing_s/gen": wall_s}
    for key in ("generate_s", "tool_s", "total_s"):
        metrics |= _spread(f"agent_loop/{key}", [o.metrics.get(key, 0.0) for o in outputs])
    for key in dict.fromkeys(k for o in outputs for k in o.metrics if k.startswith("env/")):
        values = [o.metrics[key] for o in outputs if key in o.metrics]  # an environment's state
        metrics[f"agent_loop/{key}/mean"] = float(np.mean(values))
    samples = session_samples(outputs)
    metrics["agent_loop/sessions"] = float(len(outputs))
    metrics["agent_loop/samples"] = float(len(samples))
    segments = [1 + len(o.segments) for o in outputs]
    metrics["agent_loop/segments_per_session/mean"] = float(np.mean(segments))
    metrics["agent_loop/segments_per_session/max"] = float(max(segments))
    metrics["agent_loop/zero_weight_samples"] = float(sum(o.record.weight == 0 for o in samples))
    compactions = [o.metrics["compactions"] for o in outputs if "compactions" in o.metrics]
    if compactions:  # multi_turn.max_context_tokens is set (tool_agent compacts histories)
        metrics["agent_loop/compactions"] = float(sum(compactions))
        metrics["agent_loop/compacted_sessions/frac"] = float(np.mean([c > 0 for c in compactions]))
        metrics["agent_loop/context_full"] = float(
            sum(o.record.stop_reason == "context_full" for o in samples)
        )
    metrics |= _spread("agent_loop/num_turns", [o.num_turns for o in samples])
    metrics |= _spread("agent_loop/response_length", [len(o.response_ids) for o in samples])
    metrics |= _spread("agent_loop/tool_calls", [o.record.tool_calls for o in samples])
    metrics["agent_loop/tool_errors/mean"] = float(np.mean([o.record.tool_errors for o in samples]))
    # Per sample: calls written = succeeded (tool_calls) + malformed + failed; model turns
    # (num_turns counts messages, verl's way: the prompt's, the model's and the tools').
    records = [o.record for o in samples]
    for name in ("attempted", "malformed", "failed"):
        counts = [getattr(r, f"calls_{name}") for r in records]
        metrics[f"agent_loop/calls_{name}/mean"] = float(np.mean(counts))
    metrics["agent_loop/samples_with_calls"] = float(
        np.mean([r.calls_attempted > 0 for r in records])
    )
    metrics |= _spread("agent_loop/assistant_turns", [r.assistant_turns for r in records])
    # Calls whose JSON only parsed after repair (multi_turn.repair_tool_calls): the step's
    # count, and their share of the calls that ran.
    ran = [c for r in records for c in r.calls]
    repaired = sum(c.repaired for c in ran)
    metrics["agent_loop/repaired_calls"] = float(repaired)
    metrics["agent_loop/repaired_calls/frac"] = repaired / len(ran) if ran else 0.0
    metrics |= tool_metrics(ran)
    metrics |= interaction_metrics(records)
    metrics |= workspace_metrics([o.metrics for o in outputs])
    slowest = max(range(len(outputs)), key=lambda i: outputs[i].metrics.get("total_s", 0.0))
    out = outputs[slowest]
    metrics |= {
        "agent_loop/slowest/index": float(slowest),
        "agent_loop/slowest/total_s": out.metrics.get("total_s", 0.0),
        "agent_loop/slowest/generate_s": out.metrics.get("generate_s", 0.0),
        "agent_loop/slowest/tool_s": out.metrics.get("tool_s", 0.0),
        "agent_loop/slowest/num_turns": float(out.num_turns),
        "agent_loop/slowest/prompt_length": float(len(out.prompt_ids)),
        "agent_loop/slowest/response_length": float(len(out.response_ids)),
    }
    return metrics


def interaction_metrics(records: list[SampleRecord]) -> dict[str, float]:
    """Over the samples that talked to a simulated user (none: no keys):
    ``interaction/{samples,user_turns/mean,terminated_frac,errors,seconds_mean,seconds_max,
    turn_score/mean,final_score/mean}`` (``seconds``: time in the interaction's calls per
    sample, a model-backed user's generation included)."""
    talks = [r.interaction for r in records if r.interaction is not None]
    if not talks:
        return {}
    seconds = [t.seconds for t in talks]
    scores = [s for t in talks for s in t.turn_scores if s is not None]
    finals = [t.final_score for t in talks if t.final_score is not None]
    out = {
        "interaction/samples": float(len(talks)),
        "interaction/user_turns/mean": float(np.mean([len(t.turn_scores) for t in talks])),
        "interaction/terminated_frac": float(np.mean([t.terminated for t in talks])),
        "interaction/errors": float(sum(t.error is not None for t in talks)),
        "interaction/seconds_mean": float(np.mean(seconds)),
        "interaction/seconds_max": float(max(seconds)),
    }
    if scores:
        out["interaction/turn_score/mean"] = float(np.mean(scores))
    if finals:
        out["interaction/final_score/mean"] = float(np.mean(finals))
    return out


def tool_metrics(calls: list[ToolCallRecord]) -> dict[str, float]:
    """Per tool name, over the step's calls that ran (or failed to start):
    ``tool/<name>/{calls,failures,seconds_mean,seconds_max}``."""
    by_name: dict[str, list[ToolCallRecord]] = {}
    for call in calls:
        by_name.setdefault(call.name, []).append(call)
    out: dict[str, float] = {}
    for name, mine in sorted(by_name.items()):
        seconds = [c.seconds for c in mine]
        out[f"tool/{name}/calls"] = float(len(mine))
        out[f"tool/{name}/failures"] = float(sum(not c.ok for c in mine))
        out[f"tool/{name}/seconds_mean"] = float(np.mean(seconds))
        out[f"tool/{name}/seconds_max"] = float(max(seconds))
    return out
