"""``agentloop-traces`` without a UI: which store it opens, clear errors, one step's traces
as a table from a real sqlite store, and the UI's process group killed when it ignores
SIGTERM."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.trace_store import write_traces
from trainer.cli.traces import find_store, main, stop_group


def test_no_run_under_the_root_is_a_clear_error(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--no-ui"]) == 2
    assert capsys.readouterr().err == (
        f"agentloop-traces: error: no run with an MLflow store under {tmp_path}/: pass "
        "--run-dir or --store (runs write <run dir>/mlruns.db with "
        "trainer.logger=[...,mlflow] or rollout.trace.backend=mlflow)\n"
    )


def test_a_run_folder_without_a_store_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError) as err:
        find_store(str(tmp_path))
    assert str(err.value) == (
        f"{tmp_path / 'mlruns.db'} does not exist: pass the run folder of a run with traces"
    )


def test_the_newest_store_under_the_root_is_picked(tmp_path):
    import os

    old, new = tmp_path / "a" / "mlruns.db", tmp_path / "b" / "mlruns.db"
    for path, mtime in ((old, 1_000_000), (new, 2_000_000)):
        path.parent.mkdir()
        path.write_bytes(b"")
        os.utime(path, (mtime, mtime))
    assert find_store(None, str(tmp_path)) == (f"sqlite:///{new.resolve()}", new.parent)


@pytest.mark.slow
def test_step_lists_that_steps_traces_as_a_table_without_a_ui(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    second, first, val, _ = write_traces(run / "mlruns.db")
    assert main(["--run-dir", str(run), "--step", "2"]) == 0
    w = len(first)
    assert capsys.readouterr().out == (
        f"{'trace_id':<{w}}  sample  rollout_n  validate  agent_name  reward  stop_reason"
        "   turns  tool_calls\n"
        f"{first}  0       0          false     a           0.5     no_tool_call  2      0\n"
        f"{second}  1       1          false     a           -       no_tool_call  3      1\n"
        f"{val}  0       0          true      a           -       no_tool_call  4      2\n"
    )


@pytest.mark.slow
def test_a_step_without_traces_names_the_traced_steps(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_traces(run / "mlruns.db")
    assert main(["--run-dir", str(run), "--step", "5"]) == 2
    store = f"sqlite:///{(run / 'mlruns.db').resolve()}"
    err = capsys.readouterr().err  # MLflow's own log lines come first
    assert err.endswith(
        f"\nagentloop-traces: error: no traces at step 5 in {store}; traced steps: 1, 2\n"
    )


@pytest.mark.slow
def test_a_ui_group_that_ignores_sigterm_is_killed_after_the_grace_period(caplog):
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
        "print('ready', flush=True); time.sleep(60)"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", ignores], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert leader.stdout is not None and leader.stdout.readline() == "ready\n"
    group = [p.pid for p in psutil.Process(leader.pid).children(recursive=True)] + [leader.pid]
    assert len(group) == 2
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="agentloop.traces"):
        stop_group(leader, grace_s=1.0)
    assert 1.0 <= time.monotonic() - start < 5.0
    assert leader.returncode == -signal.SIGKILL
    assert not [pid for pid in group if _alive(pid)]
    assert caplog.messages == [
        f"mlflow ui processes {sorted(group)} did not stop in 1 s: killing them"
    ]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
