"""``agentloop-traces`` under SIGTERM and SIGINT: the real CLI serves a real store's traces
with ``mlflow ui``; the signal stops the UI's whole process group, removes the UI's scratch
TMPDIR and leaves no folder in /dev/shm, and the command exits 0 at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.trace_store import write_traces
from trainer.cli.traces import KILL_WAIT_S, STOP_GRACE_S

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SHM = Path("/dev/shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_folders() -> set[str]:
    """``tempfile.mkdtemp`` folders in /dev/shm (MLflow's job runner makes one per server)."""
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.iterdir() if p.is_dir() and p.name.startswith("tmp")}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_stops_the_ui_group_and_removes_its_temp_folders(tmp_path, signum):
    run = tmp_path / "run"
    run.mkdir()
    write_traces(run / "mlruns.db")
    tmp = tmp_path / "tmp"  # the CLI's TMPDIR: its scratch folder for the UI goes here
    tmp.mkdir()
    shm_before = shm_folders()
    port = free_port()
    cli = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli.traces", "--run-dir", str(run), "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C in the test's terminal does not reach it
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                assert cli.poll() is None, cli.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "mlflow ui did not answer in 90 s"
                time.sleep(0.5)
        ui = psutil.Process(cli.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in ui]
        assert any("mlflow ui" in c for c in commands) and any("uvicorn" in c for c in commands)
        pgids = {os.getpgid(p.pid) for p in ui}
        assert len(pgids) == 1 and pgids != {os.getpgid(cli.pid)}  # the UI's own group
        (scratch,) = tmp.iterdir()
        assert scratch.name.startswith("agentloop-traces-")
        assert shm_folders() - shm_before == set()  # no job runner, no huey folder
        cli.send_signal(signum)
        # bounded by the CLI's own limits (STOP_GRACE_S, then KILL_WAIT_S), not by the machine's
        # speed: 2 s here, 10.8 s once on a loaded CI machine
        out, err = cli.communicate(timeout=STOP_GRACE_S + KILL_WAIT_S + 15)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    assert cli.returncode == 0, err[-3000:]
    assert f"INFO agentloop.traces: {signal.Signals(signum).name}: stopping mlflow ui\n" in err
    assert "did not stop" not in err, err[-3000:]
    assert out.splitlines()[1] == f"4 traces; open http://127.0.0.1:{port}/#/experiments/1/traces"
    assert [p.pid for p in ui if alive(p.pid)] == []
    assert list(tmp.iterdir()) == []
    assert shm_folders() - shm_before == set()
