"""Weight sync end to end on CPU: 2 FSDP2 trainer ranks (Ray actors, gloo) push their weights
into a running vLLM server (tiny-qwen3), by each route the servers on one node can take. After
a push the server's log-probs are the trainer model's."""

from __future__ import annotations

import pytest
import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from servers import ServerConfig, launch_servers
from tests.ray_local import init_local_ray
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
from trainer.workers import WorkerGroup, WorkerSpec

pytestmark = pytest.mark.integration

PROMPT = [151644, 872, 198, 9707, 11, 3555, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091]
GREEDY = {"max_tokens": 12, "temperature": 0.0}


@pytest.fixture(scope="module")
def trainer_model_path(tiny_qwen3_path, tmp_path_factory):
    """tiny-qwen3 with every weight moved: what the trainer holds, unlike the server."""
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("trainer_model")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def setup(tiny_qwen3_path, trainer_model_path):
    init_local_ray()
    (server,) = launch_servers(
        ServerConfig(model=str(tiny_qwen3_path), max_model_len=512, http=False), 1, num_cpus=1
    )
    path = str(trainer_model_path)
    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path),
        actor=ActorConfig(),
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    group = WorkerGroup(spec, 2)
    yield server, group
    group.shutdown()
    ray.get(server.shutdown.remote())
    ray.shutdown()


def _hf_logprobs(model, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("route", [None, "buckets"])
def test_after_a_push_the_server_serves_the_trainers_weights(
    setup, route, tiny_qwen3_path, trainer_model_path
):
    server, group = setup
    info = ray.get(server.weight_sync_info.remote())
    assert (info.dtype, info.loads_staged, info.transfer) == ("float32", True, "host")
    original = load_file(str(tiny_qwen3_path / "model.safetensors"))
    ray.get(server.update_weights.remote(list(original.items())))  # the server's own weights
    before = ray.get(server.generate.remote(PROMPT, GREEDY))

    sent = group.push_weights([server], 1 << 20, route)  # None: the ranks pick (staged here)

    trainer = AutoModelForCausalLM.from_pretrained(trainer_model_path, dtype=torch.float32)
    params = {k: v for k, v in trainer.state_dict().items() if k != "lm_head.weight"}  # tied
    assert sent["tensors"] == len(params)
    assert sent["bytes"] == sum(v.numel() * 4 for v in params.values())  # float32: served so
    after = ray.get(server.generate.remote(PROMPT, GREEDY))
    assert after.token_ids != before.token_ids
    sampled = ray.get(
        server.generate.remote(
            PROMPT, {"max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True}
        )
    )
    gap = (torch.tensor(sampled.log_probs) - _hf_logprobs(trainer.eval(), sampled.token_ids)).abs()
    assert gap.max().item() < 1e-3, gap.max().item()
