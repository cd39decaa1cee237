"""`agentloop-serve` serves one engine standalone: a hub id resolves to its snapshot in the
hub cache (an unknown name is refused), the HTTP front answers, and SIGINT stops it cleanly,
leaving nothing in the temp dir or in /dev/shm; killed (SIGKILL), its engine core ends itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from transformers import AutoTokenizer

from servers.scratch import SCRATCH_PREFIX
from servers.shm import engine_shm, owner_pid, remove_shm, shm_entries
from tests.hf_cache import add_to_hf_cache, hf_env

pytestmark = pytest.mark.integration


def _script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _serving(proc: subprocess.Popen) -> str:
    """The server's ``serving <model> on <url>`` line, once it has printed it."""
    deadline = time.monotonic() + 400
    line = ""
    while time.monotonic() < deadline and not line.startswith("serving "):
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "agentloop-serve exited before serving"
    return line


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
        "(smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long)"
    ) in result.stderr


# Marks every message, so a prompt rendered with it is longer than with Qwen's own template.
CUSTOM = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n[custom] {{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_serve_cli_serves_a_hub_id_offline_with_a_custom_chat_template_until_sigint(
    tiny_qwen3_path, tmp_path
):
    """``--model Qwen/Qwen3-0.6B`` with HF_HUB_OFFLINE=1 loads the cached snapshot (here
    tiny-qwen3's files), answers to the hub id, ``--chat-template`` renders chats, and SIGINT
    stops it cleanly (exit 0), leaving nothing in its temp dir (vLLM's engine sockets and
    file store went to the server's scratch folder, ``servers/scratch.py``) nor that folder."""
    snapshot = add_to_hf_cache(tmp_path / "hf", "Qwen/Qwen3-0.6B", tiny_qwen3_path)
    template = tmp_path / "chat.jinja"
    template.write_text(CUSTOM)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    custom = tokenizer.apply_chat_template(
        messages, chat_template=CUSTOM, add_generation_prompt=True, return_dict=False
    )
    default = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert len(custom) != len(default)
    args = [
        "--model",
        "Qwen/Qwen3-0.6B",
        "--max-model-len",
        "256",
        "--chat-template",
        str(template),
    ]
    temp = tmp_path / "tmp"  # the server's temp dir, empty
    temp.mkdir()
    proc = subprocess.Popen(
        [_script("agentloop-serve"), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **hf_env(tmp_path / "hf"), "TMPDIR": str(temp)},
    )
    try:
        line = _serving(proc)
        assert line.startswith(f"serving {snapshot} on http://127.0.0.1:"), line
        url = line.strip().rsplit(" ", 1)[-1]
        assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
        r = httpx.post(
            f"{url}/generate",
            json={"prompt_ids": [151644, 872, 198], "sampling_params": {"max_tokens": 4}},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["token_ids"]) >= 1
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["Qwen/Qwen3-0.6B"]
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "Qwen/Qwen3-0.6B", "messages": messages, "max_tokens": 1},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(custom)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    assert code == 0
    assert sorted(p.name for p in temp.iterdir()) == []
    assert not [n for n in shm_entries() if n.startswith(f"{SCRATCH_PREFIX}{proc.pid}-")]


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_sigkilled_serve_cli_leaves_no_engine_process_behind(tiny_qwen3_path, tmp_path, start):
    """SIGKILL of `agentloop-serve` gives its engine core no word; the core sees its server
    gone and ends itself (``servers/engine_watch.py``): spawned, it loaded the watch as a vLLM
    plugin (the way vLLM starts it in a Ray actor); forked, through the at-fork hook."""
    proc = subprocess.Popen(
        [_script("agentloop-serve"), "--port", "0", "--model", str(tiny_qwen3_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": start, "TMPDIR": str(tmp_path)},
    )
    engine = []
    try:
        _serving(proc)
        engine = [
            p for p in psutil.Process(proc.pid).children() if "EngineCore" in " ".join(p.cmdline())
        ]
        assert len(engine) == 1, psutil.Process(proc.pid).children()
        owned = engine_shm(proc.pid)  # what the core maps or made: its cleanup, checked below
    finally:
        proc.kill()
        proc.wait(timeout=60)
    core = engine[0]
    try:
        # SIGTERM from its watch within a second; vLLM's shutdown (SIGKILL after 10 s)
        core.wait(timeout=60)  # no exit code: the core is not this process's child
    except psutil.TimeoutExpired:
        core.kill()
        pytest.fail(f"the engine core (pid {core.pid}) outlived its killed server by 60 s")
    finally:  # what a killed server cannot remove itself; a server group removes it
        remove_shm([*owned, *(n for n in shm_entries() if owner_pid(n) == proc.pid)])
