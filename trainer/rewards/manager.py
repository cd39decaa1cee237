"""``RewardManager``: every configured reward of a rollout batch, composed.

For each sample: ``reward = sum_k weight_k * reward_k`` over the named rewards that are on
(``rule``, the extra ``reward_model.rules``, ``judge``, ``verify``), all scored concurrently on
one background event loop. Logged per step: ``reward/{mean,max,min}`` of the sum,
``reward/<name>`` (mean of each reward), ``reward/<name>/<key>`` (numeric keys of dict
results, and the counters of the judge/verify components), ``reward/errors`` and
``reward/<name>/errors`` (calls that raised or timed out: scored 0, the step goes on),
``reward/env/<name>`` (an environment's own named reward functions, e.g. a verifiers rubric's,
whose weighted sum the loop set as the sample's reward).

A sample whose agent loop set ``reward_score`` keeps it as its ``rule`` reward (each row of
a gateway session's segments carries the session's reward); a sample without one, segment or
not, is scored by the configured reward on its own response. Turn-level
rewards (``trainer.rewards.turn_rewards``: a reward's ``turn_scores``, the loop's
``SampleRecord.turn_scores``, tool-call rewards x ``process_reward_coef``) land on the last
token of their model turn; with the scores on each last sampled token they are the token
rewards the advantage estimator reads (``RewardOutput.token_rewards``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from agentloop.records import SampleRecord
from trainer.algos import scores_to_token_rewards
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.rewards.rule_reward import RuleReward, rule_component
from trainer.rewards.turn_rewards import (
    as_turn_scores,
    place_turn_scores,
    process_rewards,
    turn_ends,
    turn_reward_metrics,
)
from trainer.rewards.types import RewardComponent, RewardSample, as_score

__all__ = ["RewardManager", "RewardOutput", "process_rewards", "reward_info", "samples_of"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class RewardOutput:
    scores: torch.Tensor
    """[batch] the weighted sum of the outcome rewards."""
    turn_rewards: torch.Tensor | None
    """[batch, response] the turn-level rewards on the last token of their turn (0 elsewhere;
    ``trainer.rewards.turn_rewards``); None: no turn-level reward in this batch."""
    metrics: dict[str, float]
    components: dict[str, list[float]]
    """Each named reward's score per sample (before weighting)."""
    extra_info: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    """verl's ``reward_extra_info``: each key (other than ``score``) of the rewards' dict
    results, per sample (None where a sample's result lacked it); a key two rewards return
    is taken from the first. Validation votes on ``pred`` (``maj@n``)."""

    def token_rewards(self, mask: torch.Tensor) -> torch.Tensor | None:
        """[batch, response]: the scores on each last sampled token plus the turn rewards;
        None without turn rewards (the estimators then read the scores alone)."""
        if self.turn_rewards is None:
            return None
        return scores_to_token_rewards(self.scores, mask) + self.turn_rewards

    @staticmethod
    def cat(parts: list[RewardOutput]) -> RewardOutput:
        """One output of several scored in turn (async training scores group by group):
        scores in order; ``/errors`` counts summed, ``max``/``min`` over all, every other
        metric the sample-weighted mean."""
        scores = torch.cat([p.scores for p in parts])
        turn_rewards = None
        if any(p.turn_rewards is not None for p in parts):
            like = next(p.turn_rewards for p in parts if p.turn_rewards is not None)
            turn_rewards = torch.cat(
                [
                    p.turn_rewards
                    if p.turn_rewards is not None
                    else like.new_zeros(len(p.scores), like.shape[1])
                    for p in parts
                ]
            )
        sizes = [len(p.scores) for p in parts]
        total = max(sum(sizes), 1)
        metrics: dict[str, float] = {}
        for key in {k for p in parts for k in p.metrics}:
            values = [
                (p.metrics[key], n) for p, n in zip(parts, sizes, strict=True) if key in p.metrics
            ]
            if key.endswith("/errors") or key.endswith("parse_failures"):
                metrics[key] = sum(v for v, _ in values)
            elif key.endswith("/max"):
                metrics[key] = max(v for v, _ in values)
            elif key.endswith("/min"):
                metrics[key] = min(v for v, _ in values)
            else:
                metrics[key] = sum(v * n for v, n in values) / total
        components = {
            name: [x for p in parts for x in p.components.get(name, [])]
            for name in {k for p in parts for k in p.components}
        }
        extra_info: dict[str, list[Any]] = {}
        for key in dict.fromkeys(k for p in parts for k in p.extra_info):
            for p, n in zip(parts, sizes, strict=True):
                extra_info.setdefault(key, []).extend(p.extra_info.get(key, [None] * n))
        return RewardOutput(scores, turn_rewards, metrics, components, extra_info)


def samples_of(batch: Any, tokenizer: Any) -> list[RewardSample]:
    """The reward view of a rollout batch (responses decoded once)."""
    p = batch.prompts.shape[1]
    lengths = batch.attention_mask[:, p:].sum(-1).tolist()
    texts = tokenizer.batch_decode(
        [batch.responses[i, :n].tolist() for i, n in enumerate(lengths)], skip_special_tokens=True
    )
    samples = []
    for i, text in enumerate(texts):
        row = batch.rows[i]
        info = dict(row.get("extra_info") or {})
        info.update(reward_info(batch.records[i], batch.num_turns[i]))
        truth = (row.get("reward_model") or {}).get("ground_truth")
        samples.append(RewardSample(i, row.get("data_source", ""), text, truth, info, row))
    return samples


def reward_info(record: SampleRecord, num_turns: int) -> dict[str, Any]:
    """What reward functions get of a sample's record, merged into the row's ``extra_info``:
    plain dicts and lists (the verl ``compute_score`` contract; picklable for process
    pools), each call as the dict of its ``ToolCallRecord`` fields."""
    return {
        "tool_rewards": record.tool_rewards,
        "tool_calls": int(record.tool_calls),
        "num_turns": num_turns,
        "calls": [dataclasses.asdict(c) for c in record.calls],
        "stop_reason": record.stop_reason,
        "assistant_turns": int(record.assistant_turns) or 1,
        # the simulated user's conversation: its turn scores and final score (None: no user)
        "interaction": (
            dataclasses.asdict(record.interaction) if record.interaction is not None else None
        ),
        "turn_scores": list(record.interaction.turn_scores) if record.interaction else [],
    }


class RewardManager:
    def __init__(
        self,
        rule: RewardFunctionConfig,
        config: RewardModelConfig,
        tokenizer: Any,
        *,
        judge: RewardComponent | None = None,
        verify: RewardComponent | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.tokenizer = tokenizer
        on = config.components()
        components: list[RewardComponent] = []
        if "rule" in on:
            components.append(rule_component(rule, config))
        for i, extra in enumerate(config.rules):
            if extra.name in on:
                components.append(
                    RuleReward(
                        extra.name,
                        extra.path,
                        extra.function,
                        f"reward_model.rules[{i}]",
                        field="function",
                        reward_kwargs=extra.reward_kwargs,
                        timeout_s=extra.timeout_s,
                        workers=rule.num_workers,
                        executor=rule.executor,
                    )
                )
        for name, given in (("judge", judge), ("verify", verify)):
            if name in on:
                if given is None:
                    raise ValueError(f"reward_model.{name} is on but no {name} reward was built")
                components.append(given)
        self.components = components
        self.weights = {c.name: float(config.weights.get(c.name, 1.0)) for c in components}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rewards", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the rewards' event loop (tool clients and judge calls live there)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _score_all(self, samples: list[RewardSample]) -> list[list[Any]]:
        return list(await asyncio.gather(*(c.score(samples) for c in self.components)))

    def score(self, batch: Any) -> RewardOutput:
        samples = samples_of(batch, self.tokenizer)
        results = self.run(self._score_all(samples))
        n = len(samples)
        total = torch.zeros(n, dtype=torch.float32)
        metrics: dict[str, float] = {}
        per_component: dict[str, list[float]] = {}
        extra_info: dict[str, list[Any]] = {}
        errors = 0
        mask = batch.response_mask
        turns = [len(turn_ends(batch.records[i], mask[i])) for i in range(n)]
        turn_rewards = torch.zeros(mask.shape, dtype=torch.float32)
        has_turn_rewards = False
        for component, values in zip(self.components, results, strict=True):
            _add_extra_info(extra_info, values, n)
            scores, extras, failed = self._collect(component, values, samples, batch)
            turn_scores = [
                as_turn_scores(v, component.describe, sample, turns[sample.index])
                for sample, v in zip(samples, values, strict=True)
            ]
            if any(t is not None for t in turn_scores):
                has_turn_rewards = True
                weight = self.weights[component.name]
                turn_rewards += weight * place_turn_scores(batch.records, mask, turn_scores)
            per_component[component.name] = scores
            errors += failed
            total += self.weights[component.name] * torch.tensor(scores, dtype=torch.float32)
            name = component.name
            metrics[f"reward/{name}"] = sum(scores) / max(n, 1)
            metrics[f"reward/{name}/errors"] = float(failed)
            for key, vals in extras.items():
                metrics[f"reward/{name}/{key}"] = sum(vals) / len(vals)
            for key, value in component.metrics().items():
                metrics[f"reward/{name}/{key}"] = value
        metrics |= _env_parts(batch.records)
        metrics |= {
            "reward/mean": float(total.mean()) if n else 0.0,
            "reward/max": float(total.max()) if n else 0.0,
            "reward/min": float(total.min()) if n else 0.0,
            "reward/errors": float(errors),
        }
        loop_scores = [list(r.turn_scores) or None for r in batch.records]
        if any(loop_scores):
            has_turn_rewards = True
            turn_rewards += place_turn_scores(batch.records, mask, loop_scores)
        if self.config.process_reward_coef:
            has_turn_rewards = True
            process = process_rewards(batch, self.config.process_reward_coef)
            turn_rewards += process
            metrics["reward/process"] = float(process.sum(-1).mean()) if n else 0.0
        if not has_turn_rewards:
            return RewardOutput(total, None, metrics, per_component, extra_info)
        metrics |= turn_reward_metrics(turn_rewards, batch.records, mask)
        return RewardOutput(total, turn_rewards, metrics, per_component, extra_info)

    @staticmethod
    def _collect(
        component: RewardComponent, values: list[Any], samples: list[RewardSample], batch: Any
    ) -> tuple[list[float], dict[str, list[float]], int]:
        scores: list[float] = []
        extras: dict[str, list[float]] = {}
        failed = 0
        for sample, value in zip(samples, values, strict=True):
            preset = batch.reward_score[sample.index] if component.name == "rule" else None
            if preset is not None:
                scores.append(float(preset))
                continue
            if isinstance(value, BaseException):
                failed += 1
                logger.warning(
                    "%s failed on sample %d: %s: %s",
                    component.describe,
                    sample.index,
                    type(value).__name__,
                    value,
                )
                scores.append(0.0)
                continue
            score, keys = as_score(value, component.describe, sample)
            scores.append(score)
            for key, v in keys.items():
                extras.setdefault(key, []).append(v)
        return scores, extras, failed

    def close(self) -> None:
        for component in self.components:
            component.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def _add_extra_info(out: dict[str, list[Any]], values: list[Any], n: int) -> None:
    """The keys of one reward's dict results into ``out`` (per sample; a sample's key
    already set by an earlier reward is kept)."""
    for i, value in enumerate(values):
        if not isinstance(value, dict):
            continue
        for key, v in value.items():
            if key == "score":
                continue
            column = out.setdefault(key, [None] * n)
            if column[i] is None:
                column[i] = v


def _env_parts(records: list[SampleRecord]) -> dict[str, float]:
    """``reward/env/<name>``: the mean of an environment's named reward function over the
    samples that have it (``SampleRecord.reward_parts``)."""
    parts = [r.reward_parts for r in records]
    metrics = {}
    for name in dict.fromkeys(k for p in parts for k in p):
        values = [p[name] for p in parts if name in p]
        metrics[f"reward/env/{name}"] = sum(values) / len(values)
    return metrics
