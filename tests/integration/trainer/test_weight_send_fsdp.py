"""Two FSDP2 ranks on gloo (plain processes, no Ray) write their own shards into one
shared-memory file: the file holds exactly what an all-gather gives, in the serving dtype,
with uneven shards (an odd vocabulary) included. The coalesced gather (one collective for many
tensors, what the LoRA adapter sync uses) gives the same tensors as one gather per tensor."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from servers.weights import read_bucket
from trainer.config.actor import FSDPConfig, ModelConfig
from trainer.workers.fsdp import apply_fsdp, full_tensors, init_distributed, load_model
from trainer.workers.gather import gather_tensors
from trainer.workers.weight_send import stage_shards

pytestmark = pytest.mark.integration


def _save_tiny_model(path: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=509,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )  # fmt: skip  (509 rows: shards of 255 and 254)
    Qwen3ForCausalLM(config).save_pretrained(path)


def _rank(rank: int, world: int, port: int, path: str) -> None:
    torch.set_num_threads(1)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cpu")
    model = apply_fsdp(load_model(path, ModelConfig(path=path), "cpu"), FSDPConfig(), "cpu")
    shared = None
    for dtype in (torch.bfloat16, torch.float32):
        plan, shared = stage_shards(model, dtype, shared)
        gathered = dict(full_tensors(model, dtype=dtype, skip_tied_head=True))  # collective
        if rank == 0:
            staged = dict(read_bucket(plan))
            assert list(staged) == list(gathered)
            for name, value in gathered.items():
                assert value.dtype == dtype, name  # gathered in the serving dtype
                assert staged[name].dtype == dtype, name
                assert torch.equal(staged[name], value), name
        state = model.state_dict()
        together = gather_tensors(list(state.values()), dtype=dtype)  # collective: one
        apart = dict(full_tensors(model, dtype=dtype))
        assert list(state) == list(apart)
        for (name, one), value in zip(apart.items(), together, strict=True):
            assert value.dtype == one.dtype and torch.equal(value, one), name
    shared.close()
    if rank == 0:
        assert not os.path.exists(shared.path)  # the owner removes it
    torch.distributed.destroy_process_group()
    # Every check passed. Leave without the interpreter's teardown: gloo's threads can abort
    # it ("terminate called without an active exception", SIGABRT after a clean run, seen once
    # in CI), which mp.spawn would report as this rank failing.
    os._exit(0)


def test_two_ranks_write_their_shards_into_what_an_all_gather_gives(tmp_path):
    path = str(tmp_path / "model")
    _save_tiny_model(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, path), nprocs=2, join=True)
