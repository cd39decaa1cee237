"""Repository-task rows: where the task lives in a row, how paths resolve, and the exact error
each bad row gets at start-up (naming its index and key)."""

from __future__ import annotations

import tarfile

import pytest

from agentloop.workspace import WorkspaceTaskError, task_of_row, tasks_of_rows


@pytest.fixture()
def data_dir(tmp_path):
    (tmp_path / "repo").mkdir()
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tf:
        tf.add(tmp_path / "repo", arcname="repo")
    (tmp_path / "notes.txt").write_text("x")
    return tmp_path


def nested(**task):
    return {"extra_info": {"workspace_task": task, "tools_kwargs": {"calc": {}}}}


def test_nested_task_resolves_relative_paths_against_the_data_folder(data_dir):
    task = task_of_row(
        nested(workspace="repo", problem="fix it", check="python -m pytest -q", partial=True),
        0,
        data_dir,
    )
    assert task.workspace == data_dir / "repo"
    assert task.check == ("sh", "-c", "python -m pytest -q")
    assert task.partial and task.check_timeout_s == 300.0
    assert task.messages() == [{"role": "user", "content": "fix it"}]


def test_top_level_task_with_argv_check_archive_and_setup(data_dir):
    row = {
        "workspace": str(data_dir / "repo.tar.gz"),
        "problem": "p",
        "check": ["python", "-m", "pytest"],
        "setup": "touch ready",
        "check_timeout_s": 5,
        "tests": ["tests/test_a.py::test_x"],
    }
    task = task_of_row(row, 0, "/elsewhere")
    assert task.check == ("python", "-m", "pytest")
    assert task.setup == ("sh", "-c", "touch ready")
    assert task.tests == ("tests/test_a.py::test_x",)
    assert task.check_timeout_s == 5.0


def test_a_row_without_a_task_is_none_and_a_prompt_stands_in_for_problem(data_dir):
    assert task_of_row({"prompt": [{"role": "user", "content": "hi"}]}, 0, data_dir) is None
    row = {"prompt": [], "workspace": "repo", "check": "true"}
    assert task_of_row(row, 0, data_dir).problem is None


def test_same_workspace_and_setup_share_a_warm_pool_key(data_dir):
    a, b, c = tasks_of_rows(
        [
            nested(workspace="repo", problem="a", check="true"),
            nested(workspace="repo", problem="b", check="false"),
            nested(workspace="repo", problem="c", check="true", setup="make"),
        ],
        data_dir,
    )
    assert a.key == b.key != c.key


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            nested(workspace="missing", problem="p", check="true"),
            "row 2: extra_info.workspace_task.workspace: {d}/missing does not exist",
        ),
        (
            {"workspace": "notes.txt", "problem": "p", "check": "true"},
            "row 2: workspace: {d}/notes.txt is neither a folder nor a "
            ".tar/.tar.gz/.tgz/.zip archive",
        ),
        (
            nested(problem="p", check="true"),
            "row 2: extra_info.workspace_task.workspace is missing",
        ),
        (
            nested(workspace="repo", problem="p", check=42),
            "row 2: extra_info.workspace_task.check must be a command: a non-empty string or a "
            "list of non-empty strings, got 42",
        ),
        (
            nested(workspace="repo", problem="p", check=["python", ""]),
            "row 2: extra_info.workspace_task.check must be a command: a non-empty string or a "
            "list of non-empty strings, got ['python', '']",
        ),
        (
            {"workspace": "repo", "problem": "p", "check": "  "},
            "row 2: check must be a command: a non-empty string or a list of non-empty "
            "strings, got '  '",
        ),
        (
            {"workspace": "repo", "problem": "p"},
            "row 2: check is missing",
        ),
        (
            nested(workspace="repo", check="true"),
            "row 2: extra_info.workspace_task.problem is missing (and the row has no prompt)",
        ),
        (
            nested(workspace="repo", problem="p", check="true", check_timeout_s=0),
            "row 2: extra_info.workspace_task.check_timeout_s must be a number > 0, got 0",
        ),
        (
            nested(workspace="repo", problem="p", check="true", partial="yes"),
            "row 2: extra_info.workspace_task.partial must be true or false, got 'yes'",
        ),
        (
            nested(workspace="repo", problem="p", check="true", tests="tests/t.py::a"),
            "row 2: extra_info.workspace_task.tests must be a list of pytest node ids, "
            "got 'tests/t.py::a'",
        ),
        (
            nested(workspace="repo", problem="p", check="true", setup=[]),
            "row 2: extra_info.workspace_task.setup must be a command: a non-empty string or a "
            "list of non-empty strings, got []",
        ),
        (
            nested(workspace="repo", problem="p", check="true", timeout=3),
            "row 2: extra_info.workspace_task.timeout is not a task key (keys: ('workspace', "
            "'problem', 'check', 'check_timeout_s', 'setup', 'partial', 'tests'))",
        ),
        (
            {**nested(workspace="repo", problem="p", check="true"), "workspace": "repo"},
            "row 2: the task is given twice (top-level workspace/check and "
            "extra_info.workspace_task); keep one",
        ),
        (
            {"extra_info": {"workspace_task": "repo"}},
            "row 2: extra_info.workspace_task must be a mapping, got str",
        ),
    ],
)
def test_bad_rows_are_refused_naming_row_and_key(data_dir, row, message):
    good = nested(workspace="repo", problem="p", check="true")
    with pytest.raises(WorkspaceTaskError) as err:
        tasks_of_rows([good, good, row], data_dir)
    assert str(err.value) == message.format(d=data_dir)


def test_verl_tools_kwargs_still_reach_the_loop_beside_the_task(data_dir):
    from agentloop.worker import prepare_row

    row = nested(workspace="repo", problem="p", check="true")
    assert prepare_row(row, "tool_agent")["tools_kwargs"] == {"calc": {}}
    assert task_of_row(row, 0, data_dir).workspace == data_dir / "repo"
