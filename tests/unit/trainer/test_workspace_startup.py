"""Start-up checks of workspace-task rows, through ``agentloop-rollout``'s and
``agentloop-train``'s start-up: a bad task is refused before any server starts, naming the data
file, the row and the key; a good one's relative workspace path is taken from the data file's
folder and written into the row as an absolute path, for the workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.cli.train import main as train_main
from trainer.loop.rollout_plan import plan_rollout

USER = [{"role": "user", "content": "Fix add() in calc.py."}]


def rows_file(path: Path, tasks: list[dict[str, Any]]) -> Path:
    rows = [
        {
            "prompt": USER,
            "agent_name": "tool_agent",
            "extra_info": {"index": i, "workspace_task": t},
        }
        for i, t in enumerate(tasks)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def overrides(tmp_path: Path, train: Path) -> list[str]:
    return [
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={train}",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]


@pytest.fixture()
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    (folder / "tasks" / "calc").mkdir(parents=True)
    return folder


GOOD = {"workspace": "tasks/calc", "check": "python -m pytest -q"}


def test_rollout_refuses_a_row_whose_workspace_is_missing(tmp_path, data):
    train = rows_file(data / "train.jsonl", [GOOD, {**GOOD, "workspace": "tasks/gone"}])
    with pytest.raises(ValueError) as err:
        plan_rollout([*overrides(tmp_path, train), f"+output={tmp_path / 'out.jsonl'}"])
    assert str(err.value) == (
        f"data.train_files ({train}): row 1: extra_info.workspace_task.workspace: "
        f"{data.resolve() / 'tasks' / 'gone'} does not exist"
    )


def test_train_refuses_a_row_with_a_bad_check_at_start_up(capsys, tmp_path, data):
    train = rows_file(data / "train.jsonl", [GOOD, GOOD, {**GOOD, "check": 42}])
    code = train_main(overrides(tmp_path, train))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err == (
        f"agentloop-train: error: data.train_files ({train}): row 2: "
        "extra_info.workspace_task.check must be a command: a non-empty string or a list of "
        "non-empty strings, got 42"
    )
    assert not (tmp_path / "run" / "config.yaml").exists()  # stopped before the run was written


def test_a_good_rows_workspace_becomes_absolute_for_the_workers(tmp_path, data, monkeypatch):
    train = rows_file(data / "train.jsonl", [GOOD])
    monkeypatch.chdir(tmp_path)  # the data file's folder counts, not the working directory
    plan = plan_rollout([*overrides(tmp_path, train), f"+output={tmp_path / 'out.jsonl'}"])
    task = plan.rows[0]["extra_info"]["workspace_task"]
    assert task == {
        "workspace": str(data.resolve() / "tasks" / "calc"),
        "check": "python -m pytest -q",
    }
