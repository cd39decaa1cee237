"""Checkpoint folders on real, small tmpfs mounts (the tests run as root, as CI does):

- at start-up, ``agentloop-train`` refuses a folder that is read-only or cannot hold one
  checkpoint, before any server or trainer rank starts;
- during a save, a disk that fills up makes the save fail with ``CheckpointSaveError``: the
  partial folder is removed, resume still finds the previous checkpoint, and the trainer
  ranks load it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.trainer.test_train_startup import USER, run
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
from trainer.loop.checkpoint import CheckpointManager, CheckpointSaveError, checkpoint_bytes
from trainer.workers import WorkerGroup, WorkerSpec

pytestmark = pytest.mark.integration

CONTENTS = ["model", "optimizer", "extra", "hf_model"]  # the default save_contents


def mount_tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"these tests mount tmpfs and need root: {done.stderr}"


@pytest.fixture()
def mounts(tmp_path) -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def start_up_error(capsys, tmp_path: Path, run_dir: Path) -> str:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": USER}) + "\n" for _ in range(8)))
    return run(capsys, tmp_path, data, "trainer.save_freq=1", run_dir=run_dir)


def test_a_read_only_checkpoint_folder_fails_at_start_up(capsys, tmp_path, mounts):
    disk = tmp_path / "ro"
    mount_tmpfs(disk, "4m", "ro")
    mounts.append(disk)
    err = start_up_error(capsys, tmp_path, disk / "run")
    assert err == (
        f"checkpoint folder {disk / 'run'} is not writable (Read-only "
        "file system): set trainer.default_local_dir to a writable folder"
    )


def test_a_disk_without_room_for_one_checkpoint_fails_at_start_up(
    capsys, tmp_path, mounts, tiny_qwen3_path
):
    disk = tmp_path / "small"
    mount_tmpfs(disk, "8m")
    mounts.append(disk)
    need = checkpoint_bytes(tiny_qwen3_path, CONTENTS)
    free = shutil.disk_usage(disk).free
    err = start_up_error(capsys, tmp_path, disk / "run")
    assert err == (
        f"checkpoint folder {disk / 'run'} has {free / 1e6:.1f} MB free "
        f"but one checkpoint needs about {need / 1e6:.1f} MB: free space there, set "
        "trainer.default_local_dir to a bigger disk, or save less "
        "(actor_rollout_ref.actor.checkpoint.save_contents, trainer.save_freq=-1)"
    )
    assert not (disk / "run" / "global_step_1").exists()


def test_a_disk_that_fills_during_a_save_keeps_the_last_checkpoint_for_resume(
    tmp_path, mounts, tiny_qwen3_path, local_ray
):
    contents = ["model", "extra"]
    need = checkpoint_bytes(tiny_qwen3_path, contents)
    disk = tmp_path / "disk"
    mount_tmpfs(disk, f"{int(need * 1.6) >> 10}k")  # one checkpoint fits, two do not
    mounts.append(disk)
    manager = CheckpointManager(disk / "run")
    manager.check_writable()
    manager.check_free_space(need)
    path = str(tiny_qwen3_path)
    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path),
        actor=ActorConfig(),
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    group = WorkerGroup(spec, world_size=2)
    try:
        first = manager.save(1, group, contents, {"sampler": {"epoch": 0, "position": 1}})
        with pytest.raises(CheckpointSaveError) as err:
            manager.save(2, group, contents, {"sampler": {"epoch": 0, "position": 2}})
        message = str(err.value)
        assert message.startswith(f"saving the step-2 checkpoint in {disk / 'run'} failed (")
        # torch.save hides ENOSPC behind a zip-writer error; the free space tells the story
        assert re.search(r"; 0\.\d MB were free on its disk\); ", message), message
        assert message.endswith(
            f"its partial folder was removed and the last complete one is {first}: free space "
            "there or set trainer.default_local_dir to another disk"
        )
        assert sorted(p.name for p in (disk / "run").iterdir()) == [
            "global_step_1",
            "latest_checkpointed_iteration.txt",
        ]
        assert manager.latest() == first
        assert CheckpointManager.load_state(first)["step"] == 1
        group.load_checkpoint(str(first / "actor"))  # the ranks resume from it
    finally:
        group.shutdown()
