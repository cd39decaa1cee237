"""Generate the repo_fix task family: tiny Python packages with one seeded bug each, as
repository-task rows (``tool_agent`` with the workspace tools, the package's pytest run as the
check) and, for every train task, a solved conversation for the SFT warm start.

python -m recipes.repo_fix.make_tasks --out data/repo_fix --train 256 --val 64 --seed 0

Writes ``train.jsonl``, ``val.jsonl``, ``sft.jsonl`` and ``workspaces/<task id>/`` under
``--out``; rows name their workspace relative to the jsonl. The same arguments give the same
files. Train and val share no package. ``--recover F``: a fraction F of the SFT conversations
first read the wrong module and recover (``traces.recovering_conversation``); the tasks and
the other conversations are the same as without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.repo_fix.package import Package, SeededBug, draw_package
from recipes.repo_fix.templates import BUG_KINDS
from recipes.repo_fix.traces import (
    CHECK,
    SYSTEM,
    TOOL_SCHEMAS,
    problem_of,
    recovering_conversation,
    solved_conversation,
)

__all__ = ["Task", "draw_split", "make_tasks", "main", "recovering_tasks", "row_of", "sft_row_of"]

logger = logging.getLogger(__name__)

DATA_SOURCE = "repo_fix"
CHECK_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class Task:
    """One task: a package with one seeded bug."""

    task_id: str
    split: str
    index: int
    package: Package
    bug: SeededBug

    @property
    def workspace(self) -> str:
        """The workspace folder, relative to the jsonl files."""
        return f"workspaces/{self.task_id}"


def draw_split(
    rng: random.Random, n: int, split: str, taken_names: set[str], per_package: int = 3
) -> list[Task]:
    """``n`` tasks from new packages (names added to ``taken_names``), at most
    ``per_package`` bugs of each, picking the kinds used least so far so all kinds appear."""
    counts = dict.fromkeys(BUG_KINDS, 0)
    tasks: list[Task] = []
    while len(tasks) < n:
        package = draw_package(rng, taken_names)
        bugs = package.bugs()
        rng.shuffle(bugs)
        for _ in range(min(per_package, n - len(tasks), len(bugs))):
            bug = min(bugs, key=lambda b: counts[b.kind])  # first of the least used kind
            bugs.remove(bug)
            counts[bug.kind] += 1
            i = len(tasks)
            tasks.append(Task(f"{split}-{i:04d}-{package.name}", split, i, package, bug))
    return tasks


def row_of(task: Task, agent: str = "tool_agent") -> dict[str, Any]:
    """The repository-task row (docs/repo-tasks.md) of ``task``, run by agent loop ``agent``
    (a harness loop such as harness_loops.yaml's ``claude_code`` takes the row's ``problem``
    as its task and brings its own system prompt and tools)."""
    problem = problem_of(task.package, task.bug)
    package, bug = task.package, task.bug
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": problem},
        ],
        "data_source": DATA_SOURCE,
        "agent_name": agent,
        "extra_info": {
            "split": task.split,
            "index": task.index,
            "workspace_task": {
                "workspace": task.workspace,
                "problem": problem,
                "check": CHECK,
                "check_timeout_s": CHECK_TIMEOUT_S,
                # all or nothing, as a resolved issue: the bug's failing tests pass and no
                # other test breaks (partial credit over every test gave an idle sample ~0.9)
                "partial": False,
            },
            "repo_fix": {
                "package": package.name,
                "module": package.module_path(bug.module),
                "function": bug.function,
                "bug_kind": bug.kind,
                "failing_tests": [package.node_id(c) for c, _ in bug.failing],
            },
        },
    }


def sft_row_of(task: Task, recover: bool = False) -> dict[str, Any]:
    """The solved conversation of ``task`` as an ``agentloop-sft`` row; ``recover``: the one
    that reads the wrong module first and recovers."""
    make = recovering_conversation if recover else solved_conversation
    return {"messages": make(task.package, task.bug), "tools": TOOL_SCHEMAS}


def recovering_tasks(n: int, fraction: float, seed: int) -> set[int]:
    """Which of ``n`` train tasks get a recovering conversation: ``round(fraction * n)`` of
    them, drawn from their own generator so the tasks themselves do not change."""
    return set(random.Random(f"recover-{seed}").sample(range(n), round(fraction * n)))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_workspace(root: Path, task: Task) -> None:
    for rel, text in task.package.files(task.bug).items():
        path = root / task.workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_tasks(
    out: Path,
    train: int,
    val: int,
    seed: int,
    per_package: int = 3,
    agent: str = "tool_agent",
    recover: float = 0.0,
) -> dict[str, Any]:
    """Write the splits (rows for agent loop ``agent``), their workspaces and ``sft.jsonl``
    under ``out`` (a fraction ``recover`` of its conversations recovering from a wrong
    read); returns counts."""
    rng = random.Random(seed)
    taken: set[str] = set()
    train_tasks = draw_split(rng, train, "train", taken, per_package)
    val_tasks = draw_split(rng, val, "val", taken, per_package)
    shared = {t.package.name for t in train_tasks} & {t.package.name for t in val_tasks}
    assert not shared, f"train and val share packages {sorted(shared)}"
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "workspaces", ignore_errors=True)
    for task in train_tasks + val_tasks:
        _write_workspace(out, task)
    _write_jsonl(out / "train.jsonl", [row_of(t, agent) for t in train_tasks])
    _write_jsonl(out / "val.jsonl", [row_of(t, agent) for t in val_tasks])
    recovering = recovering_tasks(len(train_tasks), recover, seed)
    sft = [sft_row_of(t, i in recovering) for i, t in enumerate(train_tasks)]
    _write_jsonl(out / "sft.jsonl", sft)
    kinds = {k: sum(t.bug.kind == k for t in train_tasks + val_tasks) for k in BUG_KINDS}
    return {
        "train": len(train_tasks),
        "val": len(val_tasks),
        "train_packages": len({t.package.name for t in train_tasks}),
        "val_packages": len({t.package.name for t in val_tasks}),
        "bug_kinds": kinds,
        "recovering_conversations": len(recovering),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-package", type=int, default=3, help="at most this many bugged tasks per package"
    )
    parser.add_argument(
        "--agent",
        default="tool_agent",
        help="the rows' agent_name (claude_code or codex: harness_loops.yaml's loops)",
    )
    parser.add_argument(
        "--recover",
        type=float,
        default=0.0,
        help="the fraction of SFT conversations that read the wrong module first and recover",
    )
    args = parser.parse_args(argv)
    if min(args.train, args.val) < 0 or args.per_package < 1:
        parser.error("--train and --val must be >= 0 and --per-package >= 1")
    if not 0.0 <= args.recover <= 1.0:
        parser.error(f"--recover must be a fraction between 0 and 1, got {args.recover}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    summary = make_tasks(
        args.out, args.train, args.val, args.seed, args.per_package, args.agent, args.recover
    )
    logger.info("wrote %s to %s", json.dumps(summary), args.out)


if __name__ == "__main__":
    main()
