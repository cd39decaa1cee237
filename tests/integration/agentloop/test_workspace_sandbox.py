"""Repository-task workspaces in the real bubblewrap sandbox: a fresh copy per sample (folder,
.tar.gz and .zip sources, setup once per copy), the check (real pytest) as the reward, and the
faults contained: a hanging check killed at its limit (reward 0, reason), a write outside the
workspace refused, no network, a fork bomb stopped by the process limit, gigabytes of output cut
and a huge file stopped by the file-size limit; no process and no folder left after a sample, a
run, or a worker killed mid-command (its folder swept at the next start)."""

from __future__ import annotations

import asyncio
import os
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from agentloop.tools.sandbox import bwrap_problem
from agentloop.workspace import WorkspaceConfig, WorkspacePool, WorkspaceTask, task_of_row

pytestmark = pytest.mark.integration

if (_problem := bwrap_problem()) is not None:
    pytest.skip(
        f"bwrap sandbox unavailable here: {_problem} (apt-get install bubblewrap)",
        allow_module_level=True,
    )

PYTEST = "python -m pytest -q -rA -p no:cacheprovider -p no:asyncio tests/"
CALC = "def add(a, b):\n    return a - b\n"
TESTS = textwrap.dedent(
    """\
    from calc import add


    def test_add():
        assert add(1, 2) == 3


    def test_zero():
        assert add(0, 0) == 0
    """
)


@pytest.fixture()
def repo(tmp_path) -> Path:
    repo = tmp_path / "data" / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    return repo


@pytest.fixture()
def root(tmp_path) -> Path:
    return tmp_path / "workspaces"


def pool_of(root: Path, **kw) -> WorkspacePool:
    return WorkspacePool(WorkspaceConfig(root=str(root), sandbox="bwrap", **kw))


def processes_of(uid: int | None) -> list[int]:
    """Host processes running as ``uid`` (the workspace's own, as root)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except FileNotFoundError:
                pass
    return pids


async def left_after_exit(uid: int | None, wait_s: float = 60.0) -> list[int]:
    """``uid``'s processes still there after up to ``wait_s``: processes the kernel ends with
    their sandbox (a SIGKILLed pid namespace) take a moment to go on a loaded machine."""
    for _ in range(int(wait_s / 0.1)):
        if not processes_of(uid):
            return []
        await asyncio.sleep(0.1)
    return processes_of(uid)


def shell(script: str) -> list[str]:
    return ["sh", "-c", script]


async def test_the_check_is_the_reward_in_a_fresh_copy(repo, root):
    named = ("tests/test_calc.py::test_add", "tests/test_calc.py::test_zero")
    task = task_of_row(
        {"workspace": "repo", "problem": "fix add", "check": PYTEST, "check_timeout_s": 300,
         "partial": True, "tests": list(named)},
        0,
        repo.parent,
    )  # fmt: skip
    pool = pool_of(root, warm_per_task=1)
    async with pool.sample(task) as ws:
        before = await ws.check()
        assert (before.score, before.passed, before.failed, before.reason) == (0.5, 1, 1, None)
        assert "FAILED tests/test_calc.py::test_add" in before.output_tail
        fixed = await ws.run(shell("sed -i 's/a - b/a + b/' calc.py && id -u"))
        assert fixed.exit_code == 0 and fixed.output == f"{ws.uid}\n".encode()
        after = await ws.check()
        assert (after.score, after.passed, after.failed, after.exit_code) == (1.0, 2, 0, 0)
    assert repo.joinpath("calc.py").read_text() == CALC  # the task's own folder is untouched
    async with pool.sample(task) as again:
        assert again.warm and (again.path / "calc.py").read_text() == CALC
    await pool.close()
    assert not root.exists()


async def test_archives_are_unpacked_once_and_setup_runs_in_each_copy(repo, root, tmp_path):
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tf:
        tf.add(repo, arcname="repo")
    with zipfile.ZipFile(tmp_path / "repo.zip", "w") as zf:
        for path in repo.rglob("*"):
            zf.write(path, path.relative_to(repo))
    pool = pool_of(root, warm_per_task=0)
    for name in ("repo.tar.gz", "repo.zip"):
        task = WorkspaceTask(
            workspace=tmp_path / name,
            problem="p",
            check=("sh", "-c", "cat ready && test -f tests/test_calc.py"),
            setup=("sh", "-c", "echo set > ready"),
        )
        for _ in range(2):
            async with pool.sample(task) as ws:
                result = await ws.check()
                assert (result.score, result.output_tail) == (1.0, "set\n")
    assert sorted(p.name for p in pool.run_root.iterdir()) == ["source-0", "source-1"]
    await pool.close()
    assert not root.exists()


async def test_a_hanging_check_is_killed_at_its_limit_with_reward_zero(repo, root):
    task = WorkspaceTask(
        workspace=repo,
        problem="p",
        check=("sh", "-c", "sleep 1000 & sleep 1000"),
        check_timeout_s=2,
    )
    pool = pool_of(root, warm_per_task=0)
    async with pool.sample(task) as ws:
        result = await ws.check()
        assert result.score == 0.0 and result.timed_out
        assert result.reason == f"check timed out after {result.check_s:.1f} s and was killed"
        assert 2 <= result.check_s < 60
        assert await left_after_exit(ws.uid) == []
    assert pool.metrics.snapshot()["workspace/check_timeouts"] == 1
    await pool.close()


async def test_writes_outside_the_workspace_and_the_network_are_refused(repo, root, tmp_path):
    outside = tmp_path / "outside.txt"
    venv_file = Path(sys.prefix) / "escape.txt"
    # the folder the venv's mount point sits in (the checkout): made by bwrap, not writable
    beside_venv = Path(sys.prefix).parent / "escape.txt"
    task = WorkspaceTask(workspace=repo, problem="p", check=("true",))
    pool = pool_of(root, warm_per_task=0)
    async with pool.sample(task) as ws:
        result = await ws.run(
            shell(
                f"echo x > {outside}; echo x > {venv_file}; echo x > {beside_venv}; "
                'echo x > inside.txt; python -c "import socket; '
                "socket.create_connection(('1.1.1.1', 80), timeout=5)\" 2>&1 | tail -1"
            )
        )
        assert result.output.decode().splitlines() == [
            f"sh: 1: cannot create {outside}: Permission denied",
            f"sh: 1: cannot create {venv_file}: Read-only file system",
            f"sh: 1: cannot create {beside_venv}: Permission denied",
            "OSError: [Errno 101] Network is unreachable",
        ]
        assert (ws.path / "inside.txt").read_text() == "x\n"
    assert not outside.exists() and not venv_file.exists()
    assert not beside_venv.exists()
    await pool.close()


FORK_BOMB = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
except BlockingIOError as e:
    print(n < 32, e)
"""


async def test_a_fork_bomb_is_stopped_by_the_process_limit(repo, root):
    task = WorkspaceTask(workspace=repo, problem="p", check=("true",))
    pool = pool_of(root, warm_per_task=0, max_processes=32)
    async with pool.sample(task) as ws:
        result = await ws.run(["python", "-c", FORK_BOMB], timeout_s=120)
        assert result.output == b"True [Errno 11] Resource temporarily unavailable\n"
        assert result.exit_code == 0
        assert await left_after_exit(ws.uid) == []  # the sleeping children died with the sandbox
    await pool.close()


async def test_gigabytes_of_output_are_cut_and_a_huge_file_is_stopped(repo, root):
    task = WorkspaceTask(workspace=repo, problem="p", check=("true",))
    pool = pool_of(root, warm_per_task=0, max_output_bytes=1 << 20, max_file_mb=16)
    async with pool.sample(task) as ws:
        loud = await ws.run(["head", "-c", "4G", "/dev/zero"], timeout_s=300)
        assert loud.overflow and len(loud.output) == 1 << 20
        assert loud.reason == f"printed more than {1 << 20} bytes and was stopped"
        big = await ws.run(shell("head -c 200M /dev/zero > big.bin; echo $?"), timeout_s=300)
        # The launcher (Python) ignores SIGXFSZ, so the write past the limit fails with EFBIG.
        assert big.output == b"head: error writing 'standard output': File too large\n1\n"
        assert (ws.path / "big.bin").stat().st_size == 16 << 20
    await pool.close()
    assert not root.exists()


CRASHER = """
import asyncio, sys
from pathlib import Path
from agentloop.workspace import WorkspaceConfig, WorkspacePool, WorkspaceTask

async def main():
    pool = WorkspacePool(WorkspaceConfig(root=sys.argv[1], sandbox="bwrap", warm_per_task=2))
    task = WorkspaceTask(workspace=Path(sys.argv[2]), problem="p", check=("true",))
    ws = await pool.acquire(task)
    await pool.warm_up([task])
    run = asyncio.ensure_future(ws.run(["sh", "-c", "touch started; sleep 1000"], timeout_s=900))
    while not (ws.path / "started").exists():
        await asyncio.sleep(0.05)
    print(ws.uid, flush=True)
    await run

asyncio.run(main())
"""


async def test_a_killed_workers_processes_die_and_its_folders_are_swept(repo, root):
    repo_root = Path(__file__).resolve().parents[3]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHER, str(root), str(repo),
        stdout=asyncio.subprocess.PIPE, cwd=repo_root,
    )  # fmt: skip
    assert worker.stdout is not None
    uid = int((await asyncio.wait_for(worker.stdout.readline(), 300)).decode())
    assert processes_of(uid) != []
    worker.kill()
    await worker.wait()
    # --die-with-parent: the kernel ends the sandbox with the worker
    assert await left_after_exit(uid) == []
    (left,) = os.listdir(root)
    assert left.startswith(f"{worker.pid}-")
    pool = pool_of(root, warm_per_task=0)
    assert os.listdir(root) == [pool.run_root.name]
    await pool.close()
    assert not root.exists()
