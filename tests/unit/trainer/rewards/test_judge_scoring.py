"""The judge reward against a scripted client (the real judge group is in
tests/integration/trainer/test_judge_server.py): score parsing and clamping, the counted
fallback, the concurrency limit, prompt fitting, retries when the group is down, and clear
config errors."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from servers.manager import NoHealthyServerError
from servers.types import GenerateRequest, TokenOutput
from tests.unit.trainer.rewards.batch import make_batch
from trainer.config.reward import JudgeConfig, RewardFunctionConfig, RewardModelConfig
from trainer.rewards import JudgeReward, JudgeUnavailableError, RewardManager, parse_judge_score

PATTERN = re.compile(JudgeConfig().score_pattern, re.S)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<score>0.8</score>", 0.8),
        ("thinking... <score> 1 </score>", 1.0),
        ("<score>0.2</score> wait, no: <score>0.6</score>", 0.6),  # the last one counts
        ("<score>7</score>", 1.0),  # clamped to max_score
        ("<score>-3.5</score>", 0.0),  # clamped to min_score
        ("The answer is correct. Score: 1", None),
        ("<score>high</score>", None),
        ("", None),
    ],
)
def test_scores_are_parsed_from_the_last_tag_and_clamped(text, expected):
    assert parse_judge_score(text, PATTERN, 0.0, 1.0) == expected


class ScriptedJudge:
    """The manager's API: answers from ``replies`` (cycled), tracking requests in flight;
    ``dead_for`` first calls raise as if the whole group were down."""

    def __init__(self, tokenizer: Any, replies: list[str], dead_for: int = 0) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.dead_for = dead_for
        self.calls = 0
        self.prompts: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self.servers = [object(), object()]
        self.revived: list[int] = []

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        self.calls += 1
        if self.calls <= self.dead_for:
            raise NoHealthyServerError("no healthy server left for request x (2 of 2 dead)")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            self.prompts.append(self.tokenizer.decode(request.prompt_ids))
            reply = self.replies[(len(self.prompts) - 1) % len(self.replies)]
            return TokenOutput(self.tokenizer.encode(reply), None, "stop")
        finally:
            self.in_flight -= 1

    def mark_healthy(self, index: int) -> None:
        self.revived.append(index)


def judge_manager(tokenizer, client, **judge: Any) -> RewardManager:
    config = JudgeConfig(enable=True, model_path="tiny-qwen3", retry_backoff_s=0.01, **judge)
    reward = JudgeReward(config, client, tokenizer)
    return RewardManager(
        RewardFunctionConfig(),
        RewardModelConfig(judge=config, weights={"rule": 0.0}),
        tokenizer,
        judge=reward,
    )


def run(manager: RewardManager, batch):
    try:
        return manager.score(batch)
    finally:
        manager.close()


def test_judge_scores_fill_the_template_and_unparseable_output_falls_back_counted(tokenizer):
    client = ScriptedJudge(tokenizer, ["<score>0.9</score>", "I refuse.", "<score>1</score>"])
    manager = judge_manager(tokenizer, client, fallback_score=0.1)
    out = run(manager, make_batch(tokenizer, ["#### 42", "#### 41", "#### 40"], truths=["42"] * 3))
    assert sorted(out.scores.tolist()) == pytest.approx([0.1, 0.9, 1.0])
    assert out.metrics["reward/judge/parse_failures"] == 1.0
    assert out.metrics["reward/judge/parsed"] == pytest.approx(2 / 3)
    assert out.metrics["reward/judge/requests"] == 3.0
    assert out.metrics["reward/errors"] == 0.0
    prompt = next(p for p in client.prompts if "question 1" in p)
    assert "#### 41" in prompt and "Reference answer:\n42" in prompt
    # one user turn through the judge's chat template, thinking off (chat_template_kwargs)
    assert prompt.startswith("<|im_start|>user\nYou are grading")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_judge_requests_respect_the_concurrency_limit(tokenizer):
    client = ScriptedJudge(tokenizer, ["<score>1</score>"])
    manager = judge_manager(tokenizer, client, max_concurrency=3)
    out = run(manager, make_batch(tokenizer, ["a"] * 10))
    assert out.scores.tolist() == [1.0] * 10
    assert client.max_in_flight == 3


def test_a_long_response_is_cut_from_the_left_to_fit_the_judge(tokenizer):
    client = ScriptedJudge(tokenizer, ["<score>1</score>"])
    manager = judge_manager(tokenizer, client, max_model_len=160, max_tokens=32)
    long = " ".join(f"w{i}" for i in range(400)) + " FINAL"
    out = run(manager, make_batch(tokenizer, [long], response_length=2048))
    assert out.scores.tolist() == [1.0]
    ids = tokenizer.encode(client.prompts[0])
    assert len(ids) <= 160 - 32
    assert "FINAL" in client.prompts[0] and "w0 " not in client.prompts[0]


def test_a_group_that_comes_back_is_retried(tokenizer):
    client = ScriptedJudge(tokenizer, ["<score>1</score>"], dead_for=2)
    manager = judge_manager(tokenizer, client, max_retries=2)
    out = run(manager, make_batch(tokenizer, ["a"]))
    assert out.scores.tolist() == [1.0]
    assert out.metrics["reward/judge/retries"] == 2.0
    assert client.revived == [0, 1, 0, 1]  # every server put back after each backoff


def test_a_judge_group_that_stays_down_is_a_clear_failure(tokenizer):
    client = ScriptedJudge(tokenizer, ["<score>1</score>"], dead_for=100)
    manager = judge_manager(tokenizer, client, max_retries=1)
    with pytest.raises(JudgeUnavailableError) as err:
        run(manager, make_batch(tokenizer, ["a", "b"]))
    assert str(err.value) == (
        "the judge server group (tiny-qwen3, 1 server(s)) failed after 1 retries: no healthy "
        "server left for request x (2 of 2 dead). Its servers died: see their Ray logs "
        "(memory: reward_model.judge.gpu_memory_utilization, max_model_len), or raise "
        "reward_model.judge.max_retries"
    )


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        (
            {"model_path": None},
            "reward_model.judge.enable=True needs reward_model.judge.model_path=<model>",
        ),
        (
            {"prompt_template": "Q: {question} A: {answer}"},
            "reward_model.judge.prompt_template uses {answer}; the fields are {question}, "
            "{response}, {ground_truth}, {data_source}",
        ),
        (
            {"prompt_template": "Q: {question}"},
            "reward_model.judge.prompt_template never shows the answer: add {response}",
        ),
        (
            {"score_pattern": "<score>"},
            "reward_model.judge.score_pattern needs a group around the number, "
            r"e.g. <score>(\d+)</score>",
        ),
        (
            {"prompt_template_path": "/nowhere/judge.txt"},
            "reward_model.judge.prompt_template_path='/nowhere/judge.txt' does not exist: "
            "point it at a text file",
        ),
        ({"min_score": 2.0}, "reward_model.judge.min_score must be <= max_score"),
    ],
)
def test_bad_judge_config_is_a_clear_error(judge, message):
    config = JudgeConfig(enable=True, **{"model_path": "tiny-qwen3", **judge})
    with pytest.raises(ValueError) as err:
        config.check()
    assert str(err.value) == message
