"""Checkpoint folders: a save is atomic (a failed or interrupted one is never resumed from),
the latest file is a hint that falls back to a scan, old checkpoints are pruned, and a bad
folder fails with a message that says what to set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainer.loop.checkpoint import LATEST_FILE, CheckpointManager


class FakeWorkers:
    """Writes one file per requested content into the folder it is given."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, list[str]]] = []

    def save_checkpoint(self, directory: str, contents: list[str]) -> None:
        self.calls.append((directory, contents))
        os.makedirs(directory, exist_ok=True)
        for item in contents:
            Path(directory, item).write_text(item)
        if self.fail:
            raise RuntimeError("rank 1 died while saving")


def test_save_writes_the_step_folder_state_and_latest_file(tmp_path):
    manager = CheckpointManager(tmp_path)
    workers = FakeWorkers()
    path = manager.save(3, workers, ["model", "optimizer", "extra"], {"sampler": {"epoch": 1}})
    assert path == tmp_path.resolve() / "global_step_3"
    assert json.loads((path / "trainer_state.json").read_text()) == {
        "step": 3,
        "sampler": {"epoch": 1},
    }
    assert (path / "actor" / "model").read_text() == "model"
    assert workers.calls[0][1] == ["model", "optimizer"]  # "extra" is the driver's part
    assert (tmp_path / LATEST_FILE).read_text() == "3"
    assert manager.latest() == path
    assert CheckpointManager.load_state(path)["sampler"] == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", LATEST_FILE]


def test_extra_only_save_does_not_call_the_workers(tmp_path):
    workers = FakeWorkers()
    path = CheckpointManager(tmp_path).save(1, workers, ["extra"], {})
    assert workers.calls == [] and (path / "trainer_state.json").is_file()


def test_a_failed_save_leaves_no_step_folder_and_latest_stays(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = manager.save(1, FakeWorkers(), ["model"], {})
    with pytest.raises(RuntimeError, match="rank 1 died"):
        manager.save(2, FakeWorkers(fail=True), ["model"], {})
    assert not (tmp_path / "global_step_2").exists()
    assert (tmp_path / LATEST_FILE).read_text() == "1"
    assert manager.latest() == first
    # a retry of the same step replaces the leftover temporary folder
    second = manager.save(2, FakeWorkers(), ["model"], {})
    assert manager.latest() == second
    assert not (tmp_path / ".global_step_2.tmp").exists()


def test_a_leftover_tmp_folder_is_never_returned(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = manager.save(1, FakeWorkers(), ["model"], {})
    leftover = tmp_path / ".global_step_5.tmp"
    leftover.mkdir()
    (leftover / "trainer_state.json").write_text('{"step": 5}')  # complete but never renamed
    (tmp_path / LATEST_FILE).unlink()  # force the scan
    assert manager.latest() == first


def test_latest_is_none_without_checkpoints(tmp_path):
    assert CheckpointManager(tmp_path / "not_yet").latest() is None
    (tmp_path / "global_step_4").mkdir()  # a folder without trainer_state.json
    assert CheckpointManager(tmp_path).latest() is None


@pytest.mark.parametrize("content", ["garbage", "", "7"])
def test_a_corrupted_latest_file_falls_back_to_scanning(tmp_path, content):
    manager = CheckpointManager(tmp_path)
    for step in (2, 10, 4):
        manager.save(step, FakeWorkers(), ["model"], {})
    (tmp_path / LATEST_FILE).write_text(content)  # "7" names a checkpoint that is not there
    assert manager.latest() == tmp_path.resolve() / "global_step_10"


def test_the_latest_file_wins_over_a_newer_folder(tmp_path):
    """Resuming from an earlier step and saving again makes that step the latest."""
    manager = CheckpointManager(tmp_path)
    manager.save(5, FakeWorkers(), ["model"], {})
    manager.save(3, FakeWorkers(), ["model"], {"again": True})
    assert manager.latest() == tmp_path.resolve() / "global_step_3"
    assert CheckpointManager.load_state(manager.latest()) == {"step": 3, "again": True}


def test_max_keep_prunes_the_oldest_checkpoints(tmp_path):
    manager = CheckpointManager(tmp_path, max_keep=2)
    for step in range(1, 6):
        manager.save(step, FakeWorkers(), ["model"], {})
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [
        "global_step_4",
        "global_step_5",
    ]
    assert manager.latest() == tmp_path.resolve() / "global_step_5"


def test_no_max_keep_keeps_everything(tmp_path):
    manager = CheckpointManager(tmp_path, max_keep=None)
    for step in range(1, 4):
        manager.save(step, FakeWorkers(), ["model"], {})
    assert len(list(tmp_path.glob("global_step_*"))) == 3


def test_check_writable_creates_the_folder(tmp_path):
    manager = CheckpointManager(tmp_path / "a" / "b")
    manager.check_writable()
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())


def test_check_writable_on_a_folder_that_cannot_be_written_gives_a_clear_error(tmp_path):
    if os.geteuid() == 0:  # root ignores permission bits: a path under a regular file fails
        (tmp_path / "afile").write_text("x")
        root, reason = tmp_path / "afile" / "sub", "Not a directory"
    else:
        root, reason = tmp_path / "readonly", "Permission denied"
        root.mkdir()
        root.chmod(0o500)
    try:
        with pytest.raises(ValueError) as err:
            CheckpointManager(root).check_writable()
    finally:
        if root.is_dir():
            root.chmod(0o700)
    assert str(err.value) == (
        f"checkpoint folder {root.resolve()} is not writable ({reason}): set "
        "trainer.default_local_dir to a writable folder"
    )


def test_load_state_of_a_folder_that_is_not_a_checkpoint_gives_a_clear_error(tmp_path):
    with pytest.raises(ValueError) as err:
        CheckpointManager.load_state(tmp_path)
    assert str(err.value) == (
        f"{tmp_path} is not a checkpoint folder (no trainer_state.json): point "
        "trainer.resume_from_path at a global_step_N folder"
    )
