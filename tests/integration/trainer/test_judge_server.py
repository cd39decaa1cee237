"""A judge model on its own AsyncServer group (real Ray actor, real vLLM CPU engine on
tiny-qwen3) scores a rollout batch end to end through the RewardManager; when its only server
dies, the judge retries and then fails with a clear error."""

from __future__ import annotations

import re

import pytest
import ray
from transformers import AutoTokenizer

from servers import stop_servers
from tests.shm import remove_new_segments, shm_segments
from tests.unit.trainer.rewards.batch import make_batch
from trainer.config.reward import JudgeConfig, RewardFunctionConfig, RewardModelConfig
from trainer.launch.rollout import start_judge
from trainer.rewards import JudgeReward, JudgeUnavailableError, RewardManager, parse_judge_score

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def judge(local_ray, tiny_qwen3_path):
    segments = shm_segments()
    config = JudgeConfig(
        enable=True,
        model_path=str(tiny_qwen3_path),
        max_model_len=512,
        max_tokens=24,
        max_retries=1,
        retry_backoff_s=0.2,
        # tiny-qwen3 has random weights: accept any number it writes as its score
        score_pattern=r"(\d+(?:\.\d+)?)",
        max_score=10.0,
    )
    servers, client, tokenizer = start_judge(config, "cpu")
    yield config, servers, client, tokenizer
    stop_servers(servers)
    remove_new_segments(segments)  # the killed engine could not unlink its own


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def manager_for(judge, tokenizer) -> tuple[RewardManager, JudgeReward]:
    config, _, client, judge_tokenizer = judge
    reward = JudgeReward(config, client, judge_tokenizer)
    manager = RewardManager(
        RewardFunctionConfig(),
        RewardModelConfig(judge=config, weights={"rule": 0.0}),
        tokenizer,
        judge=reward,
    )
    return manager, reward


def test_a_judge_group_scores_a_batch_end_to_end(judge, tokenizer):
    config, servers, client, _ = judge
    manager, reward = manager_for(judge, tokenizer)
    answers = ["#### 42", "I think it is 41.", "Paris", "no idea"]
    try:
        out = manager.score(make_batch(tokenizer, answers))
    finally:
        manager.close()
    pattern = re.compile(config.score_pattern, re.S)
    assert sorted(reward.outputs) == [0, 1, 2, 3]  # one real judge answer per sample
    expected = []
    for i in range(4):
        parsed = parse_judge_score(reward.outputs[i], pattern, config.min_score, config.max_score)
        expected.append(config.fallback_score if parsed is None else parsed)
    assert out.scores.tolist() == pytest.approx(expected)
    failures = sum(
        parse_judge_score(t, pattern, 0.0, 10.0) is None for t in reward.outputs.values()
    )
    assert out.metrics["reward/judge/parse_failures"] == failures
    assert out.metrics["reward/judge/requests"] == 4.0
    assert out.metrics["reward/errors"] == 0.0
    assert sum(s["requests"] for s in client.stats()) >= 4  # through the group's balancer


def test_a_dead_judge_group_is_retried_then_a_clear_failure(judge, tokenizer):
    config, servers, client, _ = judge
    ray.kill(servers[0])
    manager, reward = manager_for(judge, tokenizer)
    try:
        with pytest.raises(JudgeUnavailableError) as err:
            manager.score(make_batch(tokenizer, ["#### 42", "#### 41"]))
    finally:
        manager.close()
    message = str(err.value)
    assert message.startswith(
        f"the judge server group ({config.model_path}, 1 server(s)) failed after 1 retries: "
        "no healthy server left for request judge-"
    )
    assert message.endswith(
        "(1 of 1 dead). Its servers died: see their Ray logs (memory: reward_model.judge."
        "gpu_memory_utilization, max_model_len), or raise reward_model.judge.max_retries"
    )
    assert client.stats()[0]["failures"] >= 2  # the first try and the retry both reached it
