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

import dataclasses
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from trainer.cli.common import run_command
from trainer.loop.rollout_plan import PROG, RolloutPlan, plan_rollout
from trainer.metrics.rollout_score import format_summary, summarize

if TYPE_CHECKING:
    from agentloop import RolloutBatch
    from trainer.rewards.manager import RewardManager

__all__ = ["main", "scored_records", "trajectory_records"]

logger = logging.getLogger("agentloop.rollout")

SUMMARY_KEYS = ("score", "tool_calls", "tool_errors")


def trajectory_records(batch: RolloutBatch, tokenizer: Any) -> list[dict[str, Any]]:
    """Un-padded JSON-ready trajectories of a ``RolloutBatch``."""
    p = batch.prompts.shape[1]
    records = []
    for i in range(len(batch)):
        attn = batch.attention_mask[i].bool()
        prompt_ids = batch.prompts[i][attn[:p]].tolist()
        n = int(attn[p:].sum())
        response_ids = batch.responses[i, :n].tolist()
        row, record = batch.rows[i], batch.records[i]
        records.append(
            {
                "uid": batch.uid[i],
                "rollout_n": row.get("rollout_n", 0),
                "index": row.get("index"),
                "data_source": row.get("data_source"),
                "agent_name": batch.agent_name[i],
                "num_turns": batch.num_turns[i],
                "stop_reason": record.stop_reason,
                "finish_reasons": record.finish_reasons,
                "tool_calls": batch.tool_calls[i],
                "tool_errors": batch.tool_errors[i],
                "tool_error_kinds": record.tool_error_kinds,
                "calls": [dataclasses.asdict(c) for c in record.calls],
                "tool_rewards": record.tool_rewards,
                "weight": record.weight,
                "session_id": record.session_id,
                "segment": record.segment,
                "branch_reason": record.branch_reason,
                "branch_point": record.branch_point,
                "error": record.error,
                "prompt_text": tokenizer.decode(prompt_ids, skip_special_tokens=False),
                "response_text": tokenizer.decode(response_ids, skip_special_tokens=False),
                "prompt_ids": prompt_ids,
                "response_ids": response_ids,
                "response_mask": batch.response_mask[i, :n].tolist(),
                "response_log_probs": batch.rollout_log_probs[i, :n].tolist(),
            }
        )
    return records


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
    if not scored:
        return records
    reward = rewards.score(batch if len(scored) == len(records) else batch.select(scored))
    turns = None if reward.turn_rewards is None else reward.turn_rewards.sum(-1).tolist()
    for j, i in enumerate(scored):
        records[i]["score"] = float(reward.scores[j]) + (turns[j] if turns else 0.0)
        records[i]["scores"] = {name: values[j] for name, values in reward.components.items()}
        if turns:
            records[i]["scores"]["turns"] = turns[j]
        parts = batch.records[i].reward_parts  # an environment's own reward functions
        records[i]["scores"].update({f"env/{k}": v for k, v in parts.items()})
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
