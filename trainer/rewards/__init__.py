"""Rewards of a rollout batch: rules, a judge model on its own servers, tool-verified, and
their weighted sum (see ``trainer.rewards.manager``).

Names are imported on first use, so a reward process-pool worker that imports
``trainer.rewards.rules`` loads no torch, tokenizer or server code.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "build_rewards": "build",
    "check_data_sources": "build",
    "check_rewards": "build",
    "unscored_sources": "build",
    "JudgeReward": "judge",
    "JudgeUnavailableError": "judge",
    "parse_judge_score": "judge",
    "RewardManager": "manager",
    "RewardOutput": "manager",
    "BatchRuleReward": "rule_reward",
    "RuleReward": "rule_reward",
    "process_rewards": "turn_rewards",
    "samples_of": "manager",
    "CallPool": "pool",
    "BUILTIN_SOURCES": "rules",
    "builtin_scorer": "rules",
    "check_reward_function": "rules",
    "default_compute_score": "rules",
    "exact_match_score": "rules",
    "gsm8k_score": "rules",
    "load_reward_function": "rules",
    "math_score": "rules",
    "RewardFunctionError": "types",
    "RewardSample": "types",
    "as_score": "types",
    "ToolBox": "verify",
    "VerifyReward": "verify",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trainer.rewards.{module}"), name)
