"""``agentloop-traces`` (``make traces``): the rollout traces of a run, in the MLflow UI or as
a table.

    agentloop-traces                       # the newest run under ./checkpoints, in the UI
    agentloop-traces --run-dir /tmp/run    # a given run folder (its mlruns.db)
    agentloop-traces --store sqlite:///x.db --port 5001
    agentloop-traces --run-dir /tmp/run --step 3   # step 3's traces as a table, no UI

Starts ``mlflow ui`` on 127.0.0.1 over the run's store and prints the URL of its traces
page and the filter to paste into the search box (e.g. ``tags.step = '3'``). The UI runs in
its own process group with a scratch TMPDIR; SIGTERM/SIGINT (Ctrl-C) stop the whole group
and remove the scratch folder, and the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from trainer.metrics.trace_list import experiment_ids, format_trace_table, step_traces, traced_steps

__all__ = ["find_store", "main", "serve_ui", "stop_group", "traces_summary", "ui_command"]

logger = logging.getLogger("agentloop.traces")

STOP_GRACE_S = 10.0
"""How long the UI's processes get to exit after SIGTERM before they are killed."""


def find_store(run_dir: str | None, root: str = "checkpoints") -> tuple[str, Path | None]:
    """``(store uri, run folder)``: the given folder's mlruns.db, else the newest under
    ``root``. Raises ValueError saying what to pass."""
    if run_dir is not None:
        db = Path(run_dir) / "mlruns.db"
        if not db.is_file():
            raise ValueError(f"{db} does not exist: pass the run folder of a run with traces")
        return f"sqlite:///{db.resolve()}", Path(run_dir)
    found = sorted(Path(root).glob("**/mlruns.db"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ValueError(
            f"no run with an MLflow store under {root}/: pass --run-dir or --store (runs write "
            "<run dir>/mlruns.db with trainer.logger=[...,mlflow] or rollout.trace.backend=mlflow)"
        )
    return f"sqlite:///{found[-1].resolve()}", found[-1].parent


def traces_summary(store: str, run_dir: Path | None) -> tuple[str | None, str | None, int]:
    """``(experiment id, newest traced step, number of traces)`` of the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiments = experiment_ids(client, run_dir)
    for exp in experiments:
        traces = client.search_traces(locations=[exp], max_results=1000, include_spans=False)
        if traces:
            steps = [
                int(t.info.tags["step"]) for t in traces if t.info.tags.get("step", "").isdigit()
            ]
            return exp, (str(max(steps)) if steps else None), len(traces)
    return (experiments[0] if len(experiments) == 1 else None), None, 0


def list_step(store: str, run_dir: Path | None, step: int) -> str:
    """Step ``step``'s traces as a table; ValueError naming the traced steps if it has none."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiments = experiment_ids(client, run_dir)
    rows = step_traces(client, experiments, step)
    if not rows:
        steps = ", ".join(map(str, traced_steps(client, experiments))) or "none"
        raise ValueError(f"no traces at step {step} in {store}; traced steps: {steps}")
    return format_trace_table(rows)


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signum)


def _group_alive(pgid: int) -> list[int]:
    """Processes of the group that have not exited (zombies waiting for a reaper excluded)."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


KILL_WAIT_S = 5.0
"""How long ``stop_group`` waits for SIGKILLed processes to be gone."""


def stop_group(leader: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the leader's whole process group, then SIGKILL to what is left after
    ``grace_s``; the leader is reaped."""
    pgid = leader.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.1)
    left = _group_alive(pgid)
    logger.warning("mlflow ui processes %s did not stop in %.0f s: killing them", left, grace_s)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    leader.wait()
    deadline = time.monotonic() + KILL_WAIT_S  # SIGKILL is delivered, but exits take a moment
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def ui_command(store: str, host: str, port: int) -> list[str]:
    """The ``mlflow ui`` command line: one worker is plenty for one user's browser."""
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store]
    return command + ["--host", host, "--port", str(port), "--workers", "1"]


def serve_ui(store: str, host: str, port: int) -> int:
    """Run ``mlflow ui`` until it exits (its exit code) or SIGTERM/SIGINT arrives (0); either
    way its process group is stopped and its scratch TMPDIR removed.

    The UI gets one worker and no job execution: MLflow's job runner (not needed to browse
    traces) adds a consumer process and a huey folder in /dev/shm it never deletes."""
    scratch = tempfile.mkdtemp(prefix="agentloop-traces-")
    env = {**os.environ, "TMPDIR": scratch, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = ui_command(store, host, port)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    ui = None
    try:
        for signum in handlers:
            signal.signal(signum, _raise_stop)
        ui = subprocess.Popen(command, env=env, start_new_session=True)
        code = ui.wait()
    except _Stop as stop:
        logger.info("%s: stopping mlflow ui", stop)
        code = 0
    finally:
        for signum in handlers:  # a second Ctrl-C must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        if ui is not None:
            stop_group(ui)
        shutil.rmtree(scratch, ignore_errors=True)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentloop-traces", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=None, help="run folder (default: newest run)")
    parser.add_argument("--store", default=None, help="MLflow tracking URI instead of a run")
    parser.add_argument("--root", default="checkpoints", help="where to look for runs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--no-ui", action="store_true", help="print the URL and filter only")
    parser.add_argument(
        "--step", type=int, default=None, help="print this step's traces as a table (no UI)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        store, run_dir = (args.store, None) if args.store else find_store(args.run_dir, args.root)
        if args.step is not None:
            sys.stdout.write(list_step(store, run_dir, args.step))
            return 0
        experiment, step, count = traces_summary(store, run_dir)
    except ValueError as exc:
        sys.stderr.write(f"agentloop-traces: error: {exc}\n")
        return 2
    url = f"http://{args.host}:{args.port}/#/experiments/{experiment or 0}/traces"
    sys.stdout.write(f"store: {store}\n{count} traces; open {url}\n")
    if step is not None:
        sys.stdout.write(
            f"filter one step's rollouts with: tags.step = '{step}'  (validation: "
            "tags.validate = 'true'; low rewards: tags.reward = '0'; a table without the UI: "
            f"--step {step})\n"
        )
    sys.stdout.flush()
    if args.no_ui:
        return 0
    return serve_ui(store, args.host, args.port)


if __name__ == "__main__":
    raise SystemExit(main())
