"""What one studio holds (the loaded tools and reward file, the preview and the run it
started) and its actions; the pages and the JSON API both call these, so they fail alike: a
``ValueError`` with the text the CLI would give."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.studio.preview import (
    ESTIMATOR_KEY,
    PREVIEW_FIELDS,
    PreviewJob,
    check_estimator,
    preview_overrides,
)
from trainer.studio.reward import RewardBench, RewardView
from trainer.studio.tools import ToolBench
from trainer.studio.train import TrainJob, check_settings

__all__ = ["Studio", "said"]

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


class Studio:
    """One user's studio; previews and runs without a folder of their own go under ``runs``."""

    def __init__(self, runs_dir: str | Path = "studio_runs") -> None:
        self.runs = Path(runs_dir).expanduser().resolve()
        self.tools: ToolBench | None = None
        self.reward: RewardBench | None = None
        self.train: TrainJob | None = None
        self.preview: PreviewJob | None = None

    def close(self) -> None:
        """MCP servers started here stop, a run ends with a checkpoint, a preview is cancelled."""
        self.close_tools()
        if self.train is not None:
            self.train.stop()
        if self.preview is not None:
            self.preview.cancel()

    # ---- tools and reward ---------------------------------------------------------------------
    def load_tools(self, path: str) -> None:
        if not path:
            raise ValueError("give the path of a tool config")
        bench = ToolBench(path)  # a bad file leaves the loaded tools as they were
        self.close_tools()
        self.tools = bench

    def close_tools(self) -> None:
        if self.tools is not None:
            self.tools.close()
            self.tools = None

    def load_reward(self, path: str, name: str) -> None:
        if not path:
            raise ValueError("give the path of a reward file")
        self.reward = RewardBench(path, name)

    def score(self, row: dict[str, Any], answer: str) -> RewardView:
        if self.reward is None:
            raise ValueError("load a reward file first")
        return self.reward.score(row, answer)

    # ---- preview ------------------------------------------------------------------------------
    def preview_defaults(self) -> dict[str, str]:
        """The preview form's defaults, with the tools and reward file loaded on their pages."""
        settings = {key: default for key, _, default in PREVIEW_FIELDS}
        if self.tools is not None and not str(self.tools.path).endswith(".py"):
            settings[TOOL_CONFIG_KEY] = str(self.tools.path)
        if self.reward is not None:
            settings["custom_reward_function.path"] = str(self.reward.path)
            settings["custom_reward_function.name"] = self.reward.name
        settings[ESTIMATOR_KEY] = "grpo"
        return settings

    def start_preview(self, settings: dict[str, str]) -> PreviewJob:
        """Check the form with ``agentloop-rollout``'s start-up code, then run the command."""
        from trainer.loop.rollout_plan import plan_rollout

        if self.preview is not None and self.preview.running:
            raise ValueError("a preview is running: cancel it or wait for it")
        estimator = check_estimator(settings.get(ESTIMATOR_KEY, "").strip() or "grpo")
        self.runs.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = Path(tempfile.mkdtemp(prefix=f"preview-{stamp}-", dir=self.runs))
        try:
            overrides, output, error = preview_overrides(settings, folder)
            if error:
                raise ValueError(error)
            with said("agentloop.rollout") as notes:  # what the command says once at its start
                started = plan_rollout(overrides)
        except ValueError:
            shutil.rmtree(folder, ignore_errors=True)  # a refused form leaves no folder behind
            raise
        tokenizer = started.setup.tokenizer
        self.preview = PreviewJob(overrides, output, tokenizer, estimator, notes, settings)
        return self.preview

    # ---- train --------------------------------------------------------------------------------
    def run_dir(self, settings: dict[str, str]) -> Path:
        """The run's folder: the form's ``trainer.default_local_dir``, else a new one (set)."""
        given = settings.get("trainer.default_local_dir", "").strip()
        if not given:
            given = str(self.runs / time.strftime("%Y%m%d-%H%M%S"))
            settings["trainer.default_local_dir"] = given
        return Path(given).expanduser().resolve()

    def check_train(self, settings: dict[str, str]) -> tuple[Path, list[str]]:
        return check_settings(settings, self.run_dir(settings))

    def start_train(self, settings: dict[str, str]) -> TrainJob:
        if self.train is not None and self.train.running:
            raise ValueError(f"a run is in progress ({self.train.run_dir}): stop it first")
        run_dir = self.run_dir(settings)
        file, command = check_settings(settings, run_dir)
        self.train = TrainJob(command, file, run_dir, settings)
        return self.train


@contextmanager
def said(name: str, level: int = logging.WARNING) -> Iterator[list[str]]:
    """The messages logger ``name`` emits at ``level`` or above inside the block."""
    lines: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = _Keep(level)
    logging.getLogger(name).addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger(name).removeHandler(handler)
