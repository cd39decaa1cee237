"""Hugging Face hub ids resolve through a real hub cache folder (``tests/hf_cache.py``), as
transformers/verl users expect: offline with no network attempted, online falling back to the
cache when the hub is unreachable, and a clear error naming the cache searched otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from transformers import AutoModelForCausalLM

from servers.config import ServerConfig
from tests.hf_cache import COMMIT, add_to_hf_cache, hf_env, use_hf_cache
from trainer.config.actor import ModelConfig
from trainer.models import HubModelError, hub_cache_dir, is_hub_id, resolve_model
from trainer.models.resolve import resolve_model_config, tokenizer_source

REPO = "Qwen/Qwen3-0.6B"
KEY = "actor_rollout_ref.model.path"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory, tiny_qwen3_path) -> Path:
    """A hub cache holding tiny-qwen3's files as ``Qwen/Qwen3-0.6B`` and only its tokenizer
    as ``Qwen/TokenizerOnly``."""
    home = tmp_path_factory.mktemp("hf")
    add_to_hf_cache(home, REPO, tiny_qwen3_path)
    add_to_hf_cache(home, "Qwen/TokenizerOnly", tiny_qwen3_path, files=TOKENIZER_FILES)
    return home


@pytest.fixture()
def no_network(monkeypatch) -> list[tuple]:
    """Every outgoing connection attempt is recorded and refused."""
    attempts: list[tuple] = []

    def connect(self, address):
        attempts.append(address)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


def snapshot_of(home: Path, repo: str = REPO) -> str:
    org, name = repo.split("/")
    return str((home / "hub" / f"models--{org}--{name}" / "snapshots" / COMMIT).resolve())


def test_a_hub_id_resolves_offline_to_its_cached_snapshot_without_network(
    hf_home, monkeypatch, no_network
):
    use_hf_cache(monkeypatch, hf_home)
    assert hub_cache_dir() == hf_home / "hub"
    assert resolve_model(REPO, KEY) == snapshot_of(hf_home)
    assert no_network == []


@pytest.mark.slow
def test_tokenizer_and_model_load_from_a_hub_id(hf_home, monkeypatch, tiny_qwen3_path):
    use_hf_cache(monkeypatch, hf_home)
    model = resolve_model_config(ModelConfig(path=REPO), "actor_rollout_ref.model")
    assert model.path == model.tokenizer_path == snapshot_of(hf_home)
    tokenizer = tokenizer_source(model).load()
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    loaded = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32)
    assert torch.equal(loaded.model.embed_tokens.weight, original.model.embed_tokens.weight)


def test_a_hub_id_missing_from_the_offline_cache_names_the_folder_searched(
    hf_home, monkeypatch, no_network
):
    use_hf_cache(monkeypatch, hf_home)
    with pytest.raises(HubModelError) as info:
        resolve_model("Org/Missing", KEY)
    assert str(info.value) == (
        f"{KEY} 'Org/Missing' is a Hugging Face hub id that is not in the hub cache (searched "
        f"{hf_home}/hub/models--Org--Missing) and HF_HUB_OFFLINE=1 allows no download: download "
        "it into this cache where a hub is reachable (`hf download Org/Missing`), or set "
        f"{KEY} to a local model folder"
    )
    assert isinstance(info.value, ValueError)  # start-up reports it as a config error
    assert no_network == []


def test_online_with_the_hub_unreachable_falls_back_to_the_cache(hf_home, monkeypatch):
    use_hf_cache(monkeypatch, hf_home, offline=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert resolve_model(REPO, KEY) == snapshot_of(hf_home)
    with pytest.raises(HubModelError) as info:
        resolve_model("Org/Missing", KEY)
    message = str(info.value)
    assert message.startswith(
        f"{KEY} 'Org/Missing' is a Hugging Face hub id that is not in the hub cache (searched "
        f"{hf_home}/hub/models--Org--Missing) and downloading it failed: ConnectError: "
    )
    assert message.endswith(f"or set {KEY} to a local model folder")


class RepoNotFound(BaseHTTPRequestHandler):
    """A stand-in hub that knows no repository (the hub's own 401 + error code)."""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    def log_message(self, *args) -> None:
        pass


def test_an_id_the_hub_does_not_know_says_to_check_it(hf_home, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), RepoNotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        use_hf_cache(monkeypatch, hf_home, offline=False)
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        with pytest.raises(HubModelError) as info:
            resolve_model("Org/Nope", KEY)
    finally:
        server.shutdown()
        server.server_close()
    assert str(info.value) == (
        f"{KEY} 'Org/Nope': the hub refused it (401 Client Error. Repository Not Found for url: "
        f"{endpoint}/api/models/Org/Nope/revision/main.): check the id, log in (`hf auth login`) "
        f"for a gated model, or set {KEY} to a local model folder"
    )


class FolderHub(BaseHTTPRequestHandler):
    """A stand-in hub serving the files of ``folder`` as repository ``repo`` at ``COMMIT``:
    the revision, the recursive tree listing and each file (HEAD and GET). ``fetched`` records
    the name of the file of every file request."""

    repo = ""
    folder = Path()
    fetched: list[str] = []

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = urlsplit(self.path).path
        files = {str(p.relative_to(self.folder)): p for p in self.folder.rglob("*") if p.is_file()}
        if path == f"/api/models/{self.repo}/revision/main":
            self._send(json.dumps({"id": self.repo, "sha": COMMIT}).encode(), body)
        elif path == f"/api/models/{self.repo}/tree/{COMMIT}":
            tree = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": sha1(p)}
                for name, p in sorted(files.items())
            ]
            self._send(json.dumps(tree).encode(), body)
        elif (name := path.removeprefix(f"/{self.repo}/resolve/{COMMIT}/")) in files:
            self.fetched.append(name)
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha1(files[name])}"'}
            self._send(files[name].read_bytes(), body, headers)
        else:
            self._send(b"{}", body, status=404)

    def _send(self, data: bytes, body: bool, headers=None, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


@pytest.fixture()
def folder_hub(tmp_path, tiny_qwen3_path, monkeypatch) -> type[FolderHub]:
    """``FolderHub`` serving tiny-qwen3 plus sharded weights, a sentencepiece model and remote
    code as ``Org/Big``, online, with an empty hub cache; ``fetched`` starts empty."""
    folder = tmp_path / "repo"
    shutil.copytree(tiny_qwen3_path, folder, ignore=shutil.ignore_patterns("agentloop-*"))
    for name in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]:
        (folder / name).write_bytes(b"weights")
    (folder / "model.safetensors.index.json").write_text("{}")
    (folder / "tokenizer.model").write_bytes(b"sentencepiece")
    (folder / "tokenization_big.py").write_text("# remote code")
    hub = type("Hub", (FolderHub,), {"repo": "Org/Big", "folder": folder, "fetched": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    use_hf_cache(monkeypatch, tmp_path / "hf", offline=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    yield hub
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_a_tokenizer_hub_id_downloads_no_weights(folder_hub, tmp_path):
    key = "actor_rollout_ref.model.tokenizer_path"
    snapshot = Path(resolve_model("Org/Big", key, need_config=False))
    assert snapshot == tmp_path / "hf/hub/models--Org--Big/snapshots" / COMMIT
    tokenizer_files = [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "tokenization_big.py",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    ]
    assert sorted(set(folder_hub.fetched)) == tokenizer_files  # no weight file was asked for
    assert sorted(p.name for p in snapshot.iterdir()) == tokenizer_files
    tokenizer = tokenizer_source(ModelConfig(path=str(snapshot))).load()
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645


def test_a_model_hub_id_downloads_its_weights(folder_hub):
    snapshot = Path(resolve_model("Org/Big", KEY))
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(
        p.name for p in folder_hub.folder.iterdir()
    )
    assert "model.safetensors" in folder_hub.fetched


def test_a_snapshot_with_only_a_tokenizer_is_no_model_but_is_a_tokenizer(hf_home, monkeypatch):
    use_hf_cache(monkeypatch, hf_home)
    snapshot = snapshot_of(hf_home, "Qwen/TokenizerOnly")
    with pytest.raises(HubModelError) as info:
        resolve_model("Qwen/TokenizerOnly", KEY)
    assert str(info.value) == (
        f"{KEY} 'Qwen/TokenizerOnly': the cached snapshot {snapshot} has no config.json (only "
        "part of the repository is cached, e.g. its tokenizer); download it into this cache "
        "where a hub is reachable (`hf download Qwen/TokenizerOnly`), or set "
        f"{KEY} to a local model folder"
    )
    key = "actor_rollout_ref.model.tokenizer_path"
    assert resolve_model("Qwen/TokenizerOnly", key, need_config=False) == snapshot


def test_hf_hub_cache_wins_over_hf_home(hf_home, monkeypatch, tmp_path):
    use_hf_cache(monkeypatch, tmp_path / "empty")
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    assert resolve_model(REPO, KEY) == snapshot_of(hf_home)


def test_local_folders_and_asset_names_come_before_hub_ids(hf_home, monkeypatch, tmp_path):
    use_hf_cache(monkeypatch, hf_home)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)  # a local folder of that name
    assert resolve_model(REPO, KEY) == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize(
    ("name", "hub"),
    [
        ("Qwen/Qwen2.5-3B-Instruct", True),
        ("meta-llama/Llama-3.1-8B", True),
        ("gpt2", False),  # no org: a bare name stays an unknown asset/folder
        ("/abs/path/model", False),
        ("./rel/model", False),
        ("a/b/c", False),
        ("Org/bad--name", False),
    ],
)
def test_what_counts_as_a_hub_id(name, hub):
    assert is_hub_id(name) is hub


def test_neither_folder_nor_asset_nor_hub_id_lists_all_three():
    with pytest.raises(ValueError) as info:
        resolve_model("/nowhere/model", KEY)
    assert str(info.value) == (
        f"{KEY} '/nowhere/model' is neither a model folder nor a known asset name "
        "(smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long) nor a Hugging Face hub id (org/name)"
    )


def test_servers_answer_to_the_hub_id_of_a_snapshot(hf_home):
    assert ServerConfig(model=snapshot_of(hf_home)).model_name == REPO
    assert ServerConfig(model="/models/tiny-qwen3").model_name == "tiny-qwen3"


@pytest.mark.slow
def test_hf_env_makes_a_hub_id_resolve_in_a_subprocess(hf_home, tmp_path):
    """What an e2e run script naming ``Qwen/Qwen3-0.6B`` relies on."""
    code = "from trainer.models import resolve_model; print(resolve_model('Qwen/Qwen3-0.6B'))"
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "elsewhere"), **hf_env(hf_home)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == snapshot_of(hf_home)
