"""A judge model as a reward: a prompt template filled with the question, the response and
the ground truth, sent through the judge's own AsyncServer group (the same token-level
``generate`` API and load balancer the rollout uses), and a score parsed from its answer.

- The prompt is rendered with the judge's chat template in a thread; when it would not fit in
  ``max_model_len`` the response is cut from the left (the final answer is at its end).
- ``<score>x</score>`` (``score_pattern``; the last match) is clamped to
  ``[min_score, max_score]``; no match gives ``fallback_score`` and counts a parse failure.
- At most ``max_concurrency`` judge requests are in flight.
- A dead judge server is left for another (the manager retries); when the whole group is
  down, the request is retried ``max_retries`` times after a backoff (a restarted server is
  used again), then ``JudgeUnavailableError`` stops the run with what to check.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import uuid
from typing import Any

from agentloop.tokens import encode_prompt
from servers.types import EngineDeadError, GenerateRequest, SamplingParams
from trainer.config.reward import JudgeConfig
from trainer.rewards.types import RewardSample

__all__ = ["JudgeReward", "JudgeUnavailableError", "parse_judge_score"]

logger = logging.getLogger(__name__)


class JudgeUnavailableError(RuntimeError):
    """The judge server group could not answer after every retry."""


def parse_judge_score(text: str, pattern: re.Pattern[str], low: float, high: float) -> float | None:
    """The last match of ``pattern`` (its first group) as a float clamped to [low, high];
    None when nothing parses."""
    for match in reversed(pattern.findall(text)):
        raw = match[0] if isinstance(match, tuple) else match
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            return min(max(value, low), high)
    return None


class JudgeReward:
    name = "judge"
    COUNTERS = ("parse_failures", "retries", "requests")

    def __init__(self, config: JudgeConfig, client: Any, tokenizer: Any) -> None:
        config.check()
        self.config = config
        self.client = client
        """An ``AsyncLLMServerManager`` over the judge servers (anything with its API)."""
        self.tokenizer = tokenizer
        self.template = config.template()
        self.pattern = re.compile(config.score_pattern, re.S)
        self.describe = f"the judge ({config.model_path})"
        self._counters = dict.fromkeys(self.COUNTERS, 0.0)
        self.outputs: dict[int, str] = {}
        """The judge's text per sample index of the last batch (for traces and debugging)."""

    # ---- prompt --------------------------------------------------------------------------
    def _render(self, sample: RewardSample, response: str) -> list[int]:
        text = self.template.format(
            question=sample.question,
            response=response,
            ground_truth=sample.ground_truth,
            data_source=sample.data_source,
        )
        return encode_prompt(
            self.tokenizer,
            [{"role": "user", "content": text}],
            chat_template_kwargs=self.config.chat_template_kwargs,
        )

    def prompt_ids(self, sample: RewardSample) -> list[int]:
        """The judge prompt's token ids, the response cut from the left to fit the model."""
        budget = self.config.max_model_len - self.config.max_tokens
        ids = self._render(sample, sample.solution_str)
        excess = len(ids) - budget
        if excess <= 0:
            return ids
        response_ids = self.tokenizer.encode(sample.solution_str, add_special_tokens=False)
        keep = max(len(response_ids) - excess - 8, 0)
        cut = "..." + self.tokenizer.decode(response_ids[len(response_ids) - keep :])
        return self._render(sample, cut)[:budget]

    # ---- scoring -------------------------------------------------------------------------
    async def score(self, samples: list[RewardSample]) -> list[Any]:
        self._counters = dict.fromkeys(self.COUNTERS, 0.0)
        self.outputs = {}
        slots = asyncio.Semaphore(self.config.max_concurrency)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._one(s, slots)) for s in samples]
        except* JudgeUnavailableError as failed:
            raise failed.exceptions[0] from None
        results = [t.result() for t in tasks]
        failed_at = [i for i, r in enumerate(results) if isinstance(r, dict) and not r["parsed"]]
        if failed_at:
            example = self.outputs[samples[failed_at[0]].index]
            logger.warning(
                "judge output without a score for %d of %d samples (fallback %g), e.g. %r",
                len(failed_at),
                len(samples),
                self.config.fallback_score,
                example[:200],
            )
        return results

    async def _one(self, sample: RewardSample, slots: asyncio.Semaphore) -> Any:
        async with slots:
            try:
                ids = await asyncio.to_thread(self.prompt_ids, sample)
                text = await self._generate(ids)
            except JudgeUnavailableError:
                raise
            except Exception as exc:  # noqa: BLE001 - this sample's judge call; counted
                return exc
        self.outputs[sample.index] = text
        score = parse_judge_score(text, self.pattern, self.config.min_score, self.config.max_score)
        if score is None:
            self._counters["parse_failures"] += 1
            return {"score": self.config.fallback_score, "parsed": 0.0}
        return {"score": score, "parsed": 1.0}

    async def _generate(self, prompt_ids: list[int]) -> str:
        cfg = self.config
        params = SamplingParams(
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, logprobs=False
        )
        request = GenerateRequest(
            prompt_ids=prompt_ids, sampling_params=params, session_id=f"judge-{uuid.uuid4().hex}"
        )
        for attempt in range(cfg.max_retries + 1):
            self._counters["requests"] += 1
            try:
                out = await self.client.generate(request)
            except EngineDeadError as exc:
                if attempt == cfg.max_retries:
                    raise JudgeUnavailableError(
                        f"the judge server group ({cfg.model_path}, {cfg.num_servers} server(s)) "
                        f"failed after {cfg.max_retries} retries: {exc}. Its servers died: see "
                        "their Ray logs (memory: reward_model.judge.gpu_memory_utilization, "
                        "max_model_len), or raise reward_model.judge.max_retries"
                    ) from exc
                self._counters["retries"] += 1
                await asyncio.sleep(cfg.retry_backoff_s * 2**attempt)
                for index in range(len(self.client.servers)):
                    self.client.mark_healthy(index)  # a restarted server gets another chance
                continue
            return await asyncio.to_thread(
                self.tokenizer.decode, out.token_ids, skip_special_tokens=True
            )
        raise AssertionError("unreachable")

    def metrics(self) -> dict[str, float]:
        return dict(self._counters)

    def close(self) -> None:
        pass
