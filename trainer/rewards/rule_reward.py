"""Rule rewards as components of the ``RewardManager``: a verl-signature function run in a
thread or process pool, called the way verl's reward managers call it.

- ``naive`` (verl's default) and ``prime``: once per sample, by keyword,
  ``fn(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)``; ``prime``
  (verl: a process pool) runs in our process pool whatever ``executor`` says;
- ``batch``: once per batch, ``fn(data_sources=, solution_strs=, ground_truths=,
  extra_infos=, **reward_kwargs)`` returning one result per sample, within one ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.rewards.pool import CallPool
from trainer.rewards.rules import (
    RewardFn,
    check_reward_function,
    describe_function,
    load_reward_function,
)
from trainer.rewards.types import RewardComponent, RewardFunctionError, RewardSample

__all__ = ["BatchRuleReward", "RuleReward", "load_rule", "rule_component"]

BATCH_NEEDS_PATH = (
    "reward_model.reward_manager=batch calls custom_reward_function once per batch with lists, "
    "and the built-in scorers score one sample at a time: set custom_reward_function.path to "
    "a file with compute_score(data_sources, solution_strs, ground_truths, extra_infos, "
    "**kwargs), or set reward_model.reward_manager=naive"
)


def load_rule(
    path: str | None,
    function: str,
    key: str,
    reward_kwargs: Mapping[str, Any],
    *,
    field: str = "name",
    batch: bool = False,
) -> RewardFn:
    """The function ``function`` of ``path``, checked to take the keywords it will be called
    with (``check_reward_function``); errors name the config keys under ``key``."""
    if batch and not path:
        raise ValueError(BATCH_NEEDS_PATH)
    fn = load_reward_function(path, function, key, field)
    check_reward_function(
        fn,
        describe_function(path, function),
        function,
        reward_kwargs,
        f"{key}.reward_kwargs",
        batch=batch,
    )
    return fn


class RuleReward:
    """One call per sample, by keyword (verl's naive reward manager)."""

    def __init__(
        self,
        name: str,
        path: str | None,
        function: str,
        key: str,
        *,
        field: str = "name",
        reward_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float,
        workers: int,
        executor: str = "thread",
    ) -> None:
        """``key``/``field``: the config keys errors name (``<key>.path``, ``<key>.<field>``)."""
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        fn = load_rule(path, function, key, self.reward_kwargs, field=field)
        self.describe = describe_function(path, function)
        self.pool = CallPool(
            fn,
            workers=workers,
            timeout_s=timeout_s,
            kind="process" if executor == "process" else "thread",
            source=(path, function, key, field),
        )

    async def score(self, samples: list[RewardSample]) -> list[Any]:
        return await self.pool.map([self._keywords(s) for s in samples])

    def _keywords(self, s: RewardSample) -> dict[str, Any]:
        return {
            "data_source": s.data_source,
            "solution_str": s.solution_str,
            "ground_truth": s.ground_truth,
            "extra_info": s.extra_info,
            **self.reward_kwargs,
        }

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.pool.close()


class BatchRuleReward:
    """One call per batch with lists (verl's batch reward manager); a call that raises or
    times out fails every sample of the batch (each scored 0 and counted)."""

    def __init__(
        self,
        path: str,
        function: str,
        *,
        reward_kwargs: Mapping[str, Any] | None = None,
        timeout_s: float,
        executor: str = "thread",
    ) -> None:
        self.name = "rule"
        self.reward_kwargs = dict(reward_kwargs or {})
        key = "custom_reward_function"
        fn = load_rule(path, function, key, self.reward_kwargs, batch=True)
        self.describe = describe_function(path, function)
        self.pool = CallPool(
            fn,
            workers=1,
            timeout_s=timeout_s,
            kind="process" if executor == "process" else "thread",
            source=(path, function, key, "name"),
        )

    async def score(self, samples: list[RewardSample]) -> list[Any]:
        if not samples:
            return []
        job = {
            "data_sources": [s.data_source for s in samples],
            "solution_strs": [s.solution_str for s in samples],
            "ground_truths": [s.ground_truth for s in samples],
            "extra_infos": [s.extra_info for s in samples],
            **self.reward_kwargs,
        }
        (result,) = await self.pool.map([job])
        if isinstance(result, BaseException):
            return [result] * len(samples)
        if isinstance(result, np.ndarray):
            result = result.tolist()
        if not isinstance(result, (list, tuple)) or len(result) != len(samples):
            if isinstance(result, (list, tuple)):
                shown = f"a list of {len(result)}"
            else:
                shown = f"{repr(result)[:80]} ({type(result).__name__})"
            raise RewardFunctionError(
                f"{self.describe} returned {shown} for a batch of {len(samples)} samples; with "
                f"reward_model.reward_manager=batch it must return a list of {len(samples)} "
                "scores (numbers or dicts with a numeric 'score'), one per sample in order"
            )
        return list(result)

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.pool.close()


def rule_component(rule: RewardFunctionConfig, config: RewardModelConfig) -> RewardComponent:
    """The ``rule`` reward: ``custom_reward_function`` called as ``reward_manager`` says."""
    if config.reward_manager == "batch":
        if not rule.path:
            raise ValueError(BATCH_NEEDS_PATH)
        return BatchRuleReward(
            rule.path,
            rule.name,
            reward_kwargs=rule.reward_kwargs,
            timeout_s=rule.timeout_s,
            executor=rule.executor,
        )
    return RuleReward(
        "rule",
        rule.path,
        rule.name,
        "custom_reward_function",
        reward_kwargs=rule.reward_kwargs,
        timeout_s=rule.timeout_s,
        workers=rule.num_workers,
        executor="process" if config.reward_manager == "prime" else rule.executor,
    )
