"""Weight sync on CUDA (marker ``gpu``; skipped without CUDA).

1. FSDP2 ranks on NCCL (plain processes: torch and transformers only): what is gathered for
   the servers is bf16 (cast on the GPU before the all-gather), stays on the GPU when asked,
   and the shared-memory file the ranks write shard by shard holds the same bf16 weights.
2. vLLM's weight-transfer API (needs a CUDA vLLM and Ray): a server started with
   ``weight_transfer=ipc`` (trainer rank on the same GPU) or ``nccl`` (on another GPU) serves
   the trainer's weights after a push.
"""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from trainer.config.actor import FSDPConfig, ModelConfig
from trainer.workers.fsdp import apply_fsdp, full_tensors, init_distributed, load_model

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def _save_tiny_model(path: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=509, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(path)


def _rank(rank: int, world: int, port: int, path: str) -> None:
    from servers.weights import read_bucket
    from trainer.workers.weight_send import stage_shards

    os.environ["LOCAL_RANK"] = str(rank)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cuda")
    model = apply_fsdp(load_model(path, ModelConfig(path=path), "cuda"), FSDPConfig(), "cuda")
    on_gpu = dict(full_tensors(model, dtype=torch.bfloat16, device=None, skip_tied_head=True))
    on_host = dict(full_tensors(model, dtype=torch.bfloat16, skip_tied_head=True))
    exported = dict(full_tensors(model, skip_tied_head=True))
    plan, shared = stage_shards(model, torch.bfloat16)
    if rank == 0:
        staged = dict(read_bucket(plan))
        for name, value in on_gpu.items():
            assert value.is_cuda and value.dtype == torch.bfloat16, name
            assert on_host[name].device.type == "cpu" and on_host[name].dtype == torch.bfloat16
            assert exported[name].dtype == torch.float32  # checkpoints keep the master weights
            assert torch.equal(on_host[name], value.cpu()), name
            assert torch.equal(staged[name], on_host[name]), name
    shared.close()
    torch.distributed.destroy_process_group()


def test_cuda_weights_leave_the_shards_in_bf16(tmp_path):
    path = str(tmp_path / "model")
    _save_tiny_model(path)
    world = min(2, torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world, port, path), nprocs=world, join=True)


PROMPT = [151644, 872, 198, 9707, 11, 3555, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


# A mark, not importorskip: it skips before the tiny_qwen3_path fixture would build the asset.
@pytest.mark.skipif(not (_installed("vllm") and _installed("ray")), reason="needs vLLM and Ray")
@pytest.mark.parametrize("backend", ["ipc", "nccl"])
def test_vllm_weight_transfer_serves_the_trainers_weights(backend, tiny_qwen3_path, tmp_path):
    import ray

    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("an NCCL transfer needs the trainer and the engine on different GPUs")
    from transformers import AutoModelForCausalLM

    from servers import ServerConfig, launch_servers
    from tests.generate_requests import req
    from tests.ray_local import REPO, stop_local_ray
    from trainer.config.actor import ActorConfig, RefConfig
    from trainer.workers import WorkerGroup, WorkerSpec

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path)
    share = 0.5 if backend == "ipc" else 1.0  # ipc: trainer rank and engine on one GPU
    stop_local_ray()  # its own Ray: all the GPUs and CPUs the machine has, not LOCAL_RAY
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, include_dashboard=False)
    try:
        config = ServerConfig(
            model=str(tiny_qwen3_path), http=False, weight_transfer=backend,
            gpu_memory_utilization=0.3, max_model_len=512,
        )  # fmt: skip
        (server,) = launch_servers(config, 1, num_gpus=share)
        spec = WorkerSpec(
            model_path=str(tmp_path), model=ModelConfig(path=str(tmp_path)), actor=ActorConfig(),
            ref=RefConfig(), need_ref=False, device="cuda", gpu_share=share,
        )  # fmt: skip
        group = WorkerGroup(spec, 1)
        info = ray.get(server.weight_sync_info.remote())
        assert (info.dtype, info.transfer) == ("bfloat16", backend)
        sent = group.push_weights([server], 1 << 20)
        # bf16; the state dict lists the tied head, which is sent as the gathered embedding
        assert sent["bytes"] == 2 * sum(v.numel() for v in model.state_dict().values())
        sampled = ray.get(
            server.generate.remote(
                req(PROMPT, {"max_tokens": 16, "temperature": 1.0, "seed": 3, "ignore_eos": True})
            )
        )
        ids = torch.tensor([PROMPT + sampled.token_ids])
        with torch.no_grad():
            logits = model.bfloat16()(ids).logits[0, len(PROMPT) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sampled.token_ids)[:, None])
        gap = (torch.tensor(sampled.log_probs) - ref[:, 0]).abs().max().item()
        assert gap < 0.1, gap  # bf16 on both sides, different kernels
        group.shutdown()
        ray.get(server.shutdown.remote())
    finally:
        ray.shutdown()
