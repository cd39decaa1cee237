"""The built-in rule scorers (gsm8k, QA exact match, math-verify) and loading user reward
files with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.rewards import default_compute_score, load_reward_function
from trainer.rewards.rules import VERL_KEYWORDS, reward_keywords


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
def test_gsm8k_reads_the_marked_answer_or_the_last_number(source, solution, truth, expected):
    assert default_compute_score(source, solution, truth, None) == expected


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("<tool_call>{}</tool_call><tool_response>42</tool_response>Paris", "Paris", 1.0),
        ("<tool_response>Paris</tool_response> paris. ", "Paris", 1.0),  # case, space, dot
        ("<tool_response>Paris</tool_response>Lyon", "Paris", 0.0),  # the tool said it
        ('Paris<tool_call>{"name": "x"}</tool_call><|im_end|>', "Paris", 1.0),
        ("It is Paris", "Paris", 0.0),
        ("I think <answer>The Eiffel Tower</answer>", "eiffel tower", 1.0),  # articles dropped
        ("<answer>NYC</answer>", ["New York City", "NYC"], 1.0),  # any accepted answer
        ("<answer>Boston</answer>", {"target": ["New York City", "NYC"]}, 0.0),
    ],
)
def test_qa_exact_match_of_the_final_answer(solution, truth, expected):
    assert default_compute_score("hotpotqa", solution, truth, {}) == expected


@pytest.mark.parametrize(
    ("source", "solution", "truth", "expected"),
    [
        ("lighteval/MATH", "so the answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("math_dapo", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("aime", "The total is \\boxed{123}.", "124", 0.0),
        ("math", "I cannot solve this.", "3", 0.0),
    ],
)
def test_math_sources_use_math_verify_equivalence(source, solution, truth, expected):
    assert default_compute_score(source, solution, truth, None) == expected


def write(path: Path, source: str) -> str:
    path.write_text(source)
    return str(path)


def test_no_path_loads_the_built_in_scorer():
    assert load_reward_function(None, "compute_score", "custom_reward_function") is (
        default_compute_score
    )


def test_missing_path_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ValueError) as err:
        load_reward_function(missing, "compute_score", "custom_reward_function")
    assert str(err.value) == (
        f"custom_reward_function.path={missing!r} does not exist: point it at a .py file"
    )


def test_missing_function_name_is_a_clear_error(tmp_path):
    path = write(tmp_path / "reward.py", "def compute_score(*args):\n    return 1.0\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(path, "score_it", "reward_model.rules[0]", "function")
    assert str(err.value) == (
        f"{tmp_path / 'reward.py'} has no function 'score_it': set reward_model.rules[0].function"
    )


def test_a_file_that_fails_to_import_is_a_clear_error(tmp_path):
    path = write(tmp_path / "broken.py", "import not_a_module_anywhere_xyz\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(path, "compute_score", "custom_reward_function")
    assert str(err.value) == (
        f"custom_reward_function.path={path!r} failed to import: "
        "No module named 'not_a_module_anywhere_xyz'"
    )


# --- keyword calls (verl calls compute_score(data_source=..., solution_str=..., ...)) ------


def test_keywords_are_the_verl_names_a_function_takes_in_any_order():
    def reordered(ground_truth, extra_info, solution_str, data_source):
        return 0.0

    def two(solution_str, ground_truth, method="strict"):
        return 0.0

    def anything(**kwargs):
        return 0.0

    assert reward_keywords(reordered, "r.py:f") == (
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
    )
    assert reward_keywords(two, "r.py:f") == ("solution_str", "ground_truth")
    assert reward_keywords(anything, "r.py:f") == VERL_KEYWORDS


def test_a_required_parameter_a_call_cannot_fill_is_a_clear_error():
    def positional(source, text, truth, info):
        return 0.0

    with pytest.raises(ValueError) as err:
        reward_keywords(positional, "r.py:f")
    assert str(err.value) == (
        "r.py:f has required parameters ['source', 'text', 'truth', 'info'] that a reward "
        "call cannot fill: reward functions are called by keyword with data_source, "
        "solution_str, ground_truth, extra_info (the verl signature); rename them or give "
        "them defaults"
    )
