"""``agentloop-train`` / ``python -m trainer.cli.train``: GRPO/PPO on agent-loop trajectories.

    agentloop-train data.train_files=train.parquet actor_rollout_ref.model.path=tiny-qwen3 \\
        actor_rollout_ref.rollout.n=4 trainer.total_training_steps=10

Every ``key=value`` of ``trainer/config/ppo_trainer.yaml`` can be overridden. All start-up
checks (config, model, agent loops, tools, data, reward function, loggers, checkpoint folder)
run before any server or trainer rank starts; a failure prints one line saying what to set.

SIGTERM or SIGINT (Ctrl-C, a preempted node, the studio's stop button) ends the run after the
step in progress, with a checkpoint of it, and exits 0; the same command resumes. A second one
stops at once (the last checkpoint stays).
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

from trainer.cli.common import load_command_config, run_command

if TYPE_CHECKING:
    from trainer.config.schema import Config
    from trainer.loop.assembly import RunPlan

__all__ = ["main"]

PROG = "agentloop-train"


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, __doc__, argv, _start, _train)


def _start(overrides: list[str]) -> tuple[Config, RunPlan]:
    """Every start-up check; nothing is running yet."""
    from trainer.loop.assembly import plan_run

    config, _ = load_command_config(PROG, overrides)
    return config, plan_run(config)


def _train(started: tuple[Config, RunPlan]) -> int:
    from trainer.loop.assembly import build_run
    from trainer.loop.ray_trainer import RayPPOTrainer, RunStoppedError
    from trainer.rewards import JudgeUnavailableError, RewardFunctionError

    config, plan = started
    try:
        # async_training.enable picks the rollout source: a batch per step, or the stream
        trainer = RayPPOTrainer(config, build_run(config, plan), plan.sampler, plan.val_rows)
        stop_on_signals(trainer)
        metrics = trainer.fit()
    except (JudgeUnavailableError, RewardFunctionError) as exc:
        # The last checkpoint stays; fix the reward and run again to resume.
        sys.stderr.write(f"agentloop-train: reward failed: {exc}\n")
        return 1
    except RunStoppedError as exc:
        sys.stderr.write(f"agentloop-train: {exc}\n")
        return 1
    if trainer.stopped_at is not None:
        sys.stdout.write(
            f"stopped on request after step {trainer.stopped_at} of {trainer.total_steps}: the "
            f"checkpoint is {trainer.checkpoints.latest()}. Run the same command again "
            "(trainer.resume_mode=auto) to go on.\n"
        )
    elif trainer.config.trainer.val_only:
        sys.stdout.write(
            f"validated (trainer.val_only): val/reward/mean {metrics['val/reward/mean']:.4f}; "
            f"run folder {trainer.checkpoints.root}\n"
        )
    elif metrics:
        sys.stdout.write(
            f"done: {trainer.total_steps} steps, last reward/mean {metrics['reward/mean']:.4f}; "
            f"run folder {trainer.checkpoints.root}\n"
        )
    return 0


def stop_on_signals(trainer: Any) -> None:
    """The first SIGTERM / SIGINT asks ``trainer`` to stop after its step (with a checkpoint);
    a second one stops at once (SIGINT: KeyboardInterrupt; SIGTERM: exit 143)."""

    def first(signum: int, _frame: Any) -> None:
        sys.stderr.write(
            f"agentloop-train: {signal.Signals(signum).name}: stopping after the step in "
            "progress, with a checkpoint (send it again to stop at once)\n"
        )
        trainer.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    signal.signal(signal.SIGINT, first)
    signal.signal(signal.SIGTERM, first)


if __name__ == "__main__":
    raise SystemExit(main())
