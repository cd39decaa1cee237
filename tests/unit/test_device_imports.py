"""The GPU machine has torch, transformers, peft and pytest but none of Ray, vLLM, Hydra,
MLflow or the HTTP stack (docs/contributing.md, ENVIRONMENT.md). The ``gpu`` tests and GPU
benchmarks, and the trainer's math, FSDP and weight-send modules they drive, must import there:
this imports them in a fresh interpreter where those packages cannot be found."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Our dependencies (pyproject.toml) that the device image does not hold.
NOT_ON_DEVICE = (
    "fastapi", "gguf", "httpx2", "hydra", "jsonschema", "langchain_core", "langgraph", "mcp",
    "mlflow", "omegaconf", "pydantic", "qwen_agent", "ray", "sglang", "soundfile", "starlette",
    "uvicorn", "vllm", "zmq",
)  # fmt: skip

DEVICE_MODULES = (
    "tests.conftest",
    "tests.integration.conftest",
    "trainer.workers",
    "trainer.workers.fsdp_worker",
    "trainer.workers.critic",
    "trainer.workers.critic_math",
    "trainer.algos.value",
    "trainer.algos.turns",
    "trainer.workers.lora",
    "trainer.workers.policy_math",
    "trainer.workers.dist",
    "trainer.algos.groups",
    "trainer.algos.correction",
    "trainer.workers.weight_send",
    "servers.weights",
    "servers.lora",
    "tests.perf.actor_workload",
    "tests.perf.packed_baseline",
    "tests.perf.padded_grad_probe",
    "tests.integration.trainer.test_fsdp_gpu",
    "tests.integration.trainer.test_weight_send_gpu",
    "tests.perf.test_bench_actor_gpu",
    "tests.perf.test_bench_weight_sync_gpu",
)

PROGRAM = textwrap.dedent(
    """
    import importlib, sys

    class NotOnDevice:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {absent!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine)")

    sys.meta_path.insert(0, NotOnDevice())
    for module in {modules!r}:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            sys.exit(f"{{module}}: {{exc}}")
    """
)


def _import_without(absent: set[str], modules: tuple[str, ...]) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter where the packages ``absent`` cannot be found."""
    program = PROGRAM.format(absent=absent, modules=modules)
    return subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_gpu_tests_and_the_trainer_import_with_torch_and_transformers_alone():
    proc = _import_without(set(NOT_ON_DEVICE), DEVICE_MODULES)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_check_finds_a_module_that_needs_one_of_them():
    proc = _import_without({"fastapi"}, ("servers.http",))
    assert proc.returncode == 1
    assert "servers.http: No module named 'fastapi' (not on the GPU machine)" in proc.stderr
