"""verl's step-metric names computed from batch tensors (critic/score, rewards, returns,
response and prompt lengths) and copied from ours (``VERL_NAMES``), on hand-checked
inputs."""

from __future__ import annotations

import pytest
import torch

from trainer.metrics.verl_names import VERL_NAMES, data_metrics, step_metrics

# 3 samples, prompt width 3, response width 4: prompts of 2, 3, 1 tokens; responses of 4
# (clipped), 2 and 0 (aborted) tokens
ATTENTION = torch.tensor(
    [
        [0, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 0, 0, 0, 0],
    ]
)
RESPONSE_MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
ADVANTAGES = torch.tensor([[0.5, 0.5, 0.0, 0.5], [-1.0, -1.0, 0.0, 0.0], [0.0] * 4])
SCORES = torch.tensor([1.0, 0.0, 0.25])


def metrics(estimator: str = "grpo", **kwargs) -> dict[str, float]:
    args = {
        "attention_mask": ATTENTION,
        "prompt_width": 3,
        "scores": SCORES,
        "token_scores": None,
        "token_rewards": None,
        "advantages": ADVANTAGES,
        "response_mask": RESPONSE_MASK,
        "estimator": estimator,
    }
    return data_metrics(**(args | kwargs))


def test_scores_rewards_and_lengths_under_verls_names():
    out = metrics()
    # the aborted sample (empty response) is left out of score and reward, as verl does
    assert out["critic/score/mean"] == 0.5 and out["critic/score/min"] == 0.0
    assert out["critic/rewards/max"] == 1.0 and out["critic/rewards/mean"] == 0.5
    assert (out["response_length/mean"], out["response_length/max"]) == (2.0, 4.0)
    assert out["response_length/min"] == 0.0
    assert out["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert (out["prompt_length/mean"], out["prompt_length/min"]) == (2.0, 1.0)
    assert out["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert out["response/aborted_ratio"] == pytest.approx(1 / 3)


def test_grpo_returns_are_the_advantages_on_sampled_tokens():
    out = metrics()
    assert out["critic/returns/mean"] == pytest.approx((1.5 - 2.0) / 5)
    assert (out["critic/returns/max"], out["critic/returns/min"]) == (0.5, -1.0)
    assert "critic/returns/mean" in metrics("rloo")
    assert not any(k.startswith("critic/returns") for k in metrics("reinforce_plus_plus"))


def test_token_level_scores_and_kl_penalised_rewards_are_summed_per_sample():
    token_scores = torch.zeros(3, 4)
    token_scores[0, 3], token_scores[0, 1] = 1.0, 0.5  # the score + a process reward
    token_scores[1, 1] = 0.0
    token_rewards = token_scores - 0.1 * RESPONSE_MASK  # a KL penalty on sampled tokens
    out = metrics(token_scores=token_scores, token_rewards=token_rewards)
    assert (out["critic/score/max"], out["critic/score/min"]) == (1.5, 0.0)
    assert out["critic/rewards/max"] == pytest.approx(1.2)
    assert out["critic/rewards/min"] == pytest.approx(-0.2)


def test_step_metrics_copy_ours_and_add_throughput_per_token_timing_and_epoch():
    ours = {
        "training/step": 7.0,
        "perf/total_tokens": 12.0,
        "timing_s/step": 2.0,
        "timing_s/gen": 0.6,
        "timing_s/update_actor": 1.3,
        "agent_loop/num_turns/mean": 3.0,
        "agent_loop/num_turns/max": 5.0,
        "agent_loop/num_turns/min": 2.0,
    }
    out = step_metrics(ours, attention_mask=ATTENTION, prompt_width=3, epoch=1, n_gpus=2)
    assert out == pytest.approx(
        {
            "training/global_step": 7.0,
            "perf/total_num_tokens": 12.0,
            "perf/time_per_step": 2.0,
            "num_turns/mean": 3.0,
            "num_turns/max": 5.0,
            "num_turns/min": 2.0,
            "timing_per_token_ms/gen": 600 / 6,  # 6 response tokens
            "timing_per_token_ms/update_actor": 1300 / 12,  # 6 prompt + 6 response tokens
            "perf/throughput": 12 / (2.0 * 2),
            "training/epoch": 1.0,
        }
    )
    assert set(VERL_NAMES) <= set(ours)
