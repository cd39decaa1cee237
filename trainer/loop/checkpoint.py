"""Checkpoint folders and resume (driver side).

Layout (verl's names)::

    <default_local_dir>/
      latest_checkpointed_iteration.txt    # "N", written last
      global_step_N/
        trainer_state.json                 # step, data position, ... (``extra``)
        actor/dcp/                         # sharded model + optimizer (torch DCP)
        actor/optim_extra.pt               # lr scheduler, optimizer step count
        actor/huggingface/                 # transformers folder (``hf_model``; LoRA: adapter)
        actor/huggingface_merged/          # LoRA merged into a transformers folder (``hf_merged``)
        critic/dcp/, critic/optim_extra.pt # the value model's, when a critic trains (PPO/GAE)
        critic/huggingface/                # the value model (``critic.checkpoint.save_contents``)

A checkpoint is written into ``.global_step_N.tmp`` and renamed when complete, so a run killed
while saving never leaves a folder that resume would pick up. A save that fails (disk full,
folder gone read-only) removes its partial folder and raises ``CheckpointSaveError``; at
start-up the folder must be writable and hold one checkpoint (``check_free_space``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CheckpointManager", "CheckpointSaveError", "LATEST_FILE", "checkpoint_bytes"]

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; nothing of it was kept."""


def checkpoint_bytes(model_path: str | Path, contents: list[str], lora_rank: int = 0) -> int:
    """About how many bytes one checkpoint of the model at ``model_path`` takes (parameter
    counts from the safetensors headers, no weights read). A tied ``lm_head`` is written
    again in the sharded model state; the HF export also copies the tokenizer files.

    ``lora_rank`` > 0: the model state, optimizer state and ``hf_model`` export hold a LoRA
    adapter of that rank, counted as if every matrix but the embeddings and the head had one
    (an upper bound for any ``target_modules``); ``hf_merged`` is still the whole model."""
    from safetensors import safe_open

    folder = Path(model_path)
    numel, embed, adapter, keys = 0, 0, 0, set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                count = math.prod(shape)
                numel += count
                keys.add(key)
                if key.endswith("embed_tokens.weight"):
                    embed = count
                elif len(shape) == 2 and not key.startswith("lm_head."):
                    adapter += lora_rank * (shape[0] + shape[1])  # A: [r, in], B: [out, r]
    config = folder / "config.json"
    tied = config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings", False)
    model_numel = numel + (embed if tied and "lm_head.weight" not in keys else 0)
    trained = adapter if lora_rank > 0 else numel
    total = 0
    if "model" in contents:
        total += 4 * (adapter if lora_rank > 0 else model_numel)
    if "optimizer" in contents:
        total += 8 * trained
    others = sum(
        f.stat().st_size for f in folder.iterdir() if f.is_file() and f.suffix != ".safetensors"
    )
    if "hf_model" in contents:
        total += 4 * trained + others
    if "hf_merged" in contents:
        total += 4 * numel + others
    return total


def _reason(exc: BaseException) -> str:
    """The root cause's first line (a Ray task error wraps the rank's own exception, and a
    torch.distributed.checkpoint failure each rank's)."""
    cause = getattr(exc, "cause", None) or exc
    failures = getattr(cause, "failures", None)
    if isinstance(failures, dict) and failures:
        cause = next(iter(failures.values()))
        if isinstance(cause, tuple):  # (exception, traceback frames)
            cause = cause[0]
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else 'no detail'}"[:400]


class _Savable(Protocol):
    def save_checkpoint(self, directory: str, contents: list[str]) -> None: ...

    def save_critic(self, directory: str, contents: list[str]) -> None: ...


class CheckpointManager:
    def __init__(
        self, root: str | Path, max_keep: int | None = None, max_critic_keep: int | None = None
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.max_keep = max_keep
        self.max_critic_keep = max_critic_keep
        """Newest checkpoints that keep their ``critic/`` folder (``trainer.
        max_critic_ckpt_to_keep``); older ones lose it (a resume from them needs it)."""

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

    def check_free_space(self, need_bytes: int) -> None:
        """Fail at start-up when the folder's disk cannot hold one checkpoint."""
        free = shutil.disk_usage(self.root).free
        if free < need_bytes:
            raise ValueError(
                f"checkpoint folder {self.root} has {free / 1e6:.1f} MB free but one checkpoint "
                f"needs about {need_bytes / 1e6:.1f} MB: free space there, set "
                "trainer.default_local_dir to a bigger disk, or save less "
                "(actor_rollout_ref.actor.checkpoint.save_contents, trainer.save_freq=-1)"
            )

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def save(
        self,
        step: int,
        workers: _Savable,
        contents: list[str],
        state: dict[str, Any],
        critic_contents: list[str] | None = None,
    ) -> Path:
        """Write the step's checkpoint: the actor's ``contents``, the critic's
        ``critic_contents`` (None: no critic), and ``state`` (``trainer_state.json``)."""
        final = self.step_dir(step)
        tmp = self.root / f".global_step_{step}.tmp"
        latest_tmp = self.root / f".{LATEST_FILE}.tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            actor_contents = [c for c in contents if c != "extra"]
            if actor_contents:
                workers.save_checkpoint(str(tmp / "actor"), actor_contents)
            critic_parts = [c for c in critic_contents or [] if c != "extra"]
            if critic_parts:
                workers.save_critic(str(tmp / "critic"), critic_parts)
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            latest_tmp.write_text(str(step))
            os.replace(latest_tmp, self.root / LATEST_FILE)
        except Exception as exc:
            from ray.exceptions import RayTaskError

            if not isinstance(exc, OSError | RayTaskError):
                raise  # not a write failure (e.g. a rank died: its own error says so)
            free = shutil.disk_usage(self.root).free
            shutil.rmtree(tmp, ignore_errors=True)
            latest_tmp.unlink(missing_ok=True)
            previous = self.latest()
            kept = f"the last complete one is {previous}" if previous else "none was saved before"
            raise CheckpointSaveError(
                f"saving the step-{step} checkpoint in {self.root} failed ({_reason(exc)}; "
                f"{free / 1e6:.1f} MB were free on its disk); its partial folder was removed "
                f"and {kept}: free space there or set "
                "trainer.default_local_dir to another disk"
            ) from exc
        self._prune(step)
        logger.info("checkpoint saved: %s", final)
        return final

    def _prune(self, newest: int) -> None:
        for keep, sub in ((self.max_keep, None), (self.max_critic_keep, "critic")):
            if not keep or keep < 1:
                continue
            steps = sorted(s for s, _ in self._complete())
            for step in steps[: max(0, len(steps) - keep)]:
                if step != newest:
                    folder = self.step_dir(step)
                    shutil.rmtree(folder / sub if sub else folder, ignore_errors=True)

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
