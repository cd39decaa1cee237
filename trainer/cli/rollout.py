"""``agentloop-rollout``: run the agent loops over a dataset against freshly started servers
and write one JSON line per trajectory. Same Hydra config as training, plus extras:

  +output=PATH     where the JSONL goes (required)
  +split=val       read data.val_files instead of data.train_files
  +max_samples=N   only the first N rows
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    from agentloop import RolloutBatch
    from trainer.config.schema import Config

__all__ = ["main", "trajectory_records"]

logger = logging.getLogger("agentloop.rollout")

EXTRAS = ("output", "split", "max_samples")


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
    from trainer.cli.common import cli_error, hydra_argv
    from trainer.config import ConfigError, load_config
    from trainer.launch import load_split, prepare_rollout

    argv = hydra_argv(argv, __doc__)
    if argv is None:
        return 0
    # ---- start-up checks: everything that can be wrong fails here, before any server starts
    try:
        config, extras = load_config(argv)
        unknown = sorted(set(extras) - set(EXTRAS))
        if unknown:
            raise ConfigError(
                f"unknown extra +{unknown[0]}; agentloop-rollout takes "
                "+output, +split, +max_samples"
            )
        if not extras.get("output"):
            raise ConfigError("set +output=PATH for the trajectories JSONL")
        split = extras.get("split", "train")
        if split not in ("train", "val"):
            raise ConfigError(f"+split must be train or val, got {split!r}")
        setup = prepare_rollout(config)
        rows = load_split(config, setup, split)
        if extras.get("max_samples"):
            rows = rows[: int(extras["max_samples"])]
    except ValueError as exc:
        return cli_error("agentloop-rollout", str(exc))
    return _run(config, setup.model_path, rows, setup.tokenizer, Path(extras["output"]))


def _run(
    config: Config, model_path: str, rows: list[dict[str, Any]], tokenizer: Any, output: Path
) -> int:
    from trainer.launch import start_rollout, stop_rollout

    rollout = config.actor_rollout_ref.rollout
    servers, manager = start_rollout(rollout, model_path)
    batch_size = config.data.train_batch_size
    output.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    try:
        with (
            output.open("w") as f,
            tqdm(total=len(rows) * rollout.n, desc="rollout", unit="traj") as bar,
        ):
            for start in range(0, len(rows), batch_size):
                batch = manager.generate_sequences(rows[start : start + batch_size])
                for record in trajectory_records(batch, tokenizer):
                    f.write(json.dumps(record) + "\n")
                    written += 1
                bar.update(len(batch))
                bar.set_postfix(turns=f"{batch.metrics['agent_loop/num_turns/mean']:.1f}")
    finally:
        stop_rollout(servers, manager)
    sys.stdout.write(f"wrote {written} trajectories to {output}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
