"""``servers.scratch``: an engine's temporary files go to a folder its server owns (named after
its pid), which a later server sweeps once that pid is gone and the session's leak check
(``tests.shm``) reports while nobody owns it. The real engine leaving nothing in the temp dir
is ``tests/integration/servers/test_serve_cli.py``'s."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from servers.scratch import SCRATCH_PREFIX, engine_temp_dir, new_engine_scratch
from servers.shm import SHM, owner_pid, remove_shm, shm_entries
from servers.weights import sweep_orphans
from tests.shm import leaked


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("agentloop-vllm-4242-x1y", 4242),
        ("agentloop-lora-17-abc", 17),
        ("sem.loky-99-x", 99),
        ("agentloop-vllm-x-1", None),
        ("psm_4242", None),
    ],
)
def test_owner_pid_is_the_pid_a_folder_or_semaphore_is_named_after(name, pid):
    assert owner_pid(name) == pid


def test_the_temp_dir_is_the_engines_folder_while_it_starts_and_restored_after(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", "/var/tmp")
    before = tempfile.gettempdir()
    folder = new_engine_scratch(tmp_path)
    assert folder.parent == tmp_path and folder.name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-")
    with engine_temp_dir(folder):
        assert tempfile.gettempdir() == str(folder) and os.environ["TMPDIR"] == str(folder)
        child = subprocess.run(
            [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.strip() == str(folder)  # the engine's processes inherit it
    assert tempfile.gettempdir() == before and os.environ["TMPDIR"] == "/var/tmp"
    monkeypatch.delenv("TMPDIR")
    with engine_temp_dir(folder):
        pass
    assert "TMPDIR" not in os.environ  # unset before: unset after


def test_a_dead_servers_scratch_folder_is_swept_and_a_live_ones_kept(dead_pid, tmp_path):
    orphan = tmp_path / f"{SCRATCH_PREFIX}{dead_pid}-abc"
    orphan.mkdir()
    (orphan / "vllm_dist_0123").write_text("store")
    mine = new_engine_scratch(tmp_path)
    assert sweep_orphans(tmp_path) == 1
    assert not orphan.exists() and mine.is_dir()


@pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")
def test_a_scratch_folder_nobody_owns_is_a_leak_and_is_removed_by_name(dead_pid):
    before = shm_entries()
    live = new_engine_scratch(SHM)
    dead = SHM / f"{SCRATCH_PREFIX}{dead_pid}-abc"
    dead.mkdir()
    try:
        assert live.name in shm_entries() and dead.name in shm_entries()
        assert leaked(before, wait_s=0) == [dead.name]  # this process owns the live one
        assert remove_shm([dead.name, live.name]) == [dead.name, live.name]
        assert not dead.exists() and not live.exists()
    finally:
        for folder in (live, dead):
            shutil.rmtree(folder, ignore_errors=True)
