"""Workspace benchmark (``make bench``): what the warm pool and the sandbox cost, both sides in
one run.

1. Workspace prepare time on the sample's critical path (``acquire``): a task repo of 300 small
   files (~1.2 MB), 20 samples one after another, each holding its copy while a short agent
   command runs in it: with no warm pool (each copy made when the sample asks) vs a warm pool
   of 2 (copies made in the background); p50/p95. The copy time itself (``prepare_s``) is also
   reported.
2. Sandbox overhead per command: ``true`` and ``python -c pass`` run 20 times through the bwrap
   sandbox (``run_command``: bwrap, the rlimit launcher, uid drop) vs the same argv as a plain
   child process; p50/p95 and the difference of the p50s.
3. Check time: the repo's pytest check in the sandbox vs unsandboxed, 5 runs each.

Writes bench_results/workspace.json. Nothing is asserted but that the warm pool's p50 is
below the cold one's (a warm copy is taken, not made).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from agentloop.tools.sandbox import bwrap_problem
from agentloop.workspace import WorkspaceConfig, WorkspacePool, WorkspaceTask

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 20
COMMAND_RUNS = 20
CHECK_RUNS = 5
PYTEST = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio", "tests/")

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None,
    reason=f"bwrap sandbox unavailable here: {bwrap_problem()} (apt-get install bubblewrap)",
)


def pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": 1000 * statistics.median(ordered), "p95_ms": 1000 * p95, "n": len(values)}


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    for i in range(30):
        pkg = repo / f"pkg{i}"
        pkg.mkdir(parents=True)
        for j in range(10):
            (pkg / f"mod{j}.py").write_text(f"VALUE = {i * j}\n" + "# filler\n" * 400)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    return repo


async def acquire_times(root: Path, task: WorkspaceTask, warm: int) -> dict[str, object]:
    pool = WorkspacePool(WorkspaceConfig(root=str(root), sandbox="bwrap", warm_per_task=warm))
    if warm:
        await pool.warm_up([task])
    for _ in range(SAMPLES):
        async with pool.sample(task) as ws:
            await ws.run(["sh", "-c", "ls pkg0 > /dev/null"])
    out = {"acquire": pcts(pool.metrics.acquire_s), "prepare": pcts(pool.metrics.prepare_s)}
    out["warm_hits"] = pool.metrics.warm_hits
    await pool.close()
    return out


async def plain(argv: tuple[str, ...] | list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()
    return time.perf_counter() - start


async def command_times(root: Path, task: WorkspaceTask) -> dict[str, object]:
    pool = WorkspacePool(WorkspaceConfig(root=str(root), sandbox="bwrap", warm_per_task=0))
    results: dict[str, object] = {}
    async with pool.sample(task) as ws:
        venv_bin = Path(sys.prefix) / "bin"
        cases = {
            "true": ["true"],
            "python -c pass": ["python", "-c", "pass"],
            "pytest check": list(PYTEST),
        }
        for name, argv in cases.items():
            runs = CHECK_RUNS if name == "pytest check" else COMMAND_RUNS
            host_argv = [str(venv_bin / "python"), *argv[1:]] if argv[0] == "python" else argv
            await ws.run(argv)  # warm-up, both sides
            await plain(host_argv, ws.path)
            boxed, bare = [], []
            for _ in range(runs):
                result = await ws.run(argv, timeout_s=600)
                assert result.exit_code == 0, result.output[-500:]
                boxed.append(result.seconds)
                bare.append(await plain(host_argv, ws.path))
            b, u = pcts(boxed), pcts(bare)
            results[name] = {
                "sandboxed": b,
                "unsandboxed": u,
                "overhead_p50_ms": b["p50_ms"] - u["p50_ms"],
            }
    await pool.close()
    return results


def test_bench_workspace(tmp_path):
    repo = make_repo(tmp_path)
    task = WorkspaceTask(workspace=repo, problem="p", check=PYTEST, check_timeout_s=600)
    root = tmp_path / "workspaces"
    cold = asyncio.run(acquire_times(root, task, warm=0))
    warm = asyncio.run(acquire_times(root, task, warm=2))
    commands = asyncio.run(command_times(root, task))
    results = {"prepare_cold": cold, "prepare_warm": warm, "commands": commands}
    results["load_avg_1m"] = os.getloadavg()[0]
    lines = [
        f"workspace acquire, no warm pool: p50 {cold['acquire']['p50_ms']:.1f} ms, "
        f"p95 {cold['acquire']['p95_ms']:.1f} ms",
        f"workspace acquire, warm pool of 2: p50 {warm['acquire']['p50_ms']:.1f} ms, "
        f"p95 {warm['acquire']['p95_ms']:.1f} ms ({warm['warm_hits']}/{SAMPLES} warm)",
        f"copy time (cp --reflink=auto + chown): p50 {cold['prepare']['p50_ms']:.1f} ms",
    ]
    for name, row in commands.items():
        lines.append(
            f"{name}: sandboxed p50 {row['sandboxed']['p50_ms']:.1f} ms "
            f"(p95 {row['sandboxed']['p95_ms']:.1f}), unsandboxed p50 "
            f"{row['unsandboxed']['p50_ms']:.1f} ms (p95 {row['unsandboxed']['p95_ms']:.1f}); "
            f"overhead p50 {row['overhead_p50_ms']:.1f} ms"
        )
    lines.append(f"machine load (1 min average) at the end: {results['load_avg_1m']:.1f}")
    print("\n" + "\n".join(lines))
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "workspace.json").write_text(json.dumps(results, indent=2))
    assert warm["acquire"]["p50_ms"] < cold["acquire"]["p50_ms"]
