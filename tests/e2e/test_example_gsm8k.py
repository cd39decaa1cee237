"""The GSM8K tool-agent example end to end on tiny-qwen3: the preprocessing script on a
local file in the openai/gsm8k layout, then examples/gsm8k/run_gsm8k_tool_agent_cpu.sh for one
GRPO step (async rollout, calculator tool, MLflow metrics and rollout traces)."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.e2e.run_script import REPO, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_cpu_script_trains_a_step_and_traces_it_in_mlflow(tmp_path):
    rows = [
        {"question": f"What is {a} times {a + 3}?", "answer": f"{a}*{a + 3}\n#### {a * (a + 3)}"}
        for a in range(2, 8)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gsm8k.parquet")
    data, run = tmp_path / "data", tmp_path / "run"
    prep = [
        sys.executable,
        "examples/data_preprocess/gsm8k_tool_agent_loop.py",
        "--train_file",
        str(tmp_path / "gsm8k.parquet"),
        "--test_file",
        str(tmp_path / "gsm8k.parquet"),
        "--out_dir",
        str(data),
        "--limit",
        "4",
    ]
    subprocess.run(prep, cwd=REPO, check=True)
    proc = run_script(
        "examples/gsm8k/run_gsm8k_tool_agent_cpu.sh",
        data,
        run,
        "data.val_batch_size=2",
        "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=2",
        "trainer.worker_log_level=INFO",
    )
    assert "done: 1 steps" in proc.stdout
    # Worker logs reach this console, prefixed with their actor, at the level asked for.
    console = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert re.search(
        r"^\(AsyncServer pid=\d+\) INFO servers\.vllm: vLLM engine for .* ready in", console, re.M
    ), console[-3000:]
    # The resolved config of this start is in the run folder.
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["trainer"]["worker_log_level"] == "INFO"
    assert resolved["data"]["val_batch_size"] == 2
    rollout = resolved["actor_rollout_ref"]["rollout"]
    assert rollout["prompt_length"] == resolved["data"]["max_prompt_length"]  # interpolated

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlruns.db'}")
    run_id = (run / "mlflow_run_id").read_text().strip()
    mlflow_run = client.get_run(run_id)
    assert "reward/mean" in mlflow_run.data.metrics
    assert "val/openai/gsm8k/reward/mean" in mlflow_run.data.metrics
    experiment = mlflow_run.info.experiment_id
    assert client.get_experiment(experiment).name == "gsm8k_tool_agent"
    traces = client.search_traces(locations=[experiment], max_results=50)
    train = [t for t in traces if t.info.tags["validate"] == "false"]
    assert len(train) == 2 and all(t.info.tags["agent_name"] == "tool_agent" for t in train)
    assert all(t.info.trace_metadata.get("mlflow.sourceRun") == run_id for t in traces)
