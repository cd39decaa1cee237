"""``agentloop-train`` / ``python -m trainer.cli.train``: GRPO/PPO on agent-loop trajectories.

    agentloop-train data.train_files=train.parquet actor_rollout_ref.model.path=tiny-qwen3 \\
        actor_rollout_ref.rollout.n=4 trainer.total_training_steps=10

Every ``key=value`` of ``trainer/config/ppo_trainer.yaml`` can be overridden. All start-up
checks (config, model, agent loops, tools, data, reward function, loggers, checkpoint folder)
run before any server or trainer rank starts; a failure prints one line saying what to set.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from trainer.cli.common import cli_error, hydra_argv
    from trainer.config import ConfigError, load_config
    from trainer.loop.assembly import build_run, plan_run
    from trainer.loop.async_trainer import AsyncPPOTrainer
    from trainer.loop.ray_trainer import RayPPOTrainer, RunStoppedError
    from trainer.rewards import JudgeUnavailableError, RewardFunctionError

    argv = hydra_argv(argv, __doc__)
    if argv is None:
        return 0
    try:
        config, extras = load_config(argv)
        if extras:
            raise ConfigError(f"unknown extra +{sorted(extras)[0]}: agentloop-train takes none")
        plan = plan_run(config)  # every start-up check; nothing is running yet
    except ValueError as exc:
        return cli_error("agentloop-train", str(exc))
    try:
        cls = AsyncPPOTrainer if config.async_training.enable else RayPPOTrainer
        trainer = cls(config, build_run(config, plan), plan.sampler, plan.val_rows)
        metrics = trainer.fit()
    except (JudgeUnavailableError, RewardFunctionError) as exc:
        # The last checkpoint stays; fix the reward and run again to resume.
        sys.stderr.write(f"agentloop-train: reward failed: {exc}\n")
        return 1
    except RunStoppedError as exc:
        sys.stderr.write(f"agentloop-train: {exc}\n")
        return 1
    if metrics:
        sys.stdout.write(
            f"done: {trainer.total_steps} steps, last reward/mean {metrics['reward/mean']:.4f}; "
            f"run folder {trainer.checkpoints.root}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
