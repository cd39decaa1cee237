"""Rule rewards: the verl signature

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict

loaded from a Python file, or the built-in scorer picked by ``data_source``:

- gsm8k-style (``gsm8k`` in the source, or a ``#### answer`` in the text): the ``####``
  answer, else the last number, against the ground truth;
- math (``math``, ``aime``, ``amc``, ``dapo``, ``numina``, ``deepscaler``, ``olympiad``):
  ``math-verify`` equivalence of the last ``\\boxed{}``/expression with the ground truth;
- anything else (QA): exact match, after normalisation, of the final answer (an
  ``<answer>...</answer>`` block, else the text after the last tool response) with the
  ground truth or any of a list of accepted answers.

This module imports no torch: process-pool workers import it to score.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "RewardFn",
    "default_compute_score",
    "describe_function",
    "exact_match_score",
    "gsm8k_score",
    "load_reward_function",
    "math_score",
    "reward_keywords",
]

RewardFn = Callable[..., Any]
"""Called by keyword, as verl does: ``fn(data_source=, solution_str=, ground_truth=,
extra_info=)``."""

VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")

_GSM8K = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_SPECIAL = re.compile(r"<\|[^|]*\|>|<tool_call>.*?</tool_call>", re.S)
_MATH_SOURCES = ("math", "aime", "amc", "dapo", "numina", "deepscaler", "olympiad")


def _normalise(text: str) -> str:
    return text.strip().replace(",", "").rstrip(".").lower()


def _normalise_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style)."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def final_answer(solution_str: str) -> str:
    """The model's final answer: the last ``<answer>`` block, else what follows the last tool
    response with tool calls and special tokens removed."""
    tagged = _ANSWER.findall(solution_str)
    if tagged:
        return tagged[-1]
    answer = solution_str.rsplit("</tool_response>", 1)[-1]
    return _SPECIAL.sub("", answer)


def _accepted(ground_truth: Any) -> list[str]:
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target", ground_truth.get("answer", ""))
    if isinstance(ground_truth, (list, tuple)) or type(ground_truth).__name__ == "ndarray":
        return [str(g) for g in ground_truth]
    return [str(ground_truth)]


def gsm8k_score(solution_str: str, ground_truth: Any) -> float:
    truth = _normalise(str(ground_truth))
    found = _GSM8K.findall(solution_str) or _NUMBER.findall(solution_str)
    return 1.0 if found and _normalise(found[-1]) == truth else 0.0


def exact_match_score(solution_str: str, ground_truth: Any) -> float:
    answer = _normalise_answer(final_answer(solution_str))
    return 1.0 if any(answer == _normalise_answer(g) for g in _accepted(ground_truth)) else 0.0


def math_score(solution_str: str, ground_truth: Any) -> float:
    """``math-verify``: the answer (last ``\\boxed{}`` or expression) equals the ground truth.
    Its own signal-based timeouts are off (they only work on the main thread); the reward
    pool's timeout bounds the call."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    truth = str(_accepted(ground_truth)[0])
    gold = parse(
        truth if "$" in truth or "\\boxed" in truth else f"${truth}$", parsing_timeout=None
    )
    answer = parse(solution_str, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> float:
    """The built-in scorer, by ``data_source`` (see the module docstring)."""
    source = (data_source or "").lower()
    if "gsm8k" in source or _GSM8K.search(solution_str):
        return gsm8k_score(solution_str, ground_truth)
    if any(s in source for s in _MATH_SOURCES):
        return math_score(solution_str, ground_truth)
    return exact_match_score(solution_str, ground_truth)


def load_reward_function(path: str | None, name: str, key: str, field: str = "name") -> RewardFn:
    """The function ``name`` of the file ``path`` (None: the built-in scorer); errors name the
    config keys ``<key>.path`` and ``<key>.<field>`` (e.g. ``custom_reward_function.name``)."""
    if not path:
        return default_compute_score
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{key}.path={path!r} does not exist: point it at a .py file")
    spec = importlib.util.spec_from_file_location(f"agentloop_reward_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file; report what broke
        raise ValueError(f"{key}.path={path!r} failed to import: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{file} has no function {name!r}: set {key}.{field}")
    return fn


def describe_function(path: str | None, name: str) -> str:
    return f"{path}:{name}" if path else "the built-in default_compute_score"


def reward_keywords(fn: RewardFn, describe: str) -> tuple[str, ...]:
    """Which of the verl keywords ``fn`` takes: all four where it has ``**kwargs``, else the
    ones it names (in any order, so ``compute_score(solution_str, ground_truth)`` works). A
    required parameter with another name cannot be filled: that is an error naming it."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return VERL_KEYWORDS
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [
        p.name
        for p in params
        if p.default is p.empty
        and (p.kind is p.POSITIONAL_ONLY or p.name not in VERL_KEYWORDS)
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if unknown:
        raise ValueError(
            f"{describe} has required parameters {unknown} that a reward call cannot fill: "
            f"reward functions are called by keyword with {', '.join(VERL_KEYWORDS)} "
            "(the verl signature); rename them or give them defaults"
        )
    return tuple(k for k in VERL_KEYWORDS if k in names)
