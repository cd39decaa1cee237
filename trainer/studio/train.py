"""The studio's training form: the main settings under verl's names, checked by the same config
code as ``agentloop-train``, written as a config file the CLI reads (``--config-path`` /
``--config-name``), run as an ``agentloop-train`` child process and followed from the run's
``metrics.jsonl``. Stop sends SIGTERM: the run ends after its step, with a checkpoint."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.config import load_config

__all__ = ["FIELDS", "TrainJob", "check_settings", "config_tree"]

# (key, label, default): the form, in order; empty values are left to the config's defaults.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("actor_rollout_ref.model.path", "model (asset name, folder or hub id)", "tiny-qwen3"),
    ("data.train_files", "training rows (jsonl or parquet)", ""),
    ("data.val_files", "validation rows", ""),
    ("custom_reward_function.path", "reward file", ""),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tool config", ""),
    ("data.train_batch_size", "prompts per step", "4"),
    ("actor_rollout_ref.rollout.n", "samples per prompt (n)", "2"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "prompts per mini-batch", "2"),
    ("data.max_prompt_length", "max prompt tokens", "512"),
    ("actor_rollout_ref.rollout.response_length", "response tokens", "128"),
    ("actor_rollout_ref.actor.optim.lr", "learning rate", "1e-6"),
    ("algorithm.adv_estimator", "estimator", "grpo"),
    ("async_training.enable", "async training", "False"),
    ("actor_rollout_ref.model.lora_rank", "LoRA rank (0: full)", "0"),
    ("trainer.total_training_steps", "steps", "10"),
    ("trainer.save_freq", "checkpoint every N steps", "5"),
    ("trainer.n_gpus_per_node", "trainer ranks", "1"),
    ("trainer.default_local_dir", "run folder", ""),
)


def _value(raw: str) -> Any:
    """A form value as YAML reads it (numbers, booleans, null), else the text."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def config_tree(settings: dict[str, str]) -> dict[str, Any]:
    """The non-empty settings as a nested config file that extends ``ppo_trainer``; the run
    logs metrics to ``metrics.jsonl`` (what the page follows) besides the console."""
    tree: dict[str, Any] = {"defaults": ["ppo_trainer", "_self_"]}
    values = {k: v for k, v in settings.items() if str(v).strip() != ""}
    values.setdefault("trainer.logger", "[console,jsonl]")
    for key, raw in values.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _value(str(raw))
    return tree


def check_settings(settings: dict[str, str], folder: Path) -> tuple[Path, list[str]]:
    """Write the config file into ``folder`` and check it with ``agentloop-train``'s config code
    (load and cross-key checks); returns the file and the command that runs it. Raises
    ValueError with the CLI's message."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "studio_run.yaml"
    path.write_text(yaml.safe_dump(config_tree(settings), sort_keys=False))
    args = ["--config-path", str(folder), "--config-name", path.stem]
    config, _ = load_config(args)
    config.check()
    return path, ["agentloop-train", *args]


@dataclass(slots=True)
class StepPoint:
    step: int
    reward: float | None
    seconds: float | None
    metrics: dict[str, float]


class TrainJob:
    """One ``agentloop-train`` child process of the page."""

    def __init__(self, command: list[str], config_file: Path, run_dir: Path) -> None:
        self.command, self.config_file, self.run_dir = command, config_file, run_dir
        self.log = config_file.parent / "studio_train.log"
        argv = [sys.executable, "-m", "trainer.cli.train", *command[1:]]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.stop_requested = False

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The child's exit code (None while it runs; 0 after a stop with a checkpoint)."""
        return self.process.poll()

    def stop(self) -> None:
        """SIGTERM: the run ends after its step with a checkpoint (``agentloop-train``)."""
        if self.running:
            self.stop_requested = True
            os.kill(self.process.pid, signal.SIGTERM)

    def steps(self) -> list[StepPoint]:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        last: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                if record.get("step", 0) > 0:
                    last[record["step"]] = record
        return [
            StepPoint(s, r.get("reward/mean"), r.get("timing_s/step"), r)
            for s, r in sorted(last.items())
        ]

    @property
    def traces_command(self) -> str:
        """The command that opens this run's rollout traces."""
        return f"agentloop-traces --run-dir {shlex.quote(str(self.run_dir))}"

    def checkpoints(self) -> list[str]:
        return sorted(p.name for p in self.run_dir.glob("global_step_*") if p.is_dir())

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def status(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "returncode": self.returncode,
            "stop_requested": self.stop_requested,
            "command": shlex.join(self.command),
            "config_file": str(self.config_file),
            "run_dir": str(self.run_dir),
            "steps": [
                {"step": p.step, "reward": p.reward, "seconds": p.seconds} for p in self.steps()
            ],
            "checkpoints": self.checkpoints(),
            "traces": self.traces_command,
            "log": self.log_tail(),
        }


def reward_curve(points: list[StepPoint], width: int = 360, height: int = 120) -> str:
    """An SVG polyline of reward/mean per step (rendered on the server)."""
    scored = [(p.step, p.reward) for p in points if p.reward is not None]
    if not scored:
        return ""
    steps = [s for s, _ in scored]
    lo, hi = min(r for _, r in scored), max(r for _, r in scored)
    span_s, span_r = max(max(steps) - min(steps), 1), max(hi - lo, 1e-9)
    xy = " ".join(
        f"{10 + (s - min(steps)) / span_s * (width - 20):.1f},"
        f"{height - 10 - (r - lo) / span_r * (height - 20):.1f}"
        for s, r in scored
    )
    dots = "".join(
        f'<circle class="reward-point" cx="{x}" cy="{y}" r="3"/>'
        for x, y in (pair.split(",") for pair in xy.split())
    )
    return (
        f'<svg id="reward-curve" width="{width}" height="{height}" '
        f'style="border:1px solid #ccc"><polyline fill="none" stroke="#06c" points="{xy}"/>'
        f"{dots}</svg>"
    )
