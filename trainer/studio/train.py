"""The studio's training form: the main settings under verl's names, checked by the same config
code as ``agentloop-train``, written as a config file the CLI reads (``--config-path`` /
``--config-name``), run as an ``agentloop-train`` child process and followed from the run's
``metrics.jsonl``. Stop sends SIGTERM: the run ends after its step, with a checkpoint."""

from __future__ import annotations

import json
import os
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.config import load_config
from trainer.studio.child import ChildJob

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


class TrainJob(ChildJob):
    """One ``agentloop-train`` child process of the page."""

    def __init__(
        self,
        command: list[str],
        config_file: Path,
        run_dir: Path,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.command, self.config_file, self.run_dir = command, config_file, run_dir
        self.settings = settings or {}
        """The form it was started from (the page shows it again)."""
        super().__init__("trainer.cli.train", command[1:], config_file.parent / "studio_train.log")
        self.stop_requested = False

    def stop(self) -> None:
        """SIGTERM: the run ends after its step with a checkpoint (``agentloop-train``). Sent
        once: a second signal would stop the command at once, without the checkpoint."""
        if self.running and not self.stop_requested:
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
    def command_line(self) -> str:
        """The command as a shell line."""
        return shlex.join(self.command)

    @property
    def traces_command(self) -> str:
        """The command that opens this run's rollout traces."""
        return f"agentloop-traces --run-dir {shlex.quote(str(self.run_dir))}"

    def checkpoints(self) -> list[str]:
        found = [
            p.name
            for p in self.run_dir.glob("global_step_*")
            if p.is_dir() and p.name[12:].isdigit()
        ]
        return sorted(found, key=lambda name: int(name[12:]))

    def status(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "returncode": self.returncode,
            "stop_requested": self.stop_requested,
            "command": self.command_line,
            "config_file": str(self.config_file),
            "run_dir": str(self.run_dir),
            "steps": [
                {"step": p.step, "reward": p.reward, "seconds": p.seconds} for p in self.steps()
            ],
            "checkpoints": self.checkpoints(),
            "traces": self.traces_command,
            "log": self.log_tail(),
        }


def reward_curve(points: list[StepPoint], width: int = 400, height: int = 140) -> str:
    """An SVG polyline of reward/mean per step (rendered on the server), with the reward range
    on the left and the first and last step below."""
    scored = [(p.step, p.reward) for p in points if p.reward is not None]
    if not scored:
        return ""
    left, bottom, pad = 48, 18, 8
    steps = [s for s, _ in scored]
    lo, hi = min(r for _, r in scored), max(r for _, r in scored)
    span_s, span_r = max(max(steps) - min(steps), 1), max(hi - lo, 1e-9)
    xy = [
        (
            left + (s - min(steps)) / span_s * (width - left - pad),
            height - bottom - (r - lo) / span_r * (height - bottom - pad),
        )
        for s, r in scored
    ]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f'<circle class="reward-point" cx="{x:.1f}" cy="{y:.1f}" r="3"/>' for x, y in xy)
    labels = (
        f'<text x="2" y="{pad + 4}" font-size="11">{hi:.3g}</text>'
        f'<text x="2" y="{height - bottom}" font-size="11">{lo:.3g}</text>'
        f'<text x="{left}" y="{height - 4}" font-size="11">step {min(steps)}</text>'
        f'<text x="{width - pad}" y="{height - 4}" font-size="11" text-anchor="end">'
        f"step {max(steps)}</text>"
    )
    return (
        f'<svg id="reward-curve" width="{width}" height="{height}" '
        f'style="border:1px solid #ccc"><title>reward/mean per step</title>{labels}'
        f'<polyline fill="none" stroke="#06c" points="{line}"/>{dots}</svg>'
    )
