"""Per-step metric loggers of the training loop.

``Tracking(["console", "mlflow"], project=..., experiment=..., run_dir=...)`` sends every
``log(metrics, step)`` to each chosen backend:

- ``console``: a compact table on the ``agentloop.train`` logger, one line per metric group
  (the key's prefix before the first ``/``), keys sorted, 4 significant digits.
- ``jsonl``: ``{"step": N, **metrics}`` appended to ``<run_dir>/metrics.jsonl``.
- ``mlflow``: ``MLFLOW_TRACKING_URI`` or ``sqlite:///<run_dir>/mlruns.db``; experiment =
  project, run = experiment; names MLflow refuses are mended (``@`` -> ``_at_``, as verl
  does; other odd characters -> ``_``). The run id is kept in ``<run_dir>/mlflow_run_id`` so
  a resumed training run continues the same MLflow run. Everything goes through an
  ``MlflowClient`` bound to that run: no global active run is started.
- ``tensorboard``: scalars in ``<run_dir>/tensorboard``.
- ``wandb``: optional package; the run id is kept in ``<run_dir>/wandb_run_id``.

Failure policy: a backend that cannot start raises at construction (a typo or a missing
package should stop the run before step 1). A backend that fails while logging gets one
warning and is still tried on later steps, so a flaky tracking server never kills training.
Non-finite values are passed on as they are: JSON lines hold ``NaN``/``Infinity`` (Python's
``json`` reads them back), MLflow keeps NaN and clamps +-inf to +-1.8e308.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from trainer.config.run import LOGGERS

__all__ = ["BACKENDS", "Tracking"]

BACKENDS = LOGGERS

logger = logging.getLogger(__name__)
_train_logger = logging.getLogger("agentloop.train")

_CONSOLE_WIDTH = 120
"""Console lines wrap before this many characters, continuing under the group's column."""
_MLFLOW_MAX_PARAM_LEN = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_MLFLOW_MAX_KEY_LEN = 250  # MAX_ENTITY_KEY_LENGTH
_MLFLOW_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
_MLFLOW_METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")
_WANDB_MISSING = (
    "trainer.logger contains 'wandb' but the wandb package is not installed: "
    "pip install wandb, or remove wandb from trainer.logger"
)


class _Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


class Tracking:
    """Fans each step's metrics out to the configured backends (see the module docstring)."""

    def __init__(
        self,
        backends: list[str],
        *,
        project: str,
        experiment: str,
        run_dir: str | Path,
        config: dict[str, Any] | None = None,
    ) -> None:
        for name in backends:
            if name not in BACKENDS:
                raise ValueError(
                    f"unknown logger backend {name!r}; valid backends: {', '.join(BACKENDS)}"
                )
        wandb = _import_wandb() if "wandb" in backends else None  # fail before anything starts
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.mlflow_run_id: str | None = None
        """The MLflow run this training run logs to; None when mlflow is not a backend."""
        self.mlflow_tracking_uri: str | None = None
        self._backends: dict[str, _Backend] = {}
        self._warned: set[str] = set()
        try:
            for name in dict.fromkeys(backends):  # de-duplicated, in the given order
                if name == "console":
                    self._backends[name] = _ConsoleBackend()
                elif name == "jsonl":
                    self._backends[name] = _JsonlBackend(run_dir / "metrics.jsonl")
                elif name == "mlflow":
                    mlflow_backend = _MlflowBackend(project, experiment, run_dir, config)
                    self.mlflow_run_id = mlflow_backend.run_id
                    self.mlflow_tracking_uri = mlflow_backend.uri
                    self._backends[name] = mlflow_backend
                elif name == "tensorboard":
                    self._backends[name] = _TensorboardBackend(run_dir / "tensorboard")
                else:
                    self._backends[name] = _WandbBackend(
                        wandb, project, experiment, run_dir, config
                    )
        except BaseException:
            self.finish()  # close what already started (files, writers)
            raise

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log one step's metrics to every backend; a failing backend never raises here."""
        values = self._as_floats(metrics)
        for name, backend in self._backends.items():
            try:
                backend.log(values, step)
            except Exception:
                self._warn_once(
                    name,
                    "%s logger failed at step %d; training continues and later steps are still "
                    "sent to it (shown once per backend)",
                    name,
                    step,
                )

    def finish(self) -> None:
        """Flush and close every backend (MLflow run -> FINISHED). Later calls do nothing."""
        backends, self._backends = self._backends, {}
        for name, backend in backends.items():
            try:
                backend.finish()
            except Exception:
                logger.warning("%s logger failed to finish", name, exc_info=True)

    def _as_floats(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Plain floats (numpy scalars and 0-d tensors included); other values are dropped."""
        values: dict[str, float] = {}
        for key, value in metrics.items():
            try:
                values[key] = float(value)
            except Exception:
                self._warn_once(
                    f"metric:{key}", "metric %r is not a number (%r); not logged", key, value
                )
        return values

    def _warn_once(self, tag: str, msg: str, *args: object) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            logger.warning(msg, *args, exc_info=True)


def _format_table(metrics: Mapping[str, float], step: int, width: int = _CONSOLE_WIDTH) -> str:
    """``step N`` and one line per prefix group (keys without ``/`` under ``other``)."""
    groups: dict[str, list[str]] = {}
    for key in sorted(metrics):
        group, sep, name = key.partition("/")
        if not sep:
            group, name = "other", key
        groups.setdefault(group, []).append(f"{name}={metrics[key]:.4g}")
    label_width = max((len(g) for g in groups), default=0) + 2
    indent = label_width + 2
    lines = [f"step {step}"]
    for group in sorted(groups, key=lambda g: (g == "other", g)):
        line = f"  {group:<{label_width}}"
        for item in groups[group]:
            if len(line) > indent and len(line) + len(item) > width:
                lines.append(line.rstrip())  # wrap, continuing under the group's column
                line = " " * indent
            line += item + "  "
        lines.append(line.rstrip())
    return "\n".join(lines)


class _ConsoleBackend:
    def log(self, metrics: dict[str, float], step: int) -> None:
        _train_logger.info("%s", _format_table(metrics, step))

    def finish(self) -> None:
        pass


class _JsonlBackend:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        if self._file.tell() > 0 and not path.read_bytes().endswith(b"\n"):
            self._file.write("\n")  # a crashed run left a torn last line: start a fresh one

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and empty mappings stay leaves."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _mlflow_key(key: str) -> str:
    """A name MLflow accepts: allowed characters only, no empty/``.``/``..`` path segments.
    ``@`` reads ``_at_`` as in verl's MLflow logger (``val-core/<source>/reward/mean_at_1``),
    so a verl MLflow dashboard carries over."""
    key = _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))
    parts = [p if p != ".." else "__" for p in key.split("/") if p not in ("", ".")]
    return ("/".join(parts) or "_")[:_MLFLOW_MAX_KEY_LEN]


class _MlflowBackend:
    def __init__(
        self, project: str, experiment: str, run_dir: Path, config: Mapping[str, Any] | None
    ) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:
            uri = f"sqlite:///{(run_dir / 'mlruns.db').resolve()}"
            artifacts = (run_dir / "mlartifacts").resolve().as_uri()
        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        self.run_id, logged = self._resume_or_create(project, experiment, run_dir, artifacts)
        if config:
            self._log_params(config, logged)
        logger.info("mlflow: run %s in experiment %r at %s", self.run_id, project, uri)

    def _resume_or_create(
        self, project: str, experiment: str, run_dir: Path, artifacts: str | None
    ) -> tuple[str, dict[str, str]]:
        """The stored run (set back to RUNNING) and its params, or a new run."""
        id_file = run_dir / "mlflow_run_id"
        if id_file.exists():
            run_id = id_file.read_text().strip()
            try:
                run = self._client.get_run(run_id)
            except Exception:
                run = None
            if run is not None and run.info.lifecycle_stage == "active":
                self._client.update_run(run_id, status="RUNNING")
                return run_id, dict(run.data.params)
            logger.warning("mlflow run %s (from %s) is gone; starting a new run", run_id, id_file)
        exp = self._client.get_experiment_by_name(project)
        if exp is None:
            exp_id = self._client.create_experiment(project, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                self._client.restore_experiment(exp_id)
        run_id = self._client.create_run(exp_id, run_name=experiment).info.run_id
        id_file.write_text(run_id + "\n")
        return run_id, {}

    def _log_params(self, config: Mapping[str, Any], logged: Mapping[str, str]) -> None:
        """Flattened, stringified config; a resumed run keeps the values it logged first."""
        from mlflow.entities import Param

        params: dict[str, str] = {}
        for key, value in _flatten(config).items():
            params[_mlflow_key(key)] = str(value)[:_MLFLOW_MAX_PARAM_LEN]
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
        if changed:
            logger.warning(
                "mlflow params are immutable: run %s keeps its first values of %s",
                self.run_id,
                ", ".join(changed),
            )
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), _MLFLOW_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=new[i : i + _MLFLOW_PARAMS_PER_BATCH])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), v, now_ms, step) for k, v in metrics.items()]
        for i in range(0, len(batch), _MLFLOW_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=batch[i : i + _MLFLOW_METRICS_PER_BATCH])

    def finish(self) -> None:
        self._client.set_terminated(self.run_id, status="FINISHED")


class _TensorboardBackend:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ValueError(
                "trainer.logger contains 'tensorboard' but the tensorboard package is not "
                "installed: pip install tensorboard, or remove tensorboard from trainer.logger"
            ) from e
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ValueError(_WANDB_MISSING) from e
    return wandb


class _WandbBackend:
    def __init__(
        self,
        wandb: Any,
        project: str,
        experiment: str,
        run_dir: Path,
        config: Mapping[str, Any] | None,
    ) -> None:
        id_file = run_dir / "wandb_run_id"
        # 8 lowercase hex chars: a valid W&B run id, reused on resume
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        self._run = wandb.init(
            project=project,
            name=experiment,
            config=dict(config) if config else None,
            dir=str(run_dir),
            resume="allow",
            id=run_id,
        )
        id_file.write_text(run_id + "\n")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()
