"""Start-up of the rewards a training config asks for: checks first (before any server
starts), then the judge servers, the verify tools and the ``RewardManager``."""

from __future__ import annotations

from typing import Any

from servers import stop_servers
from trainer.config.schema import Config
from trainer.launch import start_judge
from trainer.rewards.judge import JudgeReward
from trainer.rewards.manager import RewardManager
from trainer.rewards.rules import describe_function, load_reward_function, reward_keywords
from trainer.rewards.verify import VerifyReward

__all__ = ["build_rewards", "check_rewards"]


def check_rewards(config: Config) -> None:
    """Every reward file imports and has its function, weights name configured rewards, the
    judge config is whole and its model exists; raises ValueError saying what to set."""
    from trainer.models import resolve_model

    rm = config.reward_model
    rm.check()
    on = rm.components()
    rule = config.custom_reward_function
    if "rule" in on:
        fn = load_reward_function(rule.path, rule.name, "custom_reward_function")
        reward_keywords(fn, describe_function(rule.path, rule.name))
    for i, extra in enumerate(rm.rules):
        key = f"reward_model.rules[{i}]"
        fn = load_reward_function(extra.path, extra.function, key, "function")
        reward_keywords(fn, describe_function(extra.path, extra.function))
    if "verify" in on:
        load_reward_function(rm.verify.path, rm.verify.name, "reward_model.verify")
    if "judge" in on:
        resolve_model(rm.judge.model_path, "reward_model.judge.model_path")


def build_rewards(config: Config, tokenizer: Any, device: str) -> tuple[RewardManager, list[Any]]:
    """The reward manager and the judge servers it started (empty without a judge); the
    judge servers are stopped again if the rest cannot be built."""
    rm = config.reward_model
    on = rm.components()
    judge = verify = None
    servers: list[Any] = []
    try:
        if "judge" in on:
            servers, client, judge_tokenizer = start_judge(rm.judge, device)
            judge = JudgeReward(rm.judge, client, judge_tokenizer)
        if "verify" in on:
            path = config.actor_rollout_ref.rollout.multi_turn.tool_config_path
            tools: dict[str, Any] = {}
            if path:
                from agentloop.tools import load_tool_config

                tools = load_tool_config(path)
            verify = VerifyReward(rm.verify, tools)
        manager = RewardManager(
            config.custom_reward_function, rm, tokenizer, judge=judge, verify=verify
        )
    except BaseException:
        stop_servers(servers)  # the judge's, if it started
        raise
    return manager, servers
