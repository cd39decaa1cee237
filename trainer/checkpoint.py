"""Checkpoint folders and resume (driver side).

Layout (verl's names)::

    <default_local_dir>/
      latest_checkpointed_iteration.txt    # "N", written last
      global_step_N/
        trainer_state.json                 # step, data position, ... (``extra``)
        actor/dcp/                         # sharded model + optimizer (torch DCP)
        actor/optim_extra.pt               # lr scheduler, optimizer step count
        actor/huggingface/                 # transformers folder (``hf_model``)

A checkpoint is written into ``.global_step_N.tmp`` and renamed when complete, so a run killed
while saving never leaves a folder that resume would pick up.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CheckpointManager", "LATEST_FILE"]

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class _Savable(Protocol):
    def save_checkpoint(self, directory: str, contents: list[str]) -> None: ...


class CheckpointManager:
    def __init__(self, root: str | Path, max_keep: int | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.max_keep = max_keep

    def check_writable(self) -> None:
        """Fail at start-up, not after the first step, when the folder cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / ".write_probe"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ValueError(
                f"checkpoint folder {self.root} is not writable ({exc.strerror}): set "
                "trainer.default_local_dir to a writable folder"
            ) from None

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def save(
        self, step: int, workers: _Savable, contents: list[str], state: dict[str, Any]
    ) -> Path:
        final = self.step_dir(step)
        tmp = self.root / f".global_step_{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        actor_contents = [c for c in contents if c != "extra"]
        if actor_contents:
            workers.save_checkpoint(str(tmp / "actor"), actor_contents)
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = self.root / f".{LATEST_FILE}.tmp"
        latest_tmp.write_text(str(step))
        os.replace(latest_tmp, self.root / LATEST_FILE)
        self._prune(step)
        logger.info("checkpoint saved: %s", final)
        return final

    def _prune(self, newest: int) -> None:
        if not self.max_keep or self.max_keep < 1:
            return
        steps = sorted(s for s, _ in self._complete())
        for step in steps[: max(0, len(steps) - self.max_keep)]:
            if step != newest:
                shutil.rmtree(self.step_dir(step), ignore_errors=True)

    def _complete(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for item in self.root.iterdir():
            m = _STEP_DIR.match(item.name)
            if m and (item / "trainer_state.json").is_file():
                out.append((int(m.group(1)), item))
        return out

    def latest(self) -> Path | None:
        """The newest complete checkpoint (the latest file first, else a scan), or None."""
        marker = self.root / LATEST_FILE
        if marker.is_file():
            try:
                path = self.step_dir(int(marker.read_text().strip()))
                if (path / "trainer_state.json").is_file():
                    return path
            except ValueError:
                pass
            logger.warning("%s does not name a complete checkpoint; scanning", marker)
        found = self._complete()
        return max(found)[1] if found else None

    @staticmethod
    def load_state(path: str | Path) -> dict[str, Any]:
        """``trainer_state.json`` of a checkpoint folder (a clear error if it is not one)."""
        state_file = Path(path) / "trainer_state.json"
        if not state_file.is_file():
            raise ValueError(
                f"{path} is not a checkpoint folder (no trainer_state.json): point "
                "trainer.resume_from_path at a global_step_N folder"
            )
        return json.loads(state_file.read_text())
