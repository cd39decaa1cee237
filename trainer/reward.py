"""Outcome rewards for a rollout batch: the verl reward-function signature

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict

loaded from ``custom_reward_function.path/name`` (else the built-in scorer by data_source),
called for every sample in a thread pool with a timeout. A dict result uses ``score`` as the
reward and logs its other keys. A sample whose agent loop already set ``reward_score`` keeps
it. A scorer that raises or times out gives 0 and a counted error; the step continues.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import numbers
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.config.run import RewardFunctionConfig

__all__ = ["RewardScorer", "default_compute_score", "load_reward_function"]

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str, Any, dict[str, Any]], Any]

_GSM8K = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def _normalise(text: str) -> str:
    return text.strip().replace(",", "").rstrip(".").lower()


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> float:
    """Built-in rule: ``#### answer`` (GSM8K style; else the last number) for gsm8k-like
    sources, otherwise exact match of the text after the last ``</tool_response>`` block."""
    truth = _normalise(str(ground_truth))
    if "gsm8k" in (data_source or "") or _GSM8K.search(solution_str):
        found = _GSM8K.findall(solution_str) or _NUMBER.findall(solution_str)
        return 1.0 if found and _normalise(found[-1]) == truth else 0.0
    answer = solution_str.rsplit("</tool_response>", 1)[-1]
    answer = re.sub(r"<\|[^|]*\|>|<tool_call>.*?</tool_call>", "", answer, flags=re.S)
    return 1.0 if _normalise(answer) == truth else 0.0


def load_reward_function(config: RewardFunctionConfig) -> RewardFn:
    """The configured function, or the built-in one; a bad path or name fails here."""
    if not config.path:
        return default_compute_score
    path = Path(config.path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"custom_reward_function.path={config.path!r} does not exist: point it at a .py file"
        )
    spec = importlib.util.spec_from_file_location(f"agentloop_reward_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file; report what broke
        raise ValueError(
            f"custom_reward_function.path={config.path!r} failed to import: {exc}"
        ) from exc
    fn = getattr(module, config.name, None)
    if not callable(fn):
        raise ValueError(f"{path} has no function {config.name!r}: set custom_reward_function.name")
    return fn


class RewardScorer:
    def __init__(self, config: RewardFunctionConfig, tokenizer: Any) -> None:
        self.config = config
        self.fn = load_reward_function(config)
        self.tokenizer = tokenizer
        self.pool = ThreadPoolExecutor(max_workers=config.num_workers, thread_name_prefix="reward")

    def _one(self, row: dict[str, Any], text: str, extra: dict[str, Any]) -> Any:
        reward_model = row.get("reward_model") or {}
        info = dict(row.get("extra_info") or {})
        info.update(extra)
        return self.fn(row.get("data_source", ""), text, reward_model.get("ground_truth"), info)

    async def _score_all(self, jobs: list[tuple[dict, str, dict]]) -> list[Any]:
        loop = asyncio.get_running_loop()
        # The timeout counts a call from when a thread takes it, not the wait for a thread.
        slots = asyncio.Semaphore(self.config.num_workers)

        async def run(job: tuple[dict, str, dict]) -> Any:
            async with slots:
                try:
                    return await asyncio.wait_for(
                        loop.run_in_executor(self.pool, self._one, *job), self.config.timeout_s
                    )
                except TimeoutError:
                    return TimeoutError(f"timed out after {self.config.timeout_s:g} s")
                except Exception as exc:  # noqa: BLE001 - one bad sample must not end the step
                    return exc

        return await asyncio.gather(*(run(j) for j in jobs))

    def score(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """One float per sample and the reward metrics of the batch."""
        p = batch.prompts.shape[1]
        jobs = []
        for i in range(len(batch)):
            n = int(batch.attention_mask[i, p:].sum())
            text = self.tokenizer.decode(batch.responses[i, :n].tolist(), skip_special_tokens=True)
            extra = {
                "tool_rewards": batch.extra[i].get("tool_rewards", {}),
                "tool_calls": batch.tool_calls[i],
                "num_turns": batch.num_turns[i],
            }
            jobs.append((batch.rows[i], text, extra))
        results = asyncio.run(self._score_all(jobs))
        scores, errors = [], 0
        extra_keys: dict[str, list[float]] = {}
        for i, result in enumerate(results):
            if batch.reward_score[i] is not None:
                scores.append(float(batch.reward_score[i]))
                continue
            if isinstance(result, BaseException):
                errors += 1
                logger.warning("reward function failed on sample %d: %s", i, result)
                result = 0.0
            if isinstance(result, dict):
                for key, value in result.items():
                    if key != "score" and isinstance(value, numbers.Real):
                        extra_keys.setdefault(key, []).append(float(value))
                result = result.get("score", 0.0)
            is_number = isinstance(result, (numbers.Real, np.bool_))
            value = float(result) if is_number else math.nan
            if not math.isfinite(value):
                errors += 1
                logger.warning("reward function returned %r for sample %d: scored 0", result, i)
                value = 0.0
            scores.append(value)
        t = torch.tensor(scores, dtype=torch.float32)
        metrics = {
            "reward/mean": float(t.mean()),
            "reward/max": float(t.max()),
            "reward/min": float(t.min()),
            "reward/errors": float(errors),
        }
        for key, values in extra_keys.items():
            metrics[f"reward/{key}"] = sum(values) / len(values)
        return t, metrics

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
