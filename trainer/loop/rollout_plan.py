"""``agentloop-rollout``'s start-up: the command's config and extras read, and every check
on them run before any server starts (model, agent loops, tools, rows, rewards). A row whose
data_source nothing scores is not an error here, as it is for training: its trajectories are
written unscored, said once. The studio's preview runs the same checks on its form."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import ConfigError, load_command_config

if TYPE_CHECKING:
    from trainer.config.schema import Config
    from trainer.launch.rollout import RolloutSetup

__all__ = ["EXTRAS", "PROG", "RolloutPlan", "plan_rollout"]

logger = logging.getLogger("agentloop.rollout")

PROG = "agentloop-rollout"
EXTRAS = ("output", "split", "max_samples", "correct_at")


@dataclasses.dataclass(slots=True)
class RolloutPlan:
    """What every start-up check produced: the run's inputs."""

    config: Config
    setup: RolloutSetup
    rows: list[dict[str, Any]]
    output: Path
    correct_at: float
    device: str
    validate: bool
    unscored: frozenset[str | None]
    """Data sources written unscored (nothing scores them)."""


def plan_rollout(overrides: list[str]) -> RolloutPlan:
    """Every start-up check: everything that can be wrong fails here (ValueError with what to
    change), before any server starts."""
    from trainer.launch.rollout import load_split, prepare_rollout
    from trainer.rewards.build import (
        SCORER_FIXES,
        check_rewards,
        describe_sources,
        unscored_sources,
    )

    config, extras = load_command_config(PROG, overrides, EXTRAS)
    if not extras.get("output"):
        raise ConfigError("set +output=PATH for the trajectories JSONL")
    split = extras.get("split", "train")
    if split not in ("train", "val"):
        raise ConfigError(f"+split must be train or val, got {split!r}")
    correct_at = _number(extras.get("correct_at", 1.0), "+correct_at")
    setup = prepare_rollout(config)
    device = config.trainer.resolve_device()  # where the servers (and a judge) run
    config.servers_for(device)  # raises when the GPUs do not split into servers
    rows = load_split(config, setup, split)
    if extras.get("max_samples"):
        rows = rows[: int(extras["max_samples"])]
    check_rewards(config)
    unscored = unscored_sources(config, rows)
    if unscored:
        logger.warning(
            "%s: no built-in scorer handles it and custom_reward_function.path is not set: "
            "these trajectories are written unscored (score null); to score them, %s",
            describe_sources(unscored),
            SCORER_FIXES,
        )
    return RolloutPlan(
        config,
        setup,
        rows,
        Path(extras["output"]),
        correct_at,
        device,
        split == "val",
        frozenset(s for s, _ in unscored),
    )


def _number(value: Any, key: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None
