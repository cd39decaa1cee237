"""Shared test fixtures: model assets from the project cache, tier markers that follow the
folders, GPU-marker skipping, and the check that the session leaves ``/dev/shm`` as it found it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.shm import leaked, shm_entries

# The xdist groups of the tiers that start whole processes, and each worker's Ray temp folder
# (tests/xdist_groups.py).
pytest_plugins = ["tests.xdist_groups"]

# A small fixed KV cache for vLLM CPU engines started by tests (see ENVIRONMENT.md).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


TESTS = Path(__file__).resolve().parent
# A folder under tests/ is a tier: every test in it carries the marker of the same name, so
# `-m "not integration"` and the like select by folder without a pytestmark line per module.
FOLDER_MARKERS = ("integration", "e2e", "reliability", "perf")


def folder_marker(path: Path) -> str | None:
    """The tier marker of the test file at ``path``: its first folder under tests/, if a tier."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in FOLDER_MARKERS else None


# tryfirst: the marks must be on the items before pytest's own hook deselects by `-m`.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = folder_marker(item.path)
        if marker is not None:
            item.add_marker(marker)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _shm_leak_message(left: list[str]) -> str:
    return (
        f"the test session left {len(left)} shared-memory entries in /dev/shm that no process "
        f"uses: {', '.join(left)}; a test killed a process that owned them without removing "
        "them (ServerGroup.restart and stop_servers remove a killed engine's; see tests/shm.py)"
    )


_SHM_BEFORE = pytest.StashKey[set[str]]()


@pytest.fixture(autouse=True, scope="session")
def _dev_shm_left_as_found():
    """No ``psm_*`` segment or ``sem.*`` semaphore the session created may outlive it: they
    are RAM, and a killed engine's are 160-250 MB each. Only entries new since the session
    started count, and only those no live process maps (another session's running engines
    are not this one's leaks). Under xdist the controller checks once, after every worker has
    ended (``pytest_sessionfinish``): a worker that ends first would otherwise count what the
    other's running test just killed and has not cleaned up yet."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        yield
        return
    before = shm_entries()
    yield
    left = leaked(before)
    assert not left, _shm_leak_message(left)


def machine_line() -> str:
    """The CPU this run is on, for the report header: a CI excerpt then says which machine's
    timings it shows (the CPU model, SMT, bf16 in hardware, the load when the run started)."""
    path = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    for line in (path.read_text() if path.exists() else "").splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    has = {f: "yes" if f in flags else "no" for f in ("avx512_bf16", "amx_bf16")}
    return (
        f"machine: {os.cpu_count()} cpus ({fields.get('model name', '?')}; siblings "
        f"{fields.get('siblings', '?')}, cores {fields.get('cpu cores', '?')}), avx512_bf16 "
        f"{has['avx512_bf16']}, amx {has['amx_bf16']}, load {load}"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return machine_line()


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.getoption("dist", "no") != "no" and "PYTEST_XDIST_WORKER" not in os.environ:
        session.config.stash[_SHM_BEFORE] = shm_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_SHM_BEFORE, None)
    if before is None:  # not an xdist controller: the session fixture checked
        return
    left = leaked(before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"FAILED /dev/shm check: {_shm_leak_message(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> Path:
    """The tiny-qwen3 asset, built once into the project cache and reused by later runs."""
    from trainer.models import prepare

    return prepare("tiny-qwen3")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The smollm2-135m-instruct asset (converted from GGUF once, then cached)."""
    from trainer.models import prepare

    return prepare("smollm2-135m-instruct")


@pytest.fixture(autouse=True, scope="module")
def _restore_agent_loop_registry():
    """Loops a test module registers (YAML user loops) do not leak into later modules."""
    try:
        from agentloop import base
    except ImportError:  # the GPU machine: no jsonschema, pydantic...; no loops to register
        yield
        return
    saved = dict(base._REGISTRY)
    yield
    base._REGISTRY.clear()
    base._REGISTRY.update(saved)


@pytest.fixture(autouse=True, scope="module")
def _restore_mlflow_tracking_uri():
    """``mlflow.set_tracking_uri`` (the tracer, trace tests) also sets MLFLOW_TRACKING_URI in
    ``os.environ``; left there it would send later modules' subprocess runs to that store."""
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if saved is not None:
        os.environ["MLFLOW_TRACKING_URI"] = saved
        return
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)


@pytest.fixture(autouse=True, scope="module")
def _memory_back_to_the_system():
    """After each module, freed memory goes back to the OS: glibc keeps what a module freed
    (a model's float64 gradients are gigabytes) mapped in this process otherwise, and later
    modules' Ray workers and engines then meet the memory monitor with it still counted."""
    yield
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        pass
