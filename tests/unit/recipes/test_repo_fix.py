"""The repo_fix task family: deterministic generation, every bug kind, bugs that the real
pytest check sees (exactly the named tests fail, the SFT trace's fix passes them all),
disjoint splits, rows ``tasks_of_rows`` accepts and SFT rows that encode on tiny-qwen3."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentloop.formats import get_format
from agentloop.parsers import check_calls
from agentloop.tokens import mask_spans
from agentloop.workspace import WorkspaceTask, score_check, tasks_of_rows
from agentloop.workspace.runner import CommandResult
from recipes.repo_fix.make_tasks import draw_split, main, make_tasks, recovering_tasks
from recipes.repo_fix.package import draw_package
from recipes.repo_fix.templates import BUG_KINDS, TEMPLATES
from recipes.repo_fix.traces import CHECK, TOOL_SCHEMAS, numbered
from trainer.sft.data import encode_rows

_FAILED = re.compile(r"^FAILED (\S+::\S+)", re.MULTILINE)


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repo_fix")
    make_tasks(out, train=20, val=6, seed=0)
    return out


def _env(pythonpath: list[Path] | None = None) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the venv's plugins cost seconds per start
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


def _fix(workspace: Path, sft_row: dict[str, Any]) -> None:
    """Apply the SFT trace's ``str_replace`` call to the workspace."""
    (call,) = [
        m["tool_calls"][0]["function"]
        for m in sft_row["messages"]
        if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "str_replace"
    ]
    path = workspace / call["arguments"]["path"]
    text = path.read_text()
    assert text.count(call["arguments"]["old"]) == 1
    path.write_text(text.replace(call["arguments"]["old"], call["arguments"]["new"]))


def test_the_same_seed_writes_the_same_files_and_another_seed_others(tmp_path):
    make_tasks(tmp_path / "a", train=8, val=3, seed=5)
    make_tasks(tmp_path / "b", train=8, val=3, seed=5)
    make_tasks(tmp_path / "c", train=8, val=3, seed=6)
    a = _tree(tmp_path / "a")
    assert a == _tree(tmp_path / "b")
    assert a["train.jsonl"] != _tree(tmp_path / "c")["train.jsonl"]
    assert len(_read(tmp_path / "a" / "train.jsonl")) == 8
    assert len(_read(tmp_path / "a" / "sft.jsonl")) == 8
    assert len(_read(tmp_path / "a" / "val.jsonl")) == 3


def test_every_bug_kind_is_drawn_and_every_template_bug_fails_a_test():
    tasks = draw_split(random.Random(1), 10, "train", set())
    assert {t.bug.kind for t in tasks} == set(BUG_KINDS)
    rng, taken, seen = random.Random(2), set(), set()
    for _ in range(80):
        package = draw_package(rng, taken)
        seen |= {(b.template, b.kind) for b in package.bugs()}
    declared = {(key, b.kind) for key, t in TEMPLATES.items() for b in t.bugs}
    assert seen == declared


def test_splits_share_no_package_and_rows_are_repository_tasks(data):
    train, val = _read(data / "train.jsonl"), _read(data / "val.jsonl")
    train_packages = {r["extra_info"]["repo_fix"]["package"] for r in train}
    val_packages = {r["extra_info"]["repo_fix"]["package"] for r in val}
    assert train_packages and val_packages and not train_packages & val_packages
    tasks = tasks_of_rows(train + val, data)
    for row, task in zip(train + val, tasks, strict=True):
        assert isinstance(task, WorkspaceTask)
        info = row["extra_info"]
        assert task.workspace == (data / info["workspace_task"]["workspace"]).resolve()
        assert task.check == ("sh", "-c", CHECK) and not task.partial
        assert info["repo_fix"]["failing_tests"]
        assert row["agent_name"] == "tool_agent" and row["data_source"] == "repo_fix"
        assert row["prompt"][-1] == {"role": "user", "content": task.problem}
        for test in info["repo_fix"]["failing_tests"]:
            assert f"`{test}` expects" in task.problem
        assert (task.workspace / info["repo_fix"]["module"]).is_file()


def _one_per_kind(data: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(row, sft row) of a train task per bug kind, each from a different package."""
    rows, sft = _read(data / "train.jsonl"), _read(data / "sft.jsonl")
    chosen: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    packages: set[str] = set()
    for row, sft_row in zip(rows, sft, strict=True):
        info = row["extra_info"]["repo_fix"]
        if info["bug_kind"] not in chosen and info["package"] not in packages:
            chosen[info["bug_kind"]] = (row, sft_row)
            packages.add(info["package"])
    assert set(chosen) == set(BUG_KINDS)
    return list(chosen.values())


def _pytest_failures(data: Path, picked: list[tuple[dict[str, Any], dict[str, Any]]]) -> set[str]:
    """One real pytest run over the picked workspaces; the failed node ids, as
    ``<workspace>::<test node id>``."""
    spaces = [data / row["extra_info"]["workspace_task"]["workspace"] for row, _ in picked]
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    run = subprocess.run(
        argv + [str(s.relative_to(data) / "tests") for s in spaces],
        cwd=data,
        env=_env(spaces),
        capture_output=True,
        text=True,
    )
    failed = set()
    for node in _FAILED.findall(run.stdout):
        workspace, _, test = node.partition("/tests/")
        failed.add(f"{workspace}::tests/{test}")
    assert run.returncode == (1 if failed else 0), run.stdout[-2000:]
    return failed


def test_pytest_fails_exactly_the_named_tests_and_passes_after_the_traced_fix(tmp_path, data):
    """One real pytest run over a bugged workspace of each kind, then over the same
    workspaces fixed by their SFT trace's str_replace."""
    work = tmp_path / "data"
    (work / "workspaces").mkdir(parents=True)
    picked = _one_per_kind(data)
    for row, _ in picked:
        ws = row["extra_info"]["workspace_task"]["workspace"]
        subprocess.run(["cp", "-a", str(data / ws), str(work / ws)], check=True)
    expected = {
        f"{row['extra_info']['workspace_task']['workspace']}::{t}"
        for row, _ in picked
        for t in row["extra_info"]["repo_fix"]["failing_tests"]
    }
    assert _pytest_failures(work, picked) == expected
    for row, sft_row in picked:
        _fix(work / row["extra_info"]["workspace_task"]["workspace"], sft_row)
    assert _pytest_failures(work, picked) == set()


def _check(task: WorkspaceTask, cwd: Path) -> float:
    """The row's own check, run as the workspace reward runs it (``sh -c`` in the
    workspace, unsandboxed here), scored by ``score_check``."""
    start = time.monotonic()
    run = subprocess.run(task.check, cwd=cwd, env=_env(), stdout=-1, stderr=subprocess.STDOUT)
    result = CommandResult(run.returncode, run.stdout, time.monotonic() - start)
    return score_check(task, result, 4000).score


def test_the_rows_check_scores_the_bugged_copy_0_and_the_fixed_one_1(tmp_path, data):
    (row,) = _read(data / "train.jsonl")[:1]
    (sft_row,) = _read(data / "sft.jsonl")[:1]
    (task,) = tasks_of_rows([row], data)
    assert task is not None
    work = tmp_path / "ws"
    subprocess.run(["cp", "-a", str(task.workspace), str(work)], check=True)
    assert _check(task, work) == 0.0
    _fix(work, sft_row)
    assert _check(task, work) == 1.0


def test_sft_rows_encode_on_tiny_qwen3_with_calls_the_rollout_parses(tokenizer, data):
    rows, sft = _read(data / "train.jsonl"), _read(data / "sft.jsonl")
    samples = encode_rows(sft, tokenizer, max_length=4096)
    assert len(samples) == len(sft)
    parser = get_format("qwen").new_parser()
    schemas = {s["function"]["name"]: s for s in TOOL_SCHEMAS}
    for row, sft_row, sample in zip(rows, sft, samples, strict=True):
        turns = [
            tokenizer.decode(s, skip_special_tokens=False)
            for s in mask_spans(sample.response_ids, sample.response_mask, 1)
        ]
        assert len(turns) == 4
        calls = [check_calls(parser.parse(t), schemas).calls for t in turns[:3]]
        assert [c.name for (c,) in calls] == ["read_file", "str_replace", "run_check"]
        module = row["extra_info"]["repo_fix"]["module"]
        assert calls[0][0].arguments == {"path": module}
        assert calls[1][0].arguments["path"] == module
        workspace = data / row["extra_info"]["workspace_task"]["workspace"]
        assert sft_row["messages"][3]["content"] == numbered((workspace / module).read_text())
        assert sft_row["messages"][1]["content"] == row["prompt"][1]["content"]


def test_tool_schemas_are_the_workspace_tools_schemas():
    from agentloop.tools.function import schema_from_function
    from agentloop.workspace import tools

    assert TOOL_SCHEMAS == [schema_from_function(getattr(tools, n)) for n in tools.TOOL_NAMES]


def test_the_cli_refuses_a_per_package_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--per-package", "0"])
    assert capsys.readouterr().err.endswith(
        "error: --train and --val must be >= 0 and --per-package >= 1\n"
    )


def test_the_cli_writes_rows_for_the_agent_loop_it_is_given(tmp_path):
    main(["--out", str(tmp_path), "--train", "2", "--val", "1", "--agent", "claude_code"])
    rows = [json.loads(line) for name in ("train", "val") for line in
            (tmp_path / f"{name}.jsonl").read_text().splitlines()]  # fmt: skip
    assert [r["agent_name"] for r in rows] == ["claude_code"] * 3


def test_recovering_conversations_read_the_other_module_first_and_train_only_the_recovery(
    tokenizer, data, tmp_path
):
    """``--recover 0.25``: 5 of the 20 conversations first read the package's other module
    (weight 0: in the trajectory, untrained), then the bugged one; the tasks, the rows and the
    other conversations are those of the run without it, and the recovered fix still passes."""
    out = tmp_path / "recover"
    summary = make_tasks(out, train=20, val=6, seed=0, recover=0.25)
    assert summary["recovering_conversations"] == 5
    for name in ("train.jsonl", "val.jsonl"):
        assert (out / name).read_bytes() == (data / name).read_bytes()
    assert _tree(out / "workspaces") == _tree(data / "workspaces")
    plain, sft = _read(data / "sft.jsonl"), _read(out / "sft.jsonl")
    changed = [i for i, (a, b) in enumerate(zip(plain, sft, strict=True)) if a != b]
    assert set(changed) == recovering_tasks(20, 0.25, 0) and len(changed) == 5
    parser = get_format("qwen").new_parser()
    schemas = {s["function"]["name"]: s for s in TOOL_SCHEMAS}
    rows = _read(data / "train.jsonl")
    for i in changed:
        row, messages = rows[i], sft[i]["messages"]
        module = row["extra_info"]["repo_fix"]["module"]
        workspace = data / row["extra_info"]["workspace_task"]["workspace"]
        (sample,) = encode_rows([sft[i]], tokenizer, max_length=4096)
        untrained = [
            tokenizer.decode(s, skip_special_tokens=False)
            for s in mask_spans(sample.response_ids, sample.response_mask, 0)
        ]
        ((wrong,),) = [check_calls(parser.parse(untrained[0]), schemas).calls]
        assert wrong.name == "read_file" and wrong.arguments["path"] != module
        assert messages[2]["weight"] == 0
        other = wrong.arguments["path"]
        assert messages[3]["content"] == numbered((workspace / other).read_text())
        trained = [
            tokenizer.decode(s, skip_special_tokens=False)
            for s in mask_spans(sample.response_ids, sample.response_mask, 1)
        ]
        assert len(trained) == 4  # the recovering read, the fix, the check, the answer
        calls = [check_calls(parser.parse(t), schemas).calls for t in trained[:3]]
        assert [c.name for (c,) in calls] == ["read_file", "str_replace", "run_check"]
        assert calls[0][0].arguments == {"path": module}
        assert f"is not in {other}; the problem lists it in {module}" in trained[0]
        assert messages[5]["content"] == numbered((workspace / module).read_text())
    first = changed[0]  # the recovered conversation's fix passes the row's check
    copy = tmp_path / "fixed"
    shutil.copytree(data / rows[first]["extra_info"]["workspace_task"]["workspace"], copy)
    _fix(copy, sft[first])
    (task,) = tasks_of_rows([rows[first]], data)
    assert _check(task, copy) == 1.0


def test_the_cli_refuses_a_recover_fraction_outside_0_1(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--recover", "1.5"])
    assert capsys.readouterr().err.endswith(
        "error: --recover must be a fraction between 0 and 1, got 1.5\n"
    )
