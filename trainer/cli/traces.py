"""``agentloop-traces`` (``make traces``): open the rollout traces of a run in the MLflow UI.

    agentloop-traces                       # the newest run under ./checkpoints
    agentloop-traces --run-dir /tmp/run    # a given run folder (its mlruns.db)
    agentloop-traces --store sqlite:///x.db --port 5001

Starts ``mlflow ui`` on 127.0.0.1 over the run's store and prints the URL of its traces
page and the filter to paste into the search box (e.g. ``tags.step = '3'``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

__all__ = ["find_store", "main", "traces_summary"]


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
    experiment = None
    id_file = run_dir / "mlflow_run_id" if run_dir else None
    if id_file is not None and id_file.is_file():
        experiment = client.get_run(id_file.read_text().strip()).info.experiment_id
    experiments = (
        [experiment] if experiment else [e.experiment_id for e in client.search_experiments()]
    )
    for exp in experiments:
        traces = client.search_traces(locations=[exp], max_results=1000, include_spans=False)
        if traces:
            steps = [
                int(t.info.tags["step"]) for t in traces if t.info.tags.get("step", "").isdigit()
            ]
            return exp, (str(max(steps)) if steps else None), len(traces)
    return experiment, None, 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentloop-traces", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=None, help="run folder (default: newest run)")
    parser.add_argument("--store", default=None, help="MLflow tracking URI instead of a run")
    parser.add_argument("--root", default="checkpoints", help="where to look for runs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--no-ui", action="store_true", help="print the URL and filter only")
    args = parser.parse_args(argv)
    try:
        store, run_dir = (args.store, None) if args.store else find_store(args.run_dir, args.root)
        experiment, step, count = traces_summary(store, run_dir)
    except ValueError as exc:
        sys.stderr.write(f"agentloop-traces: error: {exc}\n")
        return 2
    url = f"http://{args.host}:{args.port}/#/experiments/{experiment or 0}/traces"
    sys.stdout.write(f"store: {store}\n{count} traces; open {url}\n")
    if step is not None:
        sys.stdout.write(
            f"filter one step's rollouts with: tags.step = '{step}'  (validation: "
            "tags.validate = 'true'; low rewards: tags.reward = '0')\n"
        )
    sys.stdout.flush()
    if args.no_ui:
        return 0
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store]
    command += ["--host", args.host, "--port", str(args.port)]
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
