"""GiGPO (``algorithm.adv_estimator=gigpo``, ``trainer.algos.gigpo``): every term against a
float64 reference written from the definition with loops (episode term, step groups with ties,
singleton step groups, discounting, observation tokens masked, segment weights, both modes);
a turn's step advantage reaches that turn's sampled tokens only; anchor keys from what a turn
read, or from the state a tool named; step-group metrics; bad settings refused naming the key.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agentloop.records import SampleRecord, ToolCallRecord
from trainer.algos import compute_advantages
from trainer.algos.gigpo import TurnSteps, anchor_keys, step_group_metrics
from trainer.config import load_config
from trainer.loop.advantages import gigpo_steps
from trainer.workers import TrainBatch

EPS = 1e-6


def layout(turns: list[list[tuple[int, int]]], width: int) -> tuple[torch.Tensor, list[list[int]]]:
    """Response mask [batch, width] with each sample's turns as (first, last) sampled spans
    (observation tokens between them stay 0), and the turn ends."""
    mask = torch.zeros(len(turns), width, dtype=torch.long)
    for i, spans in enumerate(turns):
        for a, b in spans:
            mask[i, a : b + 1] = 1
    return mask, [[b for _, b in spans] for spans in turns]


# Two groups. Group "a": 4 samples whose turns reach states s0 (the prompt), then s1 or s2,
# then s3; one sample has a single turn; weights 1, except sample 3, a session's 2 segments
# (samples 3 and 4, 0.5 each). Group "b": 2 samples with no shared later state.
TURNS = [
    [(0, 2), (5, 7), (10, 11)],
    [(0, 1), (4, 6), (9, 12)],
    [(0, 3)],
    [(0, 2), (6, 8)],
    [(0, 1), (3, 5)],
    [(0, 4), (7, 9)],
    [(0, 2), (5, 6)],
]
KEYS = [
    ["s0", "s1", "s3"],
    ["s0", "s1", "s3"],
    ["s0"],
    ["s0", "s2"],
    ["t0", "s2"],
    ["b0", "b1"],
    ["b0", "b2"],
]
GROUPS = ["a", "a", "a", "a", "a", "b", "b"]
SCORES = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.2, 0.3, 0.9], dtype=torch.float64)
WEIGHTS = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0], dtype=torch.float64)
WIDTH = 14


def turn_rewards(ends: list[list[int]]) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    rewards = torch.zeros(len(ends), WIDTH, dtype=torch.float64)
    for i, e in enumerate(ends):
        for end in e:
            rewards[i, end] = float(torch.rand((), generator=g, dtype=torch.float64)) - 0.5
    return rewards


def reference(mask, ends, rewards, mode: str, w_step: float, gamma: float) -> torch.Tensor:
    """From the definition, with loops."""
    n = len(ends)
    r = [[float(rewards[i, e]) for e in ends[i]] for i in range(n)]
    total = [SCORES[i].item() + sum(r[i]) for i in range(n)]
    w = WEIGHTS.tolist()

    def stats(cells: list[tuple[float, float]]) -> tuple[float, float, float]:
        count = sum(wt for wt, _ in cells)
        mean = sum(wt * x for wt, x in cells) / count
        var = sum(wt * (x - mean) ** 2 for wt, x in cells) / max(count - 1, 1)
        return count, mean, math.sqrt(var)

    episode = []
    for i in range(n):
        count, mean, std = stats([(w[j], total[j]) for j in range(n) if GROUPS[j] == GROUPS[i]])
        a = total[i] - mean
        if mode == "mean_std_norm":
            a /= std + EPS
        episode.append(a if count > 1 + 1e-4 else 0.0)
    returns = []
    for i in range(n):
        rew = list(r[i])
        rew[-1] += SCORES[i].item()
        returns.append(
            [sum(gamma ** (j - k) * rew[j] for j in range(k, len(rew))) for k in range(len(rew))]
        )
    out = torch.zeros(n, WIDTH, dtype=torch.float64)
    for i in range(n):
        for k, end in enumerate(ends[i]):
            cells = [
                (w[j], returns[j][kk])
                for j in range(n)
                for kk in range(len(ends[j]))
                if GROUPS[j] == GROUPS[i] and KEYS[j][kk] == KEYS[i][k]
            ]
            count, mean, std = stats(cells)
            step = returns[i][k] - mean
            if mode == "mean_std_norm":
                step /= std + EPS
            step = step if count > 1 + 1e-4 else 0.0
            start = ends[i][k - 1] + 1 if k else 0
            for t in range(start, end + 1):
                if mask[i, t]:
                    out[i, t] = (episode[i] + w_step * step) * w[i]
    return out


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize(("w_step", "gamma"), [(1.0, 1.0), (0.5, 0.9), (0.0, 0.9)])
def test_gigpo_equals_the_definition(mode, w_step, gamma):
    mask, ends = layout(TURNS, WIDTH)
    rewards = turn_rewards(ends)
    token_rewards = torch.zeros(len(ends), WIDTH, dtype=torch.float64)
    for i, e in enumerate(ends):  # what the trainer passes: score on the last token + turns
        token_rewards[i, e[-1]] += SCORES[i]
    token_rewards = token_rewards + rewards
    got = compute_advantages(
        "gigpo", SCORES, mask, GROUPS, gamma=gamma, token_rewards=token_rewards,
        weights=WEIGHTS.float(), turns=TurnSteps(ends, KEYS, rewards),
        step_advantage_w=w_step, gigpo_mode=mode,
    )  # fmt: skip
    want = reference(mask, ends, rewards, mode, w_step, gamma)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    if w_step == 0:  # GRPO's advantages on the same outcome
        grpo = compute_advantages(
            "grpo", SCORES, mask, GROUPS, token_rewards=token_rewards, weights=WEIGHTS.float(),
            norm_by_std=mode == "mean_std_norm",
        )  # fmt: skip
        torch.testing.assert_close(got, grpo)


def test_a_turns_step_advantage_reaches_that_turns_sampled_tokens_only():
    # two samples; only their second turns share a state: the step term is on those tokens
    mask, ends = layout([[(0, 1), (4, 5)], [(0, 2), (5, 6)]], 8)
    keys = [["p", "x"], ["q", "x"]]
    rewards = torch.zeros(2, 8)
    steps = TurnSteps(ends, keys, rewards)
    scores = torch.tensor([1.0, 0.0])
    with_step = compute_advantages("gigpo", scores, mask, ["g", "g"], turns=steps)
    episode = compute_advantages(
        "gigpo", scores, mask, ["g", "g"], turns=steps, step_advantage_w=0.0
    )
    delta = with_step - episode
    second = torch.zeros(2, 8, dtype=torch.bool)
    second[0, 4:6] = second[1, 5:7] = True
    assert bool((delta[second] != 0).all())
    assert bool((delta[~second] == 0).all())
    assert bool((with_step[mask == 0] == 0).all())  # observation tokens get nothing


def test_anchor_keys_hash_what_each_turn_read_unless_a_tool_named_the_state():
    prompt = torch.tensor([5, 6, 7])
    # sample 0: turn, obs [40, 41], turn, obs [50], turn; sample 1: the same first obs
    responses = torch.tensor([[1, 2, 40, 41, 3, 4, 50, 9, 0], [8, 8, 40, 41, 3, 3, 51, 9, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 1, 1, 0, 1, 0]])
    ends = [[1, 5, 7], [1, 5, 7]]
    keys = anchor_keys([prompt, prompt], responses, mask, ends)
    assert keys[0][0] == keys[1][0]  # the same prompt
    assert keys[0][1] == keys[1][1]  # the same reply [40, 41], after different turns
    assert keys[0][2] != keys[1][2]  # [50] vs [51]
    other = anchor_keys([torch.tensor([5, 6, 8]), prompt], responses, mask, ends)
    assert other[0][0] != keys[0][0]
    named = anchor_keys([prompt, prompt], responses, mask, ends, [[None, "cell-3", None], []])
    assert named[0] == [keys[0][0], "state:cell-3", keys[0][2]]


def test_the_trainer_reads_turns_and_named_states_from_the_records():
    p, r = 3, 6
    ids = torch.tensor([[0, 5, 6, 1, 2, 40, 3, 4, 0], [7, 5, 6, 1, 1, 40, 3, 3, 0]])
    attn = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 0, 1, 1, 0]])
    batch = TrainBatch(
        input_ids=ids, attention_mask=attn, position_ids=attn.cumsum(1) - 1, response_mask=mask
    )
    assert batch.prompt_length == p and batch.response_length == r

    def record(state: str | None) -> SampleRecord:
        call = ToolCallRecord(
            name="move", arguments={}, ok=True, seconds=0.0, repaired=False, reward=None,
            turn=0, state_key=state,
        )  # fmt: skip
        return SampleRecord(turn_ends=[1, 4], calls=[call])

    rollout = SimpleNamespace(records=[record("room-2"), record(None)])
    steps = gigpo_steps(batch, rollout, None)
    assert steps.ends == [[1, 4], [1, 4]]
    assert steps.keys[0][1] == "state:room-2"
    assert steps.keys[1][1] != steps.keys[0][1] and not steps.keys[1][1].startswith("state:")
    assert steps.keys[0][0] != steps.keys[1][0]  # prompts [5, 6] and [7, 5, 6] differ
    # a state the user or the gateway named (record.turn_states) wins over the tool's
    named = [record("room-2"), record(None)]
    named[0].turn_states = ["start", "hall"]
    named[1].turn_states = [None, "hall"]
    keys = gigpo_steps(batch, SimpleNamespace(records=named), None).keys
    assert [keys[0], keys[1][1]] == [["state:start", "state:hall"], "state:hall"]
    assert keys[1][0] == steps.keys[1][0]  # None: the default key stays


def test_step_group_metrics_count_turns_in_shared_states():
    steps = TurnSteps([[1, 2], [1, 2], [1]], [["a", "x"], ["a", "y"], ["a"]])
    got = step_group_metrics(steps, ["g", "g", "g"])
    assert got == {"gigpo/step_group_share": 3 / 5, "gigpo/step_group_size_mean": 3.0}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.gigpo.mode=zscore"],
            "algorithm.gigpo.mode='zscore' is not supported; use one of mean_std_norm, mean_norm",
        ),
        (
            ["algorithm.gigpo.step_advantage_w=-1"],
            "algorithm.gigpo.step_advantage_w=-1.0 must be >= 0 (0: the episode advantage "
            "alone, GRPO's)",
        ),
        (
            ["algorithm.adv_estimator=gigpo", "algorithm.turn_credit.coef=0.5"],
            "algorithm.turn_credit.coef=0.5 and algorithm.adv_estimator=gigpo both credit turns "
            "(GiGPO's step term already reads the turn rewards): set algorithm.turn_credit.coef=0",
        ),
    ],
)
def test_bad_gigpo_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(Exception) as info:
        load_config(["actor_rollout_ref.model.path=tiny-qwen3", *overrides])
    assert message in str(info.value)


def test_gigpo_without_turns_says_what_it_needs():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError) as info:
        compute_advantages("gigpo", torch.tensor([1.0, 0.0]), mask, ["g", "g"])
    assert "algorithm.adv_estimator=gigpo needs each sample's turns" in str(info.value)
