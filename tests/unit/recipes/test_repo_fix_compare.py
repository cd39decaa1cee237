"""``recipes.repo_fix.compare`` over ``recipes.paired``: held-out tasks paired task by task,
solved read as the check's score, each dump's tool habits counted from its calls, and dumps
that cannot be paired refused."""

from __future__ import annotations

import json
import random

import pytest

from recipes.paired import read_dump
from recipes.repo_fix.compare import Habits, buggy_module, first_read, habits, main, solved
from recipes.repo_fix.make_tasks import draw_split
from recipes.repo_fix.traces import problem_of


def call(name: str, ok: bool = True) -> dict:
    return {"name": name, "arguments": {}, "ok": ok, "seconds": 0.1, "repaired": False}


READ, FIX, CHECK = call("read_file"), call("str_replace"), call("run_check")


def dump(path, samples: list[tuple[bool, list[dict], str]], start: int = 0):
    """A dump of samples: (passed, calls, stop_reason) each, row indices from ``start``."""
    with path.open("w") as f:
        for i, (passed, calls, stop) in enumerate(samples, start):
            record = {"index": i, "step": 0, "score": float(passed), "scores": {}}
            record |= {"calls": calls, "stop_reason": stop}
            f.write(json.dumps(record) + "\n")
    return path


def test_solved_is_a_check_score_of_1():
    assert solved({"score": 1.0}) and not solved({"score": 0.0})
    assert not solved({"score": 0.5})  # partial credit: some tests still fail
    with pytest.raises(ValueError) as info:
        solved({"index": 3})
    assert str(info.value) == (
        "row index 3: no score; compare the dumps of a repo_fix run (trainer.validation_data_dir)"
    )


def test_a_dumps_habits_count_calls_applied_edits_checks_and_cuts(tmp_path, capsys):
    path = dump(
        tmp_path / "a.jsonl",
        [
            (True, [READ, FIX, CHECK], "no_tool_call"),
            (False, [READ, call("str_replace", ok=False), CHECK, CHECK], "length"),
            (False, [READ, call("write_file")], "no_tool_call"),
            (False, [], "no_tool_call"),
        ],
    )
    got = habits(read_dump(path))
    assert got == Habits(
        samples=4, pass_rate=0.25, tool_calls=2.25, edits=0.5, ran_check=2, no_edit=2, cut=1
    )
    main([str(path)])  # one dump alone: its habits only
    assert capsys.readouterr().out == (
        "A: 4 samples, 25.0% pass, 2.25 tool calls and 0.50 applied edits a sample, 2 ran the "
        "check, 2 without an edit, 1 cut at the length limit, 0 read the buggy module first and 0 "
        "another file\n"
    )
    with pytest.raises(ValueError) as info:
        habits([])
    assert str(info.value) == "the dump holds no samples"


def test_two_runs_pair_by_task(tmp_path, capsys):
    a = dump(tmp_path / "a.jsonl", [(p, [READ, FIX], "no_tool_call") for p in (1, 1, 0, 1, 0)])
    b = dump(tmp_path / "b.jsonl", [(p, [READ], "length") for p in (0, 1, 0, 0, 0)])
    main([str(a), str(b)])
    assert capsys.readouterr().out == (
        "A: 5 samples, 60.0% pass, 2.00 tool calls and 1.00 applied edits a sample, 0 ran the "
        "check, 0 without an edit, 0 cut at the length limit, 0 read the buggy module first and 0 "
        "another file\n"
        "B: 5 samples, 20.0% pass, 1.00 tool calls and 0.00 applied edits a sample, 0 ran the "
        "check, 5 without an edit, 5 cut at the length limit, 0 read the buggy module first and 0 "
        "another file\n"
        "5 tasks: A 60.0%, B 20.0%, A - B +40.0 points (paired SE 28.3); A alone 2, B alone 0; "
        "sign test p = 0.5\n"
    )


def test_a_training_dump_and_other_tasks_are_not_paired(tmp_path, capsys):
    one = dump(tmp_path / "one.jsonl", [(True, [FIX], "no_tool_call"), (False, [], "length")])
    group = tmp_path / "3.jsonl"  # a training dump: each task sampled twice
    group.write_text(one.read_text() * 2)
    with pytest.raises(ValueError) as info:
        main([str(one), str(group)])
    assert str(info.value) == (
        f"{group}: row index 0 appears more than once (a training dump, or "
        "rollout.val_kwargs.n > 1), so there is no one sample a row to pair; pass it alone for "
        "its habits"
    )
    other = dump(tmp_path / "other.jsonl", [(True, [], "length")] * 2, start=1)
    with pytest.raises(ValueError) as info:
        main([str(one), str(other)])
    assert str(info.value) == (
        "the dumps hold different rows (e.g. index [0, 2]); compare validations of the same "
        "data.val_files"
    )


def test_the_buggy_module_is_read_from_the_problem_of_every_generated_task():
    tasks = draw_split(random.Random(0), 60, "val", set())
    for task in tasks:
        problem = problem_of(task.package, task.bug)
        assert buggy_module(problem) == task.package.module_path(task.bug.module)
    assert buggy_module("Fix the bug.") is None


def test_first_read_names_the_buggy_module_another_file_or_none(tmp_path):
    task = draw_split(random.Random(3), 1, "val", set())[0]
    problem = problem_of(task.package, task.bug)
    module = task.package.module_path(task.bug.module)
    other = next(task.package.module_path(m) for m in task.package.modules if m != task.bug.module)

    def read(path: str) -> dict:
        return {**READ, "arguments": {"path": path}}

    samples = [
        {"calls": [read(module), FIX], "prompt_text": problem},
        {"calls": [read(f"./{module}")], "prompt_text": problem},
        {"calls": [read(other), read(module)], "prompt_text": problem},
        {"calls": [FIX], "prompt_text": problem},
        {"calls": [read(module)]},
    ]
    assert [first_read(r) for r in samples] == ["buggy", "buggy", "other", "none", "unknown"]
    path = tmp_path / "a.jsonl"
    with path.open("w") as f:
        for i, record in enumerate(samples):
            f.write(
                json.dumps({"index": i, "score": 0.0, "stop_reason": "length", **record}) + "\n"
            )
    got = habits(read_dump(path))
    assert (got.read_buggy, got.read_other) == (2, 1)
