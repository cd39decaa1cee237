"""The workspace pool's bookkeeping, on the plain-process backend (fast, no bwrap): warm copies
taken first and refilled in the background, a fresh copy per sample, the sample's workspace in
its context, every folder removed at the end, a crashed run's folder swept at the next start,
setup failures, and the config's exact errors."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from agentloop.workspace import (
    SandboxError,
    WorkspaceConfig,
    WorkspacePool,
    WorkspaceTask,
    current_workspace,
)
from agentloop.workspace.source import make_run_root, sweep_stale


@pytest.fixture()
def task(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "value.txt").write_text("1")
    return WorkspaceTask(workspace=repo, problem="p", check=("sh", "-c", "test -f value.txt"))


def config(tmp_path, **kw) -> WorkspaceConfig:
    return WorkspaceConfig(root=str(tmp_path / "runs"), sandbox="process", **kw)


async def test_warm_copies_are_taken_first_and_refilled(tmp_path, task):
    pool = WorkspacePool(config(tmp_path, warm_per_task=2))
    await pool.warm_up([task])
    assert len(pool._warm[task.key]) == 2
    async with pool.sample(task) as ws:
        assert ws.warm and current_workspace() is ws
        assert (ws.path / "value.txt").read_text() == "1"
        (ws.path / "value.txt").write_text("edited")
        assert (await ws.check()).score == 1.0
    assert not ws.path.exists()
    await asyncio.gather(*pool._fillers.values())
    assert len(pool._warm[task.key]) == 2
    async with pool.sample(task) as again:
        assert (again.path / "value.txt").read_text() == "1"  # a fresh copy, not the edited one
    snapshot = pool.metrics.snapshot()
    assert snapshot["workspace/warm_hits"] == 2 and snapshot["workspace/sandbox_errors"] == 0
    assert snapshot["workspace/prepare_s"] > 0 and "workspace/check_s" in snapshot
    await pool.close()
    assert not (tmp_path / "runs").exists()


async def test_without_a_warm_pool_each_sample_copies_on_demand(tmp_path, task):
    pool = WorkspacePool(config(tmp_path, warm_per_task=0))
    async with pool.sample(task) as ws:
        assert not ws.warm
    assert pool._warm == {} and pool.metrics.warm_hits == 0
    await pool.close()


async def test_no_workspace_outside_a_sample():
    with pytest.raises(LookupError) as err:
        current_workspace()
    assert str(err.value) == (
        "no workspace in this context: run the sample inside WorkspacePool.sample(task)"
    )


async def test_a_failing_setup_is_a_sandbox_error_and_leaves_no_folder(tmp_path, task):
    bad = WorkspaceTask(
        workspace=task.workspace,
        problem="p",
        check=("true",),
        setup=("sh", "-c", "echo no; exit 3"),
    )
    pool = WorkspacePool(config(tmp_path, warm_per_task=0))
    with pytest.raises(SandboxError) as err:
        await pool.acquire(bad)
    assert str(err.value) == f"setup of {task.workspace} exited 3: no\n"
    assert pool.metrics.sandbox_errors == 1
    assert list(pool.run_root.iterdir()) == []
    await pool.close()


def test_a_crashed_runs_folder_is_swept_at_the_next_start(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a folder no live process owns
    stale = tmp_path / f"{dead.pid}-deadbeef"
    (stale / "ws-1" / "sub").mkdir(parents=True)
    os.chmod(stale / "ws-1", 0o500)  # a copy the agent made read-only
    live = tmp_path / f"{os.getppid()}-cafe0000"
    live.mkdir()
    run = make_run_root(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([run.name, live.name])
    assert sweep_stale(tmp_path) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warm_per_task": -1}, "workspace: warm_per_task and max_warm must be >= 0"),
        (
            {"max_concurrent_prepares": 0},
            "workspace: max_concurrent_prepares must be >= 1, got 0",
        ),
        (
            {"agent_timeout_s": 0},
            "workspace needs agent_timeout_s > 0, cpu_time_s >= 1, memory_mb >= 64",
        ),
        (
            {"max_processes": 1},
            "workspace needs max_file_mb >= 1, max_processes >= 2, max_output_bytes >= 1",
        ),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError) as err:
        WorkspaceConfig(**kwargs)
    assert str(err.value) == message


def test_where_bwrap_cannot_run_bwrap_is_refused_and_auto_falls_back(monkeypatch, caplog):
    from agentloop.workspace import runner

    monkeypatch.setattr(runner, "bwrap_problem", lambda: "bwrap is not installed")
    with pytest.raises(ValueError) as err:
        runner.resolve_backend("bwrap")
    assert str(err.value) == (
        "workspace sandbox: bwrap cannot run here (bwrap is not installed); install bubblewrap "
        "(apt-get install bubblewrap) or set sandbox: auto or process"
    )
    runner._warn_fallback.cache_clear()
    with caplog.at_level("WARNING", logger="agentloop.workspace.runner"):
        assert runner.resolve_backend("auto") == "process"
    assert "commands run as plain processes, which do not isolate the filesystem" in caplog.text


async def test_a_sample_runs_the_agent_then_the_check_even_after_the_agent_fails(tmp_path, task):
    from agentloop.workspace import run_workspace_sample

    pool = WorkspacePool(config(tmp_path, warm_per_task=0))

    async def fixer(ws):
        assert current_workspace() is ws
        return (await ws.run(["sh", "-c", "echo fixed"])).output

    async def crasher(ws):
        (ws.path / "value.txt").unlink()
        raise RuntimeError("boom")

    async def sleeper(ws):
        await ws.run(["sleep", "1000"], timeout_s=900)

    value, ok = await run_workspace_sample(pool, task, fixer, agent_timeout_s=60)
    assert value == b"fixed\n" and ok.score == 1.0 and ok.agent_error is None
    value, crashed = await run_workspace_sample(pool, task, crasher, agent_timeout_s=60)
    assert value is None and crashed.score == 0.0
    assert crashed.reward()["agent_error"] == "the agent failed: RuntimeError: boom"
    _, slow = await run_workspace_sample(pool, task, sleeper, agent_timeout_s=0.5)
    assert slow.agent_error == "the agent passed its 0.5 s limit and was stopped"
    assert slow.score == 1.0  # the check scores what the agent left
    await pool.close()
    assert not (tmp_path / "runs").exists()


async def test_two_pools_share_the_root_and_the_last_to_close_removes_it(tmp_path, task):
    first = WorkspacePool(config(tmp_path, warm_per_task=0))
    second = WorkspacePool(config(tmp_path, warm_per_task=0))
    await first.close()
    assert os.listdir(tmp_path / "runs") == [second.run_root.name]
    await second.close()
    assert not (tmp_path / "runs").exists()
