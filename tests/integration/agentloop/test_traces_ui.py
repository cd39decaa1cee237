"""Rollout traces in the MLflow UI: traces written by the tracer to a run's sqlite store are
listed on the traces page that ``agentloop-traces`` serves, loaded in a real headless
Chromium (Debian's ``chromium``; .ci/run installs it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from agentloop.config import TraceConfig
from agentloop.tools import CallOutcome
from agentloop.trace import MlflowTracer, TraceContext
from servers.types import TokenOutput

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_trace(run_dir: Path, tokenizer) -> str:
    previous = mlflow.get_tracking_uri()
    try:
        config = TraceConfig(
            backend="mlflow",
            tracking_uri=f"sqlite:///{run_dir / 'mlruns.db'}",
            experiment_name="ui-check",
        )
        tracer = MlflowTracer(config, tokenizer)
        fields = {"raw_prompt": [{"role": "user", "content": "What is 17 * 23?"}], "uid": "u1"}
        trace = tracer.start(TraceContext(step=3), 0, fields, "tool_agent")
        assert trace is not None
        start = time.time_ns()
        trace.generate(start, [1, 2, 3], TokenOutput([4, 5], None, "stop"), 0)
        trace.tool(start, "calc", {"expr": "17*23"}, CallOutcome("calc", "391", True, 0.01))
        trace.tool(start, "calc", {"expr": "17*"}, CallOutcome("calc", "Error: bad", False, 0.0))
        trace_id = trace.finish(None)
        tracer.flush()
    finally:
        mlflow.set_tracking_uri(previous)
    assert trace_id is not None
    return trace_id


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (.ci/run does)")
def test_the_traces_page_lists_a_rollout_trace(tmp_path, tiny_qwen3_path):
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trace_id = write_trace(run_dir, AutoTokenizer.from_pretrained(tiny_qwen3_path))
    port = free_port()
    ui = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.cli.traces",
            "--run-dir",
            str(run_dir),
            "--port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # the CLI, mlflow ui and its workers: one process group
    )
    try:
        assert ui.stdout is not None
        printed = [ui.stdout.readline() for _ in range(3)]
        url = printed[1].split("open ", 1)[1].strip()
        assert url == f"http://127.0.0.1:{port}/#/experiments/1/traces"
        assert printed[2].startswith("filter one step's rollouts with: tags.step = '3'")
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert ui.poll() is None, "mlflow ui exited"
                assert time.monotonic() < deadline, "mlflow ui did not start"
                time.sleep(0.5)
        dom = ""
        for _ in range(3):  # the page renders from API calls; give it up to three tries
            dom = subprocess.run(
                [
                    CHROMIUM,
                    *FLAGS,
                    f"--user-data-dir={tmp_path / 'chromium'}",
                    "--virtual-time-budget=30000",
                    "--dump-dom",
                    url,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            if trace_id in dom:
                break
        assert trace_id in dom, dom[-2000:]
        assert "What is 17 * 23?" in dom and "step: 3" in dom
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)
