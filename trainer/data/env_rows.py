"""Rows from an environment's own dataset (``data.env_dataset``), where the files are unset.

A verifiers environment brings its dataset (``load_environment(...).dataset`` and its eval
dataset): its runner writes them as rows (``agentloop.envs.verifiers_env``), each carrying the
environment (``verifiers: {env_id, env_args, example}``) so the ``verifiers`` loop runs it with
nothing else configured. The rows land in ``<trainer.default_local_dir>/env_rows/<split>.jsonl``
and are read like any data file (length filter, row checks).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentloop.envs.verifiers_env import VerifiersSpec
from trainer.config.schema import EnvDatasetConfig

__all__ = ["environment_rows"]

logger = logging.getLogger(__name__)


def environment_rows(config: EnvDatasetConfig, split: str, out_dir: str | Path) -> list[str]:
    """The data files of ``split`` (``train`` or ``val``) from the environment; [] when no
    environment is configured, or for ``val`` with ``val_size=0``."""
    if config.verifiers is None:
        return []
    size = config.val_size if split == "val" else config.train_size
    if size == 0:
        return []
    spec = VerifiersSpec(
        env_id=config.verifiers,
        env_args=dict(config.env_args),
        python=config.python,
        paths=tuple(config.paths),
    )
    env_split = config.val_split if split == "val" else config.train_split
    folder = Path(out_dir) / "env_rows"
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"{split}.raw.jsonl"
    spec.run(
        "dataset",
        "--split",
        env_split,
        "--n",
        str(size),
        "--out",
        str(raw),
    )
    out = folder / f"{split}.jsonl"
    count = 0
    with raw.open() as src, out.open("w") as dst:
        for line in src:
            if not line.strip():
                continue
            row = json.loads(line)
            row["agent_name"] = config.agent_name
            row["verifiers"] = {**spec.as_row_field(), "example": row.get("verifiers") or {}}
            dst.write(json.dumps(row) + "\n")
            count += 1
    if not count:
        raise ValueError(
            f"data.env_dataset: verifiers environment {spec.env_id!r} has no rows in its "
            f"{env_split} split: set data.{split}_files, or another env_dataset.{split}_split"
        )
    logger.info(
        "data.env_dataset: %d %s rows from verifiers environment %r (%s split)",
        count,
        split,
        spec.env_id,
        env_split,
    )
    return [str(out)]
