"""The rule reward path as a verl user meets it: the config composed from ppo_trainer.yaml
with verl-style overrides, a ``RewardManager`` on a real collated batch (real tokenizer), the
function loaded from a file and run in threads or in spawned worker processes.

- functions are called by keyword, with ``custom_reward_function.reward_kwargs`` as extra
  keywords; a dict result's ``score`` counts and its other numeric keys are logged;
- the built-in gsm8k scorer is strict (``#### <answer>``), flexible on request;
- ``reward_model.reward_manager=batch`` calls the function once with lists; ``prime`` runs
  per sample in the process pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.unit.trainer.rewards.batch import make_batch
from trainer.config import load_config
from trainer.rewards import RewardFunctionError, RewardManager

EXECUTORS = ["thread", "process"]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def manager_from(tokenizer: Any, *overrides: str) -> RewardManager:
    """A manager built from ppo_trainer.yaml plus ``overrides`` (two workers)."""
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "data.train_files=/unused.jsonl",
            "custom_reward_function.num_workers=2",
            *overrides,
        ]
    )
    return RewardManager(config.custom_reward_function, config.reward_model, tokenizer)


def scored(manager: RewardManager, batch: Any) -> tuple[list[float], dict[str, float]]:
    try:
        out = manager.score(batch)
    finally:
        manager.close()
    return out.scores.tolist(), out.metrics


def write(path: Path, source: str) -> str:
    path.write_text(source)
    return str(path)


KEYWORD_REWARD = '''
def compute_score(*, solution_str, ground_truth, data_source, extra_info, scale, bonus=0.0):
    """Keyword-only: any positional call would fail."""
    right = solution_str.strip() == ground_truth and data_source == "mine"
    return {"score": scale * right + bonus, "index": float(extra_info["index"]), "tag": "x"}
'''


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_file_function_is_called_by_keyword_with_the_reward_kwargs(tmp_path, tokenizer, executor):
    path = write(tmp_path / "reward.py", KEYWORD_REWARD)
    manager = manager_from(
        tokenizer,
        f"custom_reward_function.path={path}",
        f"custom_reward_function.executor={executor}",
        "+custom_reward_function.reward_kwargs.scale=2.0",
        "+custom_reward_function.reward_kwargs.bonus=0.25",
    )
    batch = make_batch(tokenizer, ["42", "41", "42"], data_source="mine")
    scores, metrics = scored(manager, batch)
    assert scores == [2.25, 0.25, 2.25]
    assert metrics["reward/errors"] == 0.0
    assert metrics["reward/rule/index"] == pytest.approx(1.0)  # numeric keys are logged
    assert "reward/rule/tag" not in metrics


RESPONSES = ["so 6 x 7 = 42\n#### 42", "6 x 7 = 42", "#### 41", "no answer"]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ([], [1.0, 0.0, 0.0, 0.0]),  # strict: only an answer after '####' counts
        (["+custom_reward_function.reward_kwargs.method=flexible"], [1.0, 1.0, 0.0, 0.0]),
        (
            [
                "+custom_reward_function.reward_kwargs.format_score=0.1",
                "+custom_reward_function.reward_kwargs.score=2",
            ],
            [2.0, 0.0, 0.1, 0.0],
        ),
    ],
    ids=["strict", "flexible", "format_score"],
)
def test_the_built_in_gsm8k_scorer_is_strict_unless_asked(tokenizer, executor, kwargs, expected):
    manager = manager_from(tokenizer, f"custom_reward_function.executor={executor}", *kwargs)
    batch = make_batch(tokenizer, RESPONSES, data_source="openai/gsm8k")
    scores, metrics = scored(manager, batch)
    assert scores == pytest.approx(expected)
    assert metrics["reward/errors"] == 0.0


BATCH_REWARD = """
CALLS = []
def compute_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
    CALLS.append(len(solution_strs))
    if "boom" in solution_strs:
        raise RuntimeError("scorer crashed")
    if "short" in solution_strs:
        return [1.0]
    if "one" in solution_strs:
        return 1.0
    return [
        {"score": scale * (s.strip() == t), "acc": float(s.strip() == t)}
        for s, t in zip(solution_strs, ground_truths)
    ]
"""


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_batch_manager_calls_the_function_once_with_lists(tmp_path, tokenizer, executor):
    path = write(tmp_path / "batch_reward.py", BATCH_REWARD)
    overrides = [
        f"custom_reward_function.path={path}",
        f"custom_reward_function.executor={executor}",
        "reward_model.reward_manager=batch",
        "+custom_reward_function.reward_kwargs.scale=3.0",
    ]
    manager = manager_from(tokenizer, *overrides)
    if executor == "thread":
        calls = manager.components[0].pool.fn.__globals__["CALLS"]
    scores, metrics = scored(manager, make_batch(tokenizer, ["42", "41", "42"]))
    assert scores == [3.0, 0.0, 3.0]
    assert metrics["reward/rule/acc"] == pytest.approx(2 / 3)
    if executor == "thread":
        assert calls == [3]  # one call for the whole batch

    scores, metrics = scored(
        manager_from(tokenizer, *overrides), make_batch(tokenizer, ["boom"] * 2)
    )
    assert scores == [0.0, 0.0] and metrics["reward/errors"] == 2.0  # the step goes on

    with pytest.raises(RewardFunctionError) as err:
        scored(manager_from(tokenizer, *overrides), make_batch(tokenizer, ["short", "x"]))
    assert str(err.value) == (
        f"{path}:compute_score returned a list of 1 for a batch of 2 samples; with "
        "reward_model.reward_manager=batch it must return a list of 2 scores (numbers or dicts "
        "with a numeric 'score'), one per sample in order"
    )
    with pytest.raises(RewardFunctionError) as err:
        scored(manager_from(tokenizer, *overrides), make_batch(tokenizer, ["one", "x"]))
    assert str(err.value).startswith(
        f"{path}:compute_score returned 1.0 (float) for a batch of 2 samples; "
    )


def test_prime_scores_each_sample_in_the_process_pool(tokenizer):
    manager = manager_from(tokenizer, "reward_model.reward_manager=prime")
    assert manager.components[0].pool.kind == "process"
    scores, _ = scored(manager, make_batch(tokenizer, RESPONSES, data_source="openai/gsm8k"))
    assert scores == [1.0, 0.0, 0.0, 0.0]
