"""Tracking backends against their real stores: MLflow's sqlite store read back with
``MlflowClient``, TensorBoard event files read with ``EventAccumulator``, the JSON-lines file,
the console log; plus the failure policy (construction errors raise, logging errors warn once)."""

from __future__ import annotations

import json
import logging
import math
import sys
import types
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.metrics import tracking
from trainer.metrics.tracking import BACKENDS, Tracking

CONFIG = {
    "trainer": {"project_name": "proj", "logger": ["console", "mlflow"]},
    "actor": {"optim": {"lr": 1e-6}, "ppo_epochs": 1},
}


def _run(run_dir: Path, backends: list[str], steps: range, **kwargs: Any) -> Tracking:
    """A Tracking that logged ``steps`` (reward/mean = step / 10) and was finished."""
    t = Tracking(backends, project="proj", experiment="exp", run_dir=run_dir, **kwargs)
    for step in steps:
        t.log({"reward/mean": step / 10, "timing_s/step": 1.5 * step}, step=step)
    t.finish()
    return t


def _sqlite_uri(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'mlruns.db').resolve()}"


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_unknown_backend_raises_naming_it_and_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'mlfow'") as err:
        Tracking(["console", "mlfow"], project="p", experiment="e", run_dir=tmp_path)
    assert all(name in str(err.value) for name in BACKENDS)


def test_missing_wandb_raises_with_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails even if installed
    with pytest.raises(ValueError) as err:
        Tracking(["jsonl", "wandb"], project="p", experiment="e", run_dir=tmp_path)
    assert str(err.value) == (
        "trainer.logger contains 'wandb' but the wandb package is not installed: "
        "pip install wandb, or remove wandb from trainer.logger"
    )
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing started before the error


def test_console_logs_step_and_one_sorted_line_per_prefix_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = {
        "reward/mean": 0.123456,
        "actor/pg_loss": -0.01234567,
        "actor/grad_norm": 12345.678,
        "reward/max": 1.0,
        "timing_s/gen": float("nan"),
        "lr": 1e-6,
    }
    caplog.set_level(logging.INFO, logger="agentloop.train")
    t = Tracking(["console"], project="p", experiment="e", run_dir=tmp_path)
    t.log(metrics, step=7)
    t.finish()
    records = [r for r in caplog.records if r.name == "agentloop.train"]
    assert len(records) == 1
    lines = records[0].getMessage().splitlines()
    assert lines[0] == "step 7"
    assert [line.split()[0] for line in lines[1:]] == ["actor", "reward", "timing_s", "other"]
    assert lines[1].split()[1:] == ["grad_norm=1.235e+04", "pg_loss=-0.01235"]
    assert lines[2].split()[1:] == ["max=1", "mean=0.1235"]
    assert lines[3].split()[1:] == ["gen=nan"]
    assert lines[4].split()[1:] == ["lr=1e-06"]


def test_console_wraps_a_long_group_under_its_column(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentloop.train")
    metrics = {f"timing_s/phase_{i:02d}": 1.0 + i for i in range(30)}
    t = Tracking(["console"], project="p", experiment="e", run_dir=tmp_path)
    t.log(metrics | {"actor/kl": 0.5}, step=1)
    lines = caplog.records[-1].getMessage().splitlines()
    assert all(len(line) <= 120 for line in lines)
    assert lines[1].split() == ["actor", "kl=0.5"]
    continuation = lines[3:]
    assert continuation and all(line.startswith(" " * 12) for line in continuation)
    items = " ".join(lines[2:]).split()[1:]
    assert items == [f"phase_{i:02d}={1.0 + i:.4g}" for i in range(30)]


def test_jsonl_appends_one_line_per_step_across_resumed_instances(tmp_path: Path) -> None:
    _run(tmp_path, ["jsonl"], range(1, 4))
    t = Tracking(["jsonl"], project="p", experiment="e", run_dir=tmp_path)
    t.log({"reward/mean": float("nan"), "training/epoch": 1}, step=4)
    t.finish()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0] == {"step": 1, "reward/mean": 0.1, "timing_s/step": 1.5}
    assert math.isnan(rows[3]["reward/mean"]) and rows[3]["training/epoch"] == 1.0


def test_jsonl_resume_after_torn_last_line_starts_a_new_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "rew')
    _run(tmp_path, ["jsonl"], range(3, 4))
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[-1].startswith('{"step": 3')


def test_mlflow_logs_experiment_run_metrics_params_and_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    t = _run(tmp_path, ["mlflow"], range(1, 4), config=CONFIG)
    assert t.mlflow_run_id == (tmp_path / "mlflow_run_id").read_text().strip()
    assert mlflow.active_run() is None
    client = MlflowClient(_sqlite_uri(tmp_path))
    run = client.get_run(t.mlflow_run_id)
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.info.run_name == "exp"
    assert run.info.status == "FINISHED"
    assert run.data.params["actor.optim.lr"] == "1e-06"
    assert run.data.params["trainer.logger"] == "['console', 'mlflow']"
    assert _history(client, t.mlflow_run_id, "reward/mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert _history(client, t.mlflow_run_id, "timing_s/step") == [(1, 1.5), (2, 3.0), (3, 4.5)]


def test_mlflow_resumed_run_dir_continues_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = _run(tmp_path, ["mlflow"], range(1, 4), config=CONFIG)
    changed = CONFIG | {"actor": {"optim": {"lr": 2e-6}}, "extra": {"new": 1}}
    with caplog.at_level(logging.WARNING, logger="trainer.metrics.tracking"):
        second = _run(tmp_path, ["mlflow"], range(4, 6), config=changed)
    assert second.mlflow_run_id == first.mlflow_run_id
    assert "actor.optim.lr" in caplog.text  # params are immutable: kept, with a warning
    client = MlflowClient(_sqlite_uri(tmp_path))
    history = _history(client, first.mlflow_run_id, "reward/mean")
    assert [step for step, _ in history] == [1, 2, 3, 4, 5]
    run = client.get_run(first.mlflow_run_id)
    assert run.data.params["actor.optim.lr"] == "1e-06"
    assert run.data.params["extra.new"] == "1"
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_mlflow_env_uri_long_params_odd_names_and_non_finite_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = {"prompt": "x" * 7000, "many": {f"k{i}": i for i in range(150)}}
    t = Tracking(["mlflow"], project="p", experiment="e", run_dir=tmp_path / "run", config=config)
    t.log({"pass@k/mean": 0.5, "reward/nan": float("nan"), "reward/inf": math.inf}, step=1)
    t.finish()
    assert not (tmp_path / "run" / "mlruns.db").exists()
    run = MlflowClient(uri).get_run(t.mlflow_run_id)
    assert run.data.params["prompt"] == "x" * 6000
    assert len(run.data.params) == 151  # logged in chunks of 100
    assert run.data.metrics["pass_at_k/mean"] == 0.5  # verl's spelling of @ in MLflow
    assert math.isnan(run.data.metrics["reward/nan"])
    assert run.data.metrics["reward/inf"] > 1e300


def test_tensorboard_scalars_read_back_with_event_accumulator(tmp_path: Path) -> None:
    _run(tmp_path, ["tensorboard"], range(1, 4))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward/mean", "timing_s/step"}
    events = acc.Scalars("reward/mean")
    assert [e.step for e in events] == [1, 2, 3]
    assert [e.value for e in events] == pytest.approx([0.1, 0.2, 0.3])


def test_failing_backend_warns_once_and_other_backends_keep_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: object, metrics: dict[str, float], step: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tracking._JsonlBackend, "log", broken)
    caplog.set_level(logging.INFO)
    _run(tmp_path, ["jsonl", "console"], range(1, 4))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "jsonl logger failed at step 1" in warnings[0].getMessage()
    steps = [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "agentloop.train"]
    assert steps == ["step 1", "step 2", "step 3"]


def test_non_numeric_metric_is_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = Tracking(["jsonl"], project="p", experiment="e", run_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="trainer.metrics.tracking"):
        t.log({"a/x": 1, "a/name": "qwen"}, step=1)  # type: ignore[dict-item]
        t.log({"a/x": 2, "a/name": "qwen"}, step=2)  # type: ignore[dict-item]
    t.finish()
    assert len(caplog.records) == 1 and "'a/name'" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "a/x": 1.0}, {"step": 2, "a/x": 2.0}]


def test_wandb_init_log_finish_and_run_id_reused_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeRun:
        def log(self, metrics: dict[str, float], step: int) -> None:
            calls.append(("log", (metrics, step)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: Any) -> FakeRun:
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    _run(tmp_path, ["wandb"], range(1, 2), config=CONFIG)
    _run(tmp_path, ["wandb"], range(2, 3))
    inits = [kw for name, kw in calls if name == "init"]
    assert inits[0] == {
        "project": "proj",
        "name": "exp",
        "config": CONFIG,
        "dir": str(tmp_path),
        "resume": "allow",
        "id": (tmp_path / "wandb_run_id").read_text().strip(),
    }
    assert inits[1]["id"] == inits[0]["id"]
    assert [c for c in calls if c[0] == "log"][1] == (
        "log",
        ({"reward/mean": 0.2, "timing_s/step": 3.0}, 2),
    )
    assert [name for name, _ in calls].count("finish") == 2
