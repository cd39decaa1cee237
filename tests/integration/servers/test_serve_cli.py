"""`agentloop-serve` serves one engine standalone: a model name resolves to its cache folder,
the HTTP front answers, and SIGINT stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def _script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_serve_cli_serves_a_named_model_until_sigint(tiny_qwen3_path):
    proc = subprocess.Popen(
        [
            _script("agentloop-serve"),
            "--model",
            "tiny-qwen3",
            "--port",
            "0",
            "--max-model-len",
            "256",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 400
        line = ""
        while time.monotonic() < deadline and not line.startswith("serving "):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "agentloop-serve exited before serving"
        assert line.startswith(f"serving {tiny_qwen3_path} on http://127.0.0.1:"), line
        url = line.strip().rsplit(" ", 1)[-1]
        assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
        r = httpx.post(
            f"{url}/generate",
            json={"prompt_ids": [151644, 872, 198], "sampling_params": {"max_tokens": 4}},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["token_ids"]) >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    assert code == 0


def test_serve_cli_rejects_an_unknown_model():
    result = subprocess.run(
        [_script("agentloop-serve"), "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert (
        "--model 'no-such-model' is neither a model folder nor a known asset name "
        "(smollm2-135m-instruct, tiny-qwen3)"
    ) in result.stderr
