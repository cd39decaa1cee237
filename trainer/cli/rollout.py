"""``agentloop-rollout``: run the agent loops over a dataset against freshly started servers,
score each trajectory with the configured reward (``custom_reward_function``,
``reward_model.*``: the same rewards as training) and write one JSON line per trajectory
(with its ``score``). Ends with a table of accuracy, valid-tool-call rate and mean reward
(``trainer.metrics.rollout_score``). Same Hydra config as training, plus extras:

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from trainer.cli.common import load_command_config, run_command
from trainer.config import ConfigError
from trainer.metrics.rollout_score import format_summary, summarize

if TYPE_CHECKING:
    from agentloop import RolloutBatch
    from trainer.config.schema import Config
    from trainer.launch.rollout import RolloutSetup
    from trainer.rewards.manager import RewardManager

__all__ = ["main", "scored_records", "trajectory_records"]

logger = logging.getLogger("agentloop.rollout")

PROG = "agentloop-rollout"

SUMMARY_KEYS = ("score", "tool_calls", "tool_errors")

EXTRAS = ("output", "split", "max_samples", "correct_at")


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
    return run_command(PROG, __doc__, argv, _start, lambda started: _run(*started))


def _start(
    overrides: list[str],
) -> tuple[Config, RolloutSetup, list[dict[str, Any]], Path, float, str, bool]:
    """Every start-up check: everything that can be wrong fails here, before any server
    starts. Returns ``_run``'s arguments."""
    from trainer.launch.rollout import load_split, prepare_rollout
    from trainer.rewards.build import check_rewards

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
    check_rewards(config, {split: rows})
    return config, setup, rows, Path(extras["output"]), correct_at, device, split == "val"


def _number(value: Any, key: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def scored_records(batch: RolloutBatch, tokenizer: Any, rewards: RewardManager) -> list[dict]:
    """``trajectory_records`` of a batch, each with ``score`` (the configured reward, the
    weighted sum training would use) and ``scores`` (each named reward before weighting)."""
    reward = rewards.score(batch)
    records = trajectory_records(batch, tokenizer)
    for i, record in enumerate(records):
        record["score"] = float(reward.scores[i])
        record["scores"] = {name: values[i] for name, values in reward.components.items()}
    return records


def _run(
    config: Config,
    setup: RolloutSetup,
    rows: list[dict[str, Any]],
    output: Path,
    correct_at: float,
    device: str,
    validate: bool,
) -> int:
    from agentloop.trace import TraceContext
    from servers import stop_servers
    from trainer.launch.rollout import start_rollout, stop_rollout
    from trainer.rewards.build import build_rewards

    rollout = config.actor_rollout_ref.rollout
    tokenizer = setup.tokenizer
    rewards, judge_servers = build_rewards(config, tokenizer, device)
    batch_size = config.data.train_batch_size
    output.parent.mkdir(parents=True, exist_ok=True)
    written: list[dict[str, Any]] = []  # what the summary needs of each written line
    # +split=val samples as validation does (rollout.val_kwargs: greedy by default)
    how: dict[str, Any] = {}
    if validate:
        how = {"n": rollout.val_kwargs.n, "trace": TraceContext(validate=True)}
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
                    for record in scored_records(batch, tokenizer, rewards):
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
    sys.stdout.write(f"wrote {len(written)} trajectories to {output}\n")
    sys.stdout.write(format_summary(summarize(written, correct_at)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
