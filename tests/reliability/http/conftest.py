"""One real ``agentloop-serve`` (tiny-qwen3 on the vLLM CPU engine) shared by the HTTP
reliability modules: it requires the bearer token ``KEY`` and admits ``LIMIT`` requests at
once. ``AGENTLOOP_API_KEY`` is cleared so that only ``--api-key`` can set the key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serve_cli import serve_cli

KEY = "test-key-3f9c"
LIMIT = 8
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="package")
def server_url(tiny_qwen3_path) -> Iterator[str]:
    with serve_cli(
        "--model", "tiny-qwen3", "--max-model-len", "512", "--api-key", KEY,
        "--max-concurrent-requests", str(LIMIT), env={"AGENTLOOP_API_KEY": ""},
    ) as base:  # fmt: skip
        yield base
