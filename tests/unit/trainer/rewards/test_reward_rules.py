"""The built-in rule scorers (gsm8k strict/flexible, QA exact match, math-verify), which
data_sources they handle, loading user reward files, and the keyword-call contract (verl's),
each bad input with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.rewards import (
    BUILTIN_SOURCES,
    builtin_scorer,
    default_compute_score,
    load_reward_function,
)
from trainer.rewards.rules import check_reward_function


@pytest.mark.parametrize(
    ("source", "solution", "truth", "expected"),
    [
        ("openai/gsm8k", "6 x 7 = 42.\n#### 42", "42", 1.0),
        ("openai/gsm8k", "#### 1,234", "1234", 1.0),
        ("openai/gsm8k", "#### $42", "42", 0.0),  # verl's pattern takes no '$': no answer
        ("openai/gsm8k", "####42", "42", 0.0),  # nor a missing space
        ("openai/gsm8k", "#### 42.", "42", 0.0),  # only commas go: '42.' is not '42'
        ("openai/gsm8k", "#### 41", "42", 0.0),
        ("openai/gsm8k", "#### 42 then #### 41", "42", 0.0),  # the last marked answer, as verl
        ("openai/gsm8k", "#### 41 then #### 42", "42", 1.0),
        ("openai/gsm8k", "first try #### 3. wait, recheck. #### 5", "5", 1.0),
        ("openai/gsm8k", "first 7, then 6 x 7 = 42", "42", 0.0),  # no '####': no answer
        ("openai/gsm8k", "no number at all", "42", 0.0),
        ("gsm8k", "the answer: #### -3.5", "-3.5", 1.0),
    ],
)
def test_gsm8k_is_strict_the_answer_must_follow_the_marker(source, solution, truth, expected):
    assert default_compute_score(source, solution, truth, None) == expected


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("first 7, then 6 x 7 = 42", 1.0),  # the last number
        ("42 is not it, it is 41", 0.0),
        ("#### 42 or rather 41", 0.0),
        ("no number at all", 0.0),
    ],
)
def test_gsm8k_flexible_reads_the_last_number(solution, expected):
    assert default_compute_score("openai/gsm8k", solution, "42", {}, method="flexible") == expected


def test_gsm8k_reads_only_the_last_300_characters_as_verl():
    padding = " and so on" * 30  # 300 characters
    assert default_compute_score("openai/gsm8k", "#### 42" + padding, "42", None) == 0.0
    assert default_compute_score("openai/gsm8k", "#### 42" + padding[:-7], "42", None) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 41 " + "#### 42" + padding[:-7], "42") == 1.0
    flexible = default_compute_score("openai/gsm8k", "42" + padding, "42", None, method="flexible")
    assert flexible == 0.0  # verl clips the flexible read too


def test_gsm8k_marks_a_format_score_on_verls_answers_only():
    def gsm8k(text: str) -> float:
        return default_compute_score("openai/gsm8k", text, "42", {}, format_score=0.1)

    # '####5': no answer, 0; '#### 42.': an answer that is not the ground truth, format_score
    assert (gsm8k("####5"), gsm8k("#### $42"), gsm8k("#### 42."), gsm8k("#### 4,2")) == (
        0.0,
        0.0,
        0.1,
        1.0,
    )


def test_gsm8k_format_score_and_score_are_verls():
    def gsm8k(text: str) -> float:
        return default_compute_score("openai/gsm8k", text, "42", {}, format_score=0.1, score=2.0)

    assert (gsm8k("#### 42"), gsm8k("#### 41"), gsm8k("42")) == (2.0, 0.1, 0.0)


def test_qa_and_math_take_format_score_and_score_too():
    def qa(text: str) -> float:
        return default_compute_score("nq", text, "Paris", {}, format_score=0.1, score=2.0)

    assert (qa("<answer>Paris</answer>"), qa("<answer>Lyon</answer>"), qa("Lyon")) == (
        2.0,
        0.1,
        0.0,
    )
    math = default_compute_score("math", "\\boxed{3}", "4", {}, format_score=0.1, score=2.0)
    assert math == 0.1


@pytest.mark.parametrize(
    ("source", "scorer"),
    [
        ("openai/gsm8k", "gsm8k"),
        ("GSM8K-tool", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("aime_2024", "math"),
        ("numina_olympiads", "math"),
        ("hotpotqa", "qa"),
        ("searchR1_nq", "qa"),
        ("calculator", None),
        ("toy", None),
        ("nqa", None),
        ("", None),
        (None, None),
    ],
)
def test_which_data_sources_have_a_built_in_scorer(source, scorer):
    assert builtin_scorer(source) == scorer


def test_a_data_source_without_a_built_in_scorer_raises_naming_both_fixes():
    with pytest.raises(ValueError) as err:
        default_compute_score("toy", "42", "42", {})
    assert str(err.value) == (
        "no built-in scorer for data_source='toy': set custom_reward_function.path, or use a "
        f"data_source with a built-in scorer: {BUILTIN_SOURCES}"
    )
    assert BUILTIN_SOURCES == (
        "openai/gsm8k (or any name containing gsm8k), math (a name containing math, aime, amc, "
        "dapo, numina, deepscaler or olympiad, e.g. lighteval/MATH), QA exact match (nq, "
        "triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, also with a searchR1_ "
        "prefix)"
    )


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
        f"custom_reward_function.path={missing!r}: there is no file {missing!r}; point it at an "
        "existing .py file (a relative path starts at the working directory)"
    )


def test_missing_function_name_is_a_clear_error(tmp_path):
    path = write(tmp_path / "reward.py", "def compute_score(*args):\n    return 1.0\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(path, "score_it", "reward_model.rules[0]", "function")
    assert str(err.value) == (
        f"reward_model.rules[0].path={path!r}, reward_model.rules[0].function='score_it': file "
        f"{path!r} defines no 'score_it'; define it there or set reward_model.rules[0].function "
        "to a name it defines"
    )


def test_a_file_that_fails_to_import_is_a_clear_error(tmp_path):
    path = write(tmp_path / "broken.py", "import not_a_module_anywhere_xyz\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(path, "compute_score", "custom_reward_function")
    assert str(err.value) == (
        f"custom_reward_function.path={path!r}: importing file {path!r} raised "
        "ModuleNotFoundError: No module named 'not_a_module_anywhere_xyz'; install the package "
        "that provides 'not_a_module_anywhere_xyz' or put its folder on PYTHONPATH"
    )


# --- keyword calls (verl calls compute_score(data_source=..., solution_str=..., ...)) ------

EXPECTED = "data_source, solution_str, ground_truth, extra_info, **kwargs) -> float | dict"


def check(fn, reward_kwargs=None, *, batch: bool = False) -> None:
    check_reward_function(
        fn, "r.py:f", "f", reward_kwargs or {}, "custom_reward_function.reward_kwargs", batch=batch
    )


def test_functions_that_take_verls_keywords_in_any_order_or_kwargs_pass():
    def reordered(ground_truth, extra_info, solution_str, data_source):
        return 0.0

    def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None, method="x"):
        return 0.0

    def anything(**kwargs):
        return 0.0

    for fn in (reordered, keyword_only, anything):
        check(fn)
    check(keyword_only, {"method": "flexible"})
    check(anything, {"whatever": 1})


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            lambda solution_str, ground_truth: 0.0,  # verl's gsm8k.compute_score shape
            "r.py:f cannot take the keywords data_source, extra_info: reward functions are "
            f"called by keyword, as verl calls them; define it as def f({EXPECTED}",
        ),
        (
            lambda *args: 0.0,
            "r.py:f cannot take the keywords data_source, solution_str, ground_truth, "
            "extra_info: reward functions are called by keyword, as verl calls them; define it "
            f"as def f({EXPECTED}",
        ),
        (
            lambda data_source, solution_str, ground_truth, extra_info, /: 0.0,
            "r.py:f cannot take the keywords data_source, solution_str, ground_truth, "
            "extra_info: reward functions are called by keyword, as verl calls them; define it "
            f"as def f({EXPECTED}",
        ),
        (
            lambda data_source, solution_str, ground_truth, extra_info, scale: 0.0,
            "r.py:f has required parameters ['scale'] that a reward call cannot fill: reward "
            f"functions are called by keyword, as verl calls them; define it as def f({EXPECTED}"
            ", or give them defaults or values in custom_reward_function.reward_kwargs",
        ),
    ],
    ids=["a_subset", "positional_varargs", "positional_only", "an_extra_required"],
)
def test_a_function_that_cannot_take_the_keywords_is_an_error_naming_the_signature(fn, message):
    with pytest.raises(ValueError) as err:
        check(fn)
    assert str(err.value) == message


def test_reward_kwargs_fill_extra_parameters_and_unknown_ones_are_errors():
    def scaled(data_source, solution_str, ground_truth, extra_info, scale, bonus=0.0):
        return 0.0

    check(scaled, {"scale": 2.0})
    with pytest.raises(ValueError) as err:
        check(scaled, {"scale": 2.0, "sclae": 3.0})
    assert str(err.value) == (
        "custom_reward_function.reward_kwargs.sclae is passed to r.py:f as a keyword, but it "
        "has no parameter 'sclae' (its other parameters: scale, bonus): remove the key, or add "
        "the parameter (or **kwargs) to the function"
    )
    with pytest.raises(ValueError) as err:
        check(scaled, {"scale": 2.0, "ground_truth": "x"})
    assert str(err.value) == (
        "custom_reward_function.reward_kwargs.ground_truth repeats a keyword every reward call "
        "passes (data_source, solution_str, ground_truth, extra_info): remove it"
    )


def test_batch_functions_take_the_plural_keywords():
    def batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        return []

    check(batch, batch=True)
    with pytest.raises(ValueError) as err:
        check(lambda data_source, solution_str, ground_truth, extra_info: 0.0, batch=True)
    assert str(err.value) == (
        "r.py:f cannot take the keywords data_sources, solution_strs, ground_truths, "
        "extra_infos: reward_model.reward_manager=batch calls it once per batch, by keyword "
        "with lists; define it as def f(data_sources, solution_strs, ground_truths, "
        "extra_infos, **kwargs) -> list[float | dict]"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"method": "fuzzy"},
            "custom_reward_function.reward_kwargs.method='fuzzy': the built-in gsm8k scorer "
            "takes strict (the answer after '#### ') or flexible (the last number)",
        ),
        ({"score": "high"}, "custom_reward_function.reward_kwargs.score='high': give a number"),
        (
            {"sandbox_fusion_url": "http://x"},
            "custom_reward_function.reward_kwargs.sandbox_fusion_url is passed to the built-in "
            "default_compute_score as a keyword, but it has no parameter 'sandbox_fusion_url' "
            "(its other parameters: method, format_score, score): remove the key, or add the "
            "parameter (or **kwargs) to the function",
        ),
    ],
)
def test_the_built_in_takes_method_format_score_and_score_only(kwargs, message):
    check_reward_function(
        default_compute_score,
        "the built-in default_compute_score",
        "compute_score",
        {"method": "flexible", "format_score": 0.1, "score": 1},
        "custom_reward_function.reward_kwargs",
    )
    with pytest.raises(ValueError) as err:
        check_reward_function(
            default_compute_score,
            "the built-in default_compute_score",
            "compute_score",
            kwargs,
            "custom_reward_function.reward_kwargs",
        )
    assert str(err.value) == message
