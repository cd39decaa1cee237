"""Outcome rewards: the built-in scorer, user reward files, and a scorer that survives bad
reward functions (errors, NaN, timeouts score 0 and are counted) while running them in
parallel threads."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from agentloop.base import AgentLoopOutput
from agentloop.batch import RolloutBatch, collate
from trainer.config.run import RewardFunctionConfig
from trainer.reward import RewardScorer, default_compute_score, load_reward_function


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def make_batch(
    tokenizer: Any,
    responses: list[str],
    truths: list[str] | None = None,
    reward_scores: list[float | None] | None = None,
    data_source: str = "gsm8k",
) -> RolloutBatch:
    """A collated rollout batch whose i-th response decodes to ``responses[i]``."""
    truths = truths or ["42"] * len(responses)
    reward_scores = reward_scores or [None] * len(responses)
    outputs, rows = [], []
    for i, (text, truth, preset) in enumerate(zip(responses, truths, reward_scores, strict=True)):
        prompt = tokenizer.encode("What is 6 x 7?")
        response = tokenizer.encode(text)
        outputs.append(
            AgentLoopOutput(
                prompt_ids=prompt,
                response_ids=response,
                response_mask=[1] * len(response),
                response_log_probs=[0.0] * len(response),
                num_turns=2,
                reward_score=preset,
                extra={"tool_calls": 1, "tool_rewards": {"calc": 0.5}},
            )
        )
        rows.append(
            {
                "uid": f"u{i}",
                "agent_name": "tool_agent",
                "data_source": data_source,
                "reward_model": {"ground_truth": truth},
                "extra_info": {"index": i},
            }
        )
    return collate(outputs, rows, prompt_length=16, response_length=32, pad_token_id=0)


def scorer_with(fn, tokenizer: Any, **config: Any) -> RewardScorer:
    """A scorer running ``fn`` (the built-in one is loaded, then replaced by the fake)."""
    scorer = RewardScorer(RewardFunctionConfig(**config), tokenizer)
    scorer.fn = fn
    return scorer


# --- the built-in scorer ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "solution", "truth", "expected"),
    [
        ("openai/gsm8k", "6 x 7 = 42.\n#### 42", "42", 1.0),
        ("openai/gsm8k", "#### 1,234", "1234", 1.0),
        ("openai/gsm8k", "#### 41", "42", 0.0),
        ("openai/gsm8k", "first 7, then 6 x 7 = 42", "42", 1.0),  # last number fallback
        ("openai/gsm8k", "42 is not it, it is 41", "42", 0.0),
        ("openai/gsm8k", "no number at all", "42", 0.0),
        ("other", "the answer: #### -3.5", "-3.5", 1.0),  # '####' marks a gsm8k-style answer
    ],
)
def test_default_scorer_reads_the_gsm8k_answer_or_the_last_number(
    source, solution, truth, expected
):
    assert default_compute_score(source, solution, truth, None) == expected


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("<tool_call>{}</tool_call><tool_response>42</tool_response>Paris", 1.0),
        ("<tool_response>Paris</tool_response> paris. ", 1.0),  # case, space, final dot
        ("<tool_response>Paris</tool_response>Lyon", 0.0),  # the tool said it, not the model
        ('Paris<tool_call>{"name": "x"}</tool_call><|im_end|>', 1.0),
        ("It is Paris", 0.0),
    ],
)
def test_default_scorer_matches_the_text_after_the_last_tool_response(solution, expected):
    assert default_compute_score("trivia", solution, "Paris", {}) == expected


# --- loading a reward function ---------------------------------------------------------


def write(path: Path, source: str) -> str:
    path.write_text(source)
    return str(path)


def test_no_path_loads_the_default_scorer():
    assert load_reward_function(RewardFunctionConfig()) is default_compute_score


def test_custom_function_from_a_file_scores_and_sees_row_and_rollout_fields(tmp_path, tokenizer):
    path = write(
        tmp_path / "my_reward.py",
        "SEEN = []\n"
        "def judge(data_source, solution_str, ground_truth, extra_info):\n"
        "    SEEN.append((data_source, ground_truth, extra_info))\n"
        "    return float(solution_str.strip() == ground_truth)\n",
    )
    scorer = RewardScorer(RewardFunctionConfig(path=path, name="judge"), tokenizer)
    try:
        scores, metrics = scorer.score(make_batch(tokenizer, ["42", "41"], data_source="mine"))
    finally:
        scorer.close()
    assert scores.tolist() == [1.0, 0.0]
    assert metrics["reward/mean"] == 0.5 and metrics["reward/errors"] == 0.0
    seen = scorer.fn.__globals__["SEEN"]
    assert sorted(s[2]["index"] for s in seen) == [0, 1]
    source, truth, info = seen[0]
    assert source == "mine" and truth == "42"
    assert info["tool_rewards"] == {"calc": 0.5}
    assert info["tool_calls"] == 1 and info["num_turns"] == 2


def test_missing_path_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ValueError) as err:
        load_reward_function(RewardFunctionConfig(path=missing))
    assert str(err.value) == (
        f"custom_reward_function.path={missing!r} does not exist: point it at a .py file"
    )


def test_missing_function_name_is_a_clear_error(tmp_path):
    path = write(tmp_path / "reward.py", "def compute_score(*args):\n    return 1.0\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(RewardFunctionConfig(path=path, name="score_it"))
    assert str(err.value) == (
        f"{tmp_path / 'reward.py'} has no function 'score_it': set custom_reward_function.name"
    )


def test_a_file_that_fails_to_import_is_a_clear_error(tmp_path):
    path = write(tmp_path / "broken.py", "import not_a_module_anywhere_xyz\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(RewardFunctionConfig(path=path))
    assert str(err.value) == (
        f"custom_reward_function.path={path!r} failed to import: "
        "No module named 'not_a_module_anywhere_xyz'"
    )


# --- scoring a batch ---------------------------------------------------------------------


def test_a_dict_result_uses_score_and_logs_the_other_keys(tokenizer):
    def fn(source, text, truth, info):
        return {"score": 2.0 * info["index"], "acc": float(info["index"] == 0), "note": "x"}

    scorer = scorer_with(fn, tokenizer)
    scores, metrics = scorer.score(make_batch(tokenizer, ["a", "b", "c"]))
    scorer.close()
    assert scores.tolist() == [0.0, 2.0, 4.0]
    assert metrics["reward/acc"] == pytest.approx(1 / 3)
    assert "reward/note" not in metrics and "reward/score" not in metrics
    assert metrics["reward/max"] == 4.0 and metrics["reward/min"] == 0.0


def test_a_raising_function_scores_zero_and_counts_an_error_without_stopping(tokenizer):
    def fn(source, text, truth, info):
        if info["index"] == 1:
            raise RuntimeError("judge crashed")
        return 1.0

    scorer = scorer_with(fn, tokenizer)
    scores, metrics = scorer.score(make_batch(tokenizer, ["a", "b", "c"]))
    scorer.close()
    assert scores.tolist() == [1.0, 0.0, 1.0]
    assert metrics["reward/errors"] == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", None, [1.0], {"score": math.nan}])
def test_nan_or_a_non_number_scores_zero_and_counts_an_error(tokenizer, bad):
    def fn(source, text, truth, info):
        return bad if info["index"] == 0 else 0.5

    scorer = scorer_with(fn, tokenizer)
    scores, metrics = scorer.score(make_batch(tokenizer, ["a", "b"]))
    scorer.close()
    assert scores.tolist() == [0.0, 0.5]
    assert metrics["reward/errors"] == 1.0


@pytest.mark.parametrize("value", [np.float32(1.0), np.int64(1), np.bool_(True)])
def test_numpy_scalar_results_are_numbers(tokenizer, value):
    scorer = scorer_with(lambda *args: value, tokenizer)
    scores, metrics = scorer.score(make_batch(tokenizer, ["a"]))
    scorer.close()
    assert scores.tolist() == [1.0]
    assert metrics["reward/errors"] == 0.0


def test_a_timed_out_function_scores_zero_and_counts_an_error(tokenizer):
    release = threading.Event()

    def fn(source, text, truth, info):
        if info["index"] == 0:
            release.wait(10)  # hangs until the test lets it go
        return 1.0

    scorer = scorer_with(fn, tokenizer, timeout_s=0.2, num_workers=2)
    start = time.perf_counter()
    try:
        scores, metrics = scorer.score(make_batch(tokenizer, ["a", "b"]))
    finally:
        release.set()
        scorer.close()
    assert time.perf_counter() - start < 2.0
    assert scores.tolist() == [0.0, 1.0]
    assert metrics["reward/errors"] == 1.0


def test_slow_scorers_run_in_parallel_threads(tokenizer):
    n = 8

    def fn(source, text, truth, info):
        time.sleep(0.3)
        return 1.0

    scorer = scorer_with(fn, tokenizer, num_workers=n)
    start = time.perf_counter()
    scores, metrics = scorer.score(make_batch(tokenizer, ["a"] * n))
    elapsed = time.perf_counter() - start
    scorer.close()
    assert scores.tolist() == [1.0] * n and metrics["reward/errors"] == 0.0
    assert elapsed < 0.3 * n / 2


def test_the_timeout_counts_the_call_not_the_wait_for_a_free_thread(tokenizer):
    def fn(source, text, truth, info):
        time.sleep(0.3)  # each call is well inside its 0.5 s budget
        return 1.0

    scorer = scorer_with(fn, tokenizer, timeout_s=0.5, num_workers=1)
    scores, metrics = scorer.score(make_batch(tokenizer, ["a", "b", "c"]))
    scorer.close()
    assert scores.tolist() == [1.0, 1.0, 1.0]
    assert metrics["reward/errors"] == 0.0


def test_a_score_set_by_the_agent_loop_is_kept(tokenizer):
    def fn(source, text, truth, info):
        if info["index"] == 0:
            raise RuntimeError("not consulted for a preset score")
        return 0.25

    scorer = scorer_with(fn, tokenizer)
    batch = make_batch(tokenizer, ["a", "b"], reward_scores=[0.75, None])
    scores, metrics = scorer.score(batch)
    scorer.close()
    assert scores.tolist() == [0.75, 0.25]
    assert metrics["reward/errors"] == 0.0


def test_the_scorer_sees_the_decoded_response_without_special_tokens(tokenizer):
    seen: list[str] = []

    def fn(source, text, truth, info):
        seen.append(text)
        return default_compute_score(source, text, truth, info)

    scorer = scorer_with(fn, tokenizer)
    text = "<tool_response>41</tool_response>#### 42<|im_end|>"
    scores, _ = scorer.score(make_batch(tokenizer, [text]))
    scorer.close()
    assert seen == ["<tool_response>41</tool_response>#### 42"]
    assert scores.tolist() == [1.0]
