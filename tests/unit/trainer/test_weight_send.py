"""The trainer's side of weight sync, in one process: what is gathered or staged is in the
serving dtype (float32 master weights only for checkpoints), the staged file holds the
trainer's state, and vLLM's transfer API gets the arguments it expects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from servers.updates import StagedUpdate, TransferUpdate
from servers.weights import ALIGN, WeightSyncInfo, read_bucket
from trainer.workers.fsdp import full_tensors, shard_pieces
from trainer.workers.weight_send import (
    FullTensorSource,
    ServerTransferClient,
    serving_dtype,
    stage_shards,
    transfer_init_info,
)

ROOT = Path(__file__).resolve().parents[3]


def tiny_model(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=250, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config).float()


def info(dtype: str | None = "bfloat16", **kw) -> WeightSyncInfo:
    return WeightSyncInfo(backend="vllm", dtype=dtype, loads_staged=True, **kw)


def test_full_tensors_gather_in_the_asked_dtype_and_default_to_fp32_master_weights():
    model = tiny_model(tied=False)
    state = model.state_dict()
    served = dict(full_tensors(model, dtype=torch.bfloat16, device=None))
    assert {v.dtype for v in served.values()} == {torch.bfloat16}
    assert all(torch.equal(served[k], v.bfloat16()) for k, v in state.items())
    exported = dict(full_tensors(model.to(torch.bfloat16)))  # checkpoints: always float32
    assert {v.dtype for v in exported.values()} == {torch.float32}


def test_full_tensors_keep_integer_entries_and_skip_a_tied_head_on_request():
    model = tiny_model(tied=True)
    model.register_buffer("steps", torch.tensor([3], dtype=torch.int64))
    names = [k for k, _ in full_tensors(model, dtype=torch.bfloat16, skip_tied_head=True)]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    got = dict(full_tensors(model, dtype=torch.bfloat16))
    assert got["steps"].dtype == torch.int64 and "lm_head.weight" in got


def test_without_a_process_group_rank_0_holds_every_piece_whole():
    model = tiny_model(tied=True)
    pieces = shard_pieces(model, skip_tied_head=True)
    assert [p.name for p in pieces] == [k for k in model.state_dict() if k != "lm_head.weight"]
    assert all(p.start == 0 and p.local is not None for p in pieces)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_staged_file_holds_the_state_in_the_serving_dtype(dtype):
    model = tiny_model(tied=True)
    plan, shared = stage_shards(model, dtype)
    try:
        assert Path(shared.path).name.startswith(f"agentloop-weights-{os.getpid()}-")
        assert all(t.offset % ALIGN == 0 for t in plan.tensors)
        staged = dict(read_bucket(plan))
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        assert list(staged) == list(state)  # the server copies the embedding into its head
        for name, value in state.items():
            assert staged[name].dtype == dtype, name
            assert torch.equal(staged[name], value.to(dtype)), name
        # The next push reuses the file (the pages are already there).
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)
        again, same = stage_shards(model, dtype, shared)
        assert same is shared and again.path == plan.path
        assert torch.equal(
            dict(read_bucket(again))["model.norm.weight"], state["model.norm.weight"].to(dtype)
        )
    finally:
        shared.close()
    assert not Path(shared.path).exists()


def test_serving_dtype_is_the_servers_one_and_float32_when_unknown():
    assert serving_dtype([info("bfloat16"), info("bfloat16")]) == torch.bfloat16
    assert serving_dtype([info(None)]) == torch.float32
    with pytest.raises(ValueError, match=r"different dtypes: \['bfloat16', 'float32'\]"):
        serving_dtype([info("bfloat16"), info("float32")])


def test_transfer_source_declares_what_it_yields_with_the_tied_head_last():
    model = tiny_model(tied=True)
    source = FullTensorSource(model, torch.bfloat16)
    meta = source.metadata()
    sent = list(source)
    assert [(m.name, m.dtype, m.shape) for m in meta] == [
        (n, t.dtype, tuple(t.shape)) for n, t in sent
    ]
    assert {m.dtype for m in meta} == {torch.bfloat16}
    assert (
        sent[-1][0] == "lm_head.weight" and sent[-1][1] is dict(sent)["model.embed_tokens.weight"]
    )


class _Remote:
    def __init__(self, log: list, server: str, method: str) -> None:
        self.log, self.server, self.method = log, server, method

    def remote(self, *args):
        self.log.append((self.server, self.method, *args))


class _Server:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def __getattr__(self, method: str) -> _Remote:
        return _Remote(self.log, self.name, method)


def test_transfer_client_gives_each_servers_workers_their_own_nccl_ranks(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    log: list = []
    client = ServerTransferClient([_Server("a", log), _Server("b", log)], workers=[2, 1])
    client.init_weight_transfer_engine({"rank_offset": 1, "world_size": 4, "packed": True})
    client.init_weight_transfer_engine({"packed": True})  # ipc: no ranks
    client.start_weight_update()
    client.update_weights({"names": ["w"]})
    client.finish_weight_update()
    nccl = {"rank_offset": 1, "world_size": 4, "packed": True}
    assert log == [
        ("a", "apply_weights", TransferUpdate("init", nccl)),
        ("b", "apply_weights", TransferUpdate("init", {**nccl, "rank_offset": 3})),
        ("a", "apply_weights", TransferUpdate("init", {"packed": True})),
        ("b", "apply_weights", TransferUpdate("init", {"packed": True})),
        ("a", "apply_weights", TransferUpdate("start")),
        ("b", "apply_weights", TransferUpdate("start")),
        ("a", "apply_weights", TransferUpdate("update", {"names": ["w"]})),
        ("b", "apply_weights", TransferUpdate("update", {"names": ["w"]})),
        ("a", "apply_weights", TransferUpdate("finish")),
        ("b", "apply_weights", TransferUpdate("finish")),
    ]


def test_transfer_init_info_is_vllms_for_nccl_and_ipc():
    servers = [info(workers=2), info(workers=1)]
    nccl = transfer_init_info("nccl", 0, servers, "10.0.0.1", 29555)
    assert (nccl.backend, nccl.world_size, nccl.rank, nccl.is_sender) == ("nccl", 4, 0, True)
    assert (nccl.master_address, nccl.master_port) == ("10.0.0.1", 29555)
    ipc = transfer_init_info("ipc", 1, servers, "10.0.0.1", 29555)
    assert (ipc.backend, ipc.packed, ipc.is_sender) == ("ipc", True, False)
    with pytest.raises(ValueError, match="nccl and ipc"):
        transfer_init_info("gloo", 0, servers, "", 0)


@pytest.mark.slow
def test_fsdp_module_imports_without_ray_or_vllm():
    code = "import sys\nsys.modules.update(ray=None, vllm=None)\nimport trainer.workers.fsdp\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


def test_a_server_whose_engine_cannot_load_staged_files_says_how_to_send():
    import asyncio

    from servers.actor import AsyncServer

    server = AsyncServer.__new__(AsyncServer)  # an SGLang adapter takes buckets only
    server.config = SimpleNamespace(backend="sglang")
    server.core = SimpleNamespace(engine=SimpleNamespace(weight_updates=frozenset({"buckets"})))
    with pytest.raises(NotImplementedError) as error:
        asyncio.run(server.apply_weights(StagedUpdate([])))
    assert str(error.value) == (
        "sglang servers take no staged weight updates (they take buckets): send the weights "
        "as BucketUpdate buckets"
    )


def test_a_lora_actor_sends_its_adapter_where_every_server_loads_its_rank_else_merged_once(
    monkeypatch, caplog
):
    """Servers started with LoRA at the actor's rank or above get the adapter; one that cannot
    load it (SGLang, LoRA off, a smaller rank) makes the push send merged weights, said once."""
    import logging

    import ray

    from trainer.config.actor import ModelConfig
    from trainer.workers.lora import apply_lora
    from trainer.workers.weight_send import WeightSender

    model = apply_lora(tiny_model(tied=False), ModelConfig(path="tiny", lora_rank=8))
    sender = WeightSender(model)
    sent: list[str] = []

    def record(what: str) -> dict[str, float]:
        sent.append(what)
        return {"tensors": 1.0, "bytes": 1.0}

    monkeypatch.setattr(sender, "_push_adapter", lambda servers, dtype: record("adapter"))
    monkeypatch.setattr(
        sender, "_push_buckets", lambda s, d, b, merged=False: record(f"merged={merged}")
    )
    monkeypatch.setattr(ray, "get", lambda refs: refs)

    def server(lora_rank: int) -> SimpleNamespace:
        answer = info("float32", lora_rank=lora_rank)
        return SimpleNamespace(weight_sync_info=SimpleNamespace(remote=lambda: answer))

    with caplog.at_level(logging.WARNING, logger="trainer.workers.weight_send"):
        sender.push([server(8), server(16)], 1 << 20)
        sender.push([server(16), server(0)], 1 << 20)
        sender.push([server(16), server(0)], 1 << 20)
        sender.push([server(16), server(4)], 1 << 20)
    assert sent == ["adapter", "merged=True", "merged=True", "merged=True"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "weight sync: sending merged full weights, not the rank-8 LoRA adapter: the rollout "
        "servers load adapters up to rank 0 (0: none, as with "
        "actor_rollout_ref.rollout.lora_sync=merged or SGLang)"
    ]
    with pytest.raises(ValueError, match=r"sends its adapter or merged weights .*not 'staged'"):
        sender.push([server(16)], 1 << 20, "staged")


def test_each_server_gets_the_route_its_node_allows_by_node_id(monkeypatch):
    """Staged only for a server that loads staged files on the node of every rank; buckets for
    a server on another node or one that cannot load files (SGLang), in the same push; the
    route is taken from node ids, whatever the files' reach."""
    import ray

    from trainer.workers.weight_send import WeightSender

    sender = WeightSender(tiny_model(tied=False))
    pushed: list[tuple[str, list[str]]] = []

    def record(route: str):
        def push(servers, *rest, **kw) -> dict[str, float]:
            pushed.append((route, [s.name for s in servers]))
            return {"tensors": 10.0, "bytes": 100.0}

        return push

    monkeypatch.setattr(sender, "_push_staged", record("staged"))
    monkeypatch.setattr(sender, "_push_buckets", record("buckets"))
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    sender._nodes = {"node-a"}  # every rank on node-a

    def server(name: str, node: str, staged: bool = True) -> SimpleNamespace:
        answer = WeightSyncInfo(backend="vllm", dtype="float32", loads_staged=staged, node_id=node)
        return SimpleNamespace(name=name, weight_sync_info=SimpleNamespace(remote=lambda: answer))

    servers = [server("s0", "node-b"), server("s1", "node-a"), server("s2", "node-a", False)]
    sent = sender.push(servers, 1 << 20)
    assert sent["routes"] == ["buckets", "staged", "buckets"]
    assert pushed == [("buckets", ["s0", "s2"]), ("staged", ["s1"])]
    assert sent["bytes"] == 200.0 and sent["tensors"] == 10.0
    sender._nodes = {"node-a", "node-b"}  # ranks on two nodes: no server has them all
    assert sender.push(servers[:2], 1 << 20)["routes"] == ["buckets", "buckets"]
    assert sender.push(servers[:2], 1 << 20, "staged")["routes"] == ["staged", "staged"]


def test_route_metrics_name_each_server_and_count_each_route():
    from trainer.loop.weight_sync import route_metrics

    assert route_metrics(["buckets", "staged", "buckets"]) == {
        "weight_sync/server_0/buckets": 1.0,
        "weight_sync/server_1/staged": 1.0,
        "weight_sync/server_2/buckets": 1.0,
        "weight_sync/servers_buckets": 2.0,
        "weight_sync/servers_staged": 1.0,
    }
