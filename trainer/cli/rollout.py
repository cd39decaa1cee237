"""``agentloop-rollout``: run the agent loops over a dataset against freshly started servers,
score each trajectory with the configured reward (``custom_reward_function``,
``reward_model.*``: the same rewards as training) and write one JSON line per trajectory
(with its ``score``). Rows whose data_source nothing scores (no built-in scorer and no
``custom_reward_function.path``) are written unscored (``score`` null), said once at the
start: a model can be looked at before its reward exists. Ends with a table of accuracy,
valid-tool-call rate and mean reward (``trainer.metrics.rollout_score``). Same Hydra config
as training, plus extras:

  +output=PATH     where the JSONL goes (required)
  +split=val       read data.val_files instead of data.train_files, sampled as validation is
                   (rollout.val_kwargs: greedy, n=1 by default)
  +max_samples=N   only the first N rows
  +correct_at=X    a sample counts as correct when its reward is >= X (default 1.0)
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from trainer.cli.common import run_command
from trainer.loop.rollout_plan import PROG, RolloutPlan, plan_rollout
from trainer.loop.trajectories import add_scores, trajectory_records
from trainer.metrics.rollout_score import format_summary, summarize

if TYPE_CHECKING:
    from agentloop import RolloutBatch
    from trainer.rewards.manager import RewardManager

__all__ = ["main", "scored_records"]

logger = logging.getLogger("agentloop.rollout")

SUMMARY_KEYS = ("score", "tool_calls", "tool_errors")


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, __doc__, argv, plan_rollout, _run)


def scored_records(
    batch: RolloutBatch,
    tokenizer: Any,
    rewards: RewardManager,
    unscored: frozenset[str | None] = frozenset(),
) -> list[dict]:
    """``trajectory_records`` of a batch, each with ``score`` (the configured reward, the
    weighted sum training would use, turn-level rewards added) and ``scores`` (each named
    reward before weighting, ``turns`` the turn rewards' sum where there are any,
    ``env/<name>`` an environment's own reward functions where the loop kept them);
    samples whose data_source is in ``unscored`` get ``score`` None and no ``scores``."""
    records = trajectory_records(batch, tokenizer)
    scored = [i for i, r in enumerate(records) if (r["data_source"] or None) not in unscored]
    for record in records:
        record["score"], record["scores"] = None, {}
    if scored:
        reward = rewards.score(batch if len(scored) == len(records) else batch.select(scored))
        add_scores(records, batch, reward, scored)
    return records


def _run(started: RolloutPlan) -> int:
    from agentloop.tools.mcp_errors import RUN_DIR_ENV
    from agentloop.trace import TraceContext
    from servers import stop_servers
    from trainer.launch.console import init_ray_routed
    from trainer.launch.rollout import start_rollout, stop_rollout
    from trainer.rewards.build import build_rewards

    config, setup, rows, output = started.config, started.setup, started.rows, started.output
    correct_at, device = started.correct_at, started.device
    rollout = config.actor_rollout_ref.rollout
    tokenizer = setup.tokenizer
    rewards, judge_servers = build_rewards(config, tokenizer, device)
    batch_size = config.data.train_batch_size
    output.parent.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, Any]] = []  # what the summary needs of each written line
    # +split=val samples as validation does (rollout.val_kwargs: greedy by default)
    how: dict[str, Any] = {}
    if started.validate:
        how = {"n": rollout.val_kwargs.n, "trace": TraceContext(validate=True)}
    # the output's folder is this run's folder: tool-server logs and each gateway session's
    # log folder (a harness's transcript) go under it, as under agentloop-train's run folder
    run_dir = {RUN_DIR_ENV: str(output.parent.resolve())}
    console = init_ray_routed(output.parent, config.trainer.worker_log_level, run_dir)
    try:
        count = config.servers_for(device)
        servers, manager = start_rollout(rollout, setup.model, num_servers=count)
        try:
            with (
                output.open("w") as f,
                tqdm(total=len(rows) * how.get("n", rollout.n), desc="rollout", unit="traj") as bar,
            ):
                for start in range(0, len(rows), batch_size):
                    batch = manager.generate_sequences(rows[start : start + batch_size], **how)
                    for record in scored_records(batch, tokenizer, rewards, started.unscored):
                        f.write(json.dumps(record) + "\n")
                        written.append({k: record[k] for k in SUMMARY_KEYS})
                    bar.update(len(batch))
                    so_far = summarize(written, correct_at)
                    bar.set_postfix(
                        turns=f"{batch.metrics['agent_loop/num_turns/mean']:.1f}",
                        acc=f"{so_far.accuracy:.0%}",
                    )
        finally:
            stop_rollout(servers, manager)
    finally:
        rewards.close()
        stop_servers(judge_servers)
        if console is not None:
            console.close()
    sys.stdout.write(f"wrote {len(written)} trajectories to {output}\n")
    sys.stdout.write(format_summary(summarize(written, correct_at)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
