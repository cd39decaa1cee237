"""Start-up of the rewards a training config asks for: checks first (before any server
starts), then the judge servers, the verify tools and the ``RewardManager``."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from agentloop import get_agent_loop
from agentloop.workspace import has_workspace_task
from servers import stop_servers
from trainer.config.schema import Config
from trainer.launch.rollout import start_judge
from trainer.rewards.judge import JudgeReward
from trainer.rewards.manager import RewardManager
from trainer.rewards.rule_reward import load_rule
from trainer.rewards.rules import BUILTIN_SOURCES, builtin_scorer, load_reward_function
from trainer.rewards.verify import VerifyReward

__all__ = [
    "SCORER_FIXES",
    "build_rewards",
    "check_data_sources",
    "check_rewards",
    "describe_sources",
    "unscored_sources",
]

logger = logging.getLogger("agentloop.train")


def check_rewards(config: Config, rows: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
    """Every reward file imports and has its function, each function takes the keywords it
    will be called with, weights name configured rewards, the judge config is whole and its
    model exists, and (given the ``rows`` of each split, e.g. ``{"train": [...]}``) the
    built-in scorer handles every data_source it would score; raises ValueError saying what
    to set."""
    from trainer.models import resolve_model

    rm = config.reward_model
    rm.check()
    on = rm.components()
    rule = config.custom_reward_function
    if "rule" in on:
        batch = rm.reward_manager == "batch"
        load_rule(rule.path, rule.name, "custom_reward_function", rule.reward_kwargs, batch=batch)
        if rm.reward_manager == "prime":
            logger.warning(
                "reward_model.reward_manager=prime: verl's PRIME manager scores each sample in "
                "a process pool; here that is custom_reward_function.executor=process, used "
                "for this run (num_workers=%d, timeout_s=%g); set reward_model.reward_manager="
                "naive and custom_reward_function.executor=process to say so directly",
                rule.num_workers,
                rule.timeout_s,
            )
    for i, extra in enumerate(rm.rules):
        key = f"reward_model.rules[{i}]"
        load_rule(extra.path, extra.function, key, extra.reward_kwargs, field="function")
    if "verify" in on:
        load_reward_function(rm.verify.path, rm.verify.name, "reward_model.verify")
    if "judge" in on:
        resolve_model(rm.judge.model_path, "reward_model.judge.model_path")
    if rows is not None:
        check_data_sources(config, rows)


def unscored_sources(config: Config, rows: list[dict[str, Any]]) -> list[tuple[str | None, int]]:
    """The data sources of ``rows`` that nothing would score, with their row counts (None:
    rows without one): with the built-in scorer as the ``rule`` reward, those no built-in
    scorer handles. Empty without a rule reward (judge or verify only) or with
    ``custom_reward_function.path`` (a user's function scores every row). A row with a
    workspace task needs no scorer: its loop sets the check's score as its ``rule`` reward; nor
    does a row whose loop is an environment that scores itself (``AgentLoopBase.sets_reward``:
    a verifiers rubric, OpenEnv step rewards)."""
    if "rule" not in config.reward_model.components() or config.custom_reward_function.path:
        return []
    default = config.actor_rollout_ref.rollout.default_agent_loop
    counts = Counter(
        row.get("data_source") or None
        for row in rows
        if not has_workspace_task(row) and not _loop_sets_reward(row, default)
    )
    return [(s, n) for s, n in counts.items() if builtin_scorer(s) is None]


def _loop_sets_reward(row: Mapping[str, Any], default: str) -> bool:
    try:
        return get_agent_loop(row.get("agent_name") or default).cls.sets_reward
    except ValueError:  # an unknown loop: the row checks say so
        return False


def describe_sources(sources: list[tuple[str | None, int]]) -> str:
    """``data_source 'quiz' (2 rows), missing (1 row)``."""
    return "data_source " + ", ".join(
        f"{repr(s) if s else 'missing'} ({n} row{'s' if n > 1 else ''})" for s, n in sources
    )


SCORER_FIXES = (
    "set custom_reward_function.path to a file whose compute_score(data_source, solution_str, "
    "ground_truth, extra_info) scores these rows, or give the rows a data_source with a "
    f"built-in scorer: {BUILTIN_SOURCES}"
)


def check_data_sources(config: Config, rows: Mapping[str, list[dict[str, Any]]]) -> None:
    """Every row of each split (``rows`` maps ``train``/``val`` to its rows) has a scorer
    (``unscored_sources``); raises ValueError naming the split's files and what to set."""
    for split, split_rows in rows.items():
        unknown = unscored_sources(config, split_rows)
        if not unknown:
            continue
        files = ", ".join(config.data.files(getattr(config.data, f"{split}_files", None)))
        where = f"data.{split}_files ({files})" if files else f"the {split} rows"
        raise ValueError(
            f"{where}: {describe_sources(unknown)}: no built-in scorer handles it and "
            f"custom_reward_function.path is not set: {SCORER_FIXES}"
        )


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
