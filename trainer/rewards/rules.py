"""Rule rewards: functions called the way verl calls them, by keyword,

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...,
                  **reward_kwargs) -> float | dict

loaded from a Python file, or the built-in scorer picked by ``data_source``:

- gsm8k (``openai/gsm8k``, or any name containing ``gsm8k``): strict by default, as verl's:
  in the response's last 300 characters, the answer is the last ``#### <number>`` (so an agent
  that revises its answer is scored by its last one) and a response without one scores 0;
  with ``method="flexible"`` the last number in those characters counts instead;
- math (a name containing ``math``, ``aime``, ``amc``, ``dapo``, ``numina``, ``deepscaler``
  or ``olympiad``): ``math-verify`` equivalence of the last ``\\boxed{}``/expression with the
  ground truth;
- QA (``nq``, ``triviaqa``, ``popqa``, ``hotpotqa``, ``2wikimultihopqa``, ``musique``,
  ``bamboogle``, each also with verl's ``searchR1_`` prefix): exact match, after
  normalisation, of the final answer (an ``<answer>...</answer>`` block, else the text after
  the last tool response) with the ground truth or any of a list of accepted answers.

Every built-in takes verl's gsm8k keywords: ``score`` for a right answer, ``format_score`` for
a wrong one in the expected form, 0 for none. Any other data_source has no built-in scorer:
``check_data_sources`` (``trainer.rewards.build``) refuses it at start-up.

This module imports no torch: process-pool workers import it to score.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from servers.user_code import load_object

__all__ = [
    "BATCH_KEYWORDS",
    "BUILTIN_SOURCES",
    "VERL_KEYWORDS",
    "RewardFn",
    "builtin_scorer",
    "check_reward_function",
    "default_compute_score",
    "describe_function",
    "exact_match_score",
    "gsm8k_score",
    "load_reward_function",
    "math_score",
]

RewardFn = Callable[..., Any]
"""Called by keyword, as verl does: ``fn(data_source=, solution_str=, ground_truth=,
extra_info=, **reward_kwargs)``."""

VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keywords of every per-sample call (verl's naive reward manager)."""
BATCH_KEYWORDS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
"""The keywords of the one call per batch (``reward_model.reward_manager=batch``)."""

BUILTIN_SOURCES = (
    "openai/gsm8k (or any name containing gsm8k), math (a name containing math, aime, amc, "
    "dapo, numina, deepscaler or olympiad, e.g. lighteval/MATH), QA exact match (nq, "
    "triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, also with a searchR1_ "
    "prefix)"
)
"""The data_sources the built-in scorers handle, as errors name them."""

GSM8K_METHODS = ("strict", "flexible")

_GSM8K = re.compile(r"#### (-?[0-9.,]+)")
"""verl's strict gsm8k answer: ``#### ``, one space, then digits, dots and commas, an optional
leading minus sign (``####5`` and ``#### $5`` have none)."""
_GSM8K_CLIP_CHARS = 300
"""verl reads only the last 300 characters of a response for a gsm8k answer."""
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_SPECIAL = re.compile(r"<\|[^|]*\|>|<tool_call>.*?</tool_call>", re.S)
_MATH_SOURCES = ("math", "aime", "amc", "dapo", "numina", "deepscaler", "olympiad")
_QA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def builtin_scorer(data_source: str | None) -> str | None:
    """``gsm8k``, ``math`` or ``qa``: the built-in scorer of ``data_source``; None when no
    built-in handles it."""
    source = str(data_source or "").lower()
    if not source:
        return None
    if "gsm8k" in source:
        return "gsm8k"
    if any(s in source for s in _MATH_SOURCES):
        return "math"
    if source.removeprefix("searchr1_") in _QA_SOURCES:
        return "qa"
    return None


def _normalise(text: str) -> str:
    return text.strip().replace(",", "").replace("$", "").rstrip(".").lower()


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


def gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer in the last 300 characters of ``solution_str``, as verl's
    ``extract_solution``: ``strict``: the number of the last ``#### <number>``, commas
    removed; ``flexible``: the last number; None when there is none."""
    tail = solution_str[-_GSM8K_CLIP_CHARS:]
    if method == "strict":
        marked = _GSM8K.findall(tail)
        return marked[-1].replace(",", "") if marked else None
    numbers_found = _NUMBER.findall(tail)
    return numbers_found[-1] if numbers_found else None


def gsm8k_score(
    solution_str: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` when the answer (``gsm8k_answer``) equals the ground truth, ``format_score``
    when it does not, 0 without an answer. ``strict`` compares as verl does: the answer, its
    commas removed and nothing else (``#### 42.`` is ``42.``), with the ground truth as a
    string; ``flexible`` drops commas, ``$`` and a final full stop from both first."""
    if method not in GSM8K_METHODS:
        raise ValueError(f"gsm8k method={method!r}: use strict or flexible")
    answer = gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    if method == "strict":
        right = answer == str(ground_truth)
    else:
        right = _normalise(answer) == _normalise(str(ground_truth))
    return float(score if right else format_score)


def exact_match_score(
    solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` when the final answer matches an accepted answer; ``format_score`` when it
    is an ``<answer>`` block that does not; else 0."""
    answer = _normalise_answer(final_answer(solution_str))
    if any(answer == _normalise_answer(g) for g in _accepted(ground_truth)):
        return float(score)
    return float(format_score) if _ANSWER.search(solution_str) else 0.0


def math_score(
    solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``math-verify``: ``score`` when the answer (last ``\\boxed{}`` or expression) equals the
    ground truth, ``format_score`` when one parses but differs, else 0. Its own signal-based
    timeouts are off (they only work on the main thread); the reward pool's timeout bounds
    the call."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    truth = str(_accepted(ground_truth)[0])
    gold = parse(
        truth if "$" in truth or "\\boxed" in truth else f"${truth}$", parsing_timeout=None
    )
    answer = parse(solution_str, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return float(score if verify(gold, answer, timeout_seconds=None) else format_score)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """The built-in scorer by ``data_source`` (see the module docstring). ``method`` only
    applies to gsm8k; ``format_score`` and ``score`` to all. A data_source no built-in handles
    raises ValueError (start-up refuses such rows first)."""
    kind = builtin_scorer(data_source)
    if kind == "gsm8k":
        return gsm8k_score(solution_str, ground_truth, method, format_score, score)
    if kind == "math":
        return math_score(solution_str, ground_truth, format_score, score)
    if kind == "qa":
        return exact_match_score(solution_str, ground_truth, format_score, score)
    raise ValueError(
        f"no built-in scorer for data_source={data_source!r}: set custom_reward_function.path, "
        f"or use a data_source with a built-in scorer: {BUILTIN_SOURCES}"
    )


def load_reward_function(path: str | None, name: str, key: str, field: str = "name") -> RewardFn:
    """The function ``name`` of the file (or module) ``path`` (None: the built-in scorer);
    errors name the config keys ``<key>.path`` and ``<key>.<field>`` (e.g.
    ``custom_reward_function.name``). The file runs anew on each call and is not registered
    as a module, so a function shipped to another process travels by value."""
    if not path:
        return default_compute_score
    return load_object(
        path, name, key=f"{key}.path", name_key=f"{key}.{field}", need_callable=True, cache=False
    )


def describe_function(path: str | None, name: str) -> str:
    return f"{path}:{name}" if path else "the built-in default_compute_score"


def check_reward_function(
    fn: RewardFn,
    describe: str,
    name: str,
    reward_kwargs: Mapping[str, Any],
    kwargs_key: str,
    *,
    batch: bool = False,
) -> None:
    """``fn`` can be called as verl calls it: by keyword with ``VERL_KEYWORDS`` (with
    ``BATCH_KEYWORDS`` when ``batch``) plus ``reward_kwargs`` (the config key
    ``kwargs_key``); else ValueError naming the signature to write."""
    keywords = BATCH_KEYWORDS if batch else VERL_KEYWORDS
    clash = [k for k in reward_kwargs if k in keywords]
    if clash:
        raise ValueError(
            f"{kwargs_key}.{clash[0]} repeats a keyword every reward call passes "
            f"({', '.join(keywords)}): remove it"
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a C callable): calls will tell
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    signature = f"def {name}({', '.join(keywords)}, **kwargs) -> " + (
        "list[float | dict]" if batch else "float | dict"
    )
    how = (
        "reward_model.reward_manager=batch calls it once per batch, by keyword with lists"
        if batch
        else "reward functions are called by keyword, as verl calls them"
    )
    missing = [k for k in keywords if k not in named and not takes_any]
    if missing:
        raise ValueError(
            f"{describe} cannot take the keyword{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}: {how}; define it as {signature}"
        )
    unknown = [k for k in reward_kwargs if k not in named and not takes_any]
    if unknown:
        others = [p.name for p in params if p.name in named and p.name not in keywords]
        takes = f" (its other parameters: {', '.join(others)})" if others else ""
        raise ValueError(
            f"{kwargs_key}.{unknown[0]} is passed to {describe} as a keyword, but it has no "
            f"parameter {unknown[0]!r}{takes}: remove the key, or add the parameter (or "
            "**kwargs) to the function"
        )
    unfilled = [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and (p.kind is p.POSITIONAL_ONLY or p.name not in (*keywords, *reward_kwargs))
    ]
    if unfilled:
        raise ValueError(
            f"{describe} has required parameters {unfilled} that a reward call cannot fill: "
            f"{how}; define it as {signature}, or give them defaults or values in {kwargs_key}"
        )
    if fn is default_compute_score:
        _check_builtin_kwargs(reward_kwargs, kwargs_key)


def _check_builtin_kwargs(reward_kwargs: Mapping[str, Any], kwargs_key: str) -> None:
    method = reward_kwargs.get("method", "strict")
    if method not in GSM8K_METHODS:
        raise ValueError(
            f"{kwargs_key}.method={method!r}: the built-in gsm8k scorer takes strict (the answer "
            "after '#### ') or flexible (the last number)"
        )
    for key in ("format_score", "score"):
        value = reward_kwargs.get(key, 0.0)
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
        ):
            raise ValueError(f"{kwargs_key}.{key}={value!r}: give a number")
