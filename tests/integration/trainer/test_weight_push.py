"""Weight sync end to end on CPU: 2 FSDP2 trainer ranks (Ray actors, gloo) push their weights
into a running vLLM server (tiny-qwen3, started with LoRA enabled), by each route the servers on
one node can take. After a push the server's log-probs are the trainer model's. A LoRA actor
sends its adapter, which the server loads as its next version, or (a server that cannot load
it) the weights with the adapter merged in."""

from __future__ import annotations

import pytest
import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from servers import ServerConfig, launch_servers
from tests.generate_requests import req
from tests.weight_updates import load_named_sync
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
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
def setup(local_ray, tiny_qwen3_path, trainer_model_path):
    (server,) = launch_servers(
        ServerConfig(model=str(tiny_qwen3_path), max_model_len=512, http=False, lora_rank=8),
        1,
        num_cpus=1,
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
    load_named_sync(server, list(original.items()))  # the server's own weights
    before = ray.get(server.generate.remote(req(PROMPT, GREEDY)))

    sent = group.push_weights([server], 1 << 20, route)  # None: the ranks pick (staged here)

    trainer = AutoModelForCausalLM.from_pretrained(trainer_model_path, dtype=torch.float32)
    params = {k: v for k, v in trainer.state_dict().items() if k != "lm_head.weight"}  # tied
    assert sent["tensors"] == len(params)
    assert sent["bytes"] == sum(v.numel() * 4 for v in params.values())  # float32: served so
    after = ray.get(server.generate.remote(req(PROMPT, GREEDY)))
    assert after.token_ids != before.token_ids
    sampled = ray.get(
        server.generate.remote(
            req(PROMPT, {"max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True})
        )
    )
    gap = (torch.tensor(sampled.log_probs) - _hf_logprobs(trainer.eval(), sampled.token_ids)).abs()
    assert gap.max().item() < 1e-3, gap.max().item()


def test_delta_sync_sends_what_changed_and_a_server_off_the_trainers_weights_is_named(
    setup, tiny_qwen3_path, trainer_model_path
):
    """Delta sync on the real server: the weights whole first (it holds no base), nothing when
    nothing changed, bf16 differences after a training step (half the bytes, and the server
    serves the trained weights), an error naming the server whose weights were changed
    behind the trainer's back, and the weights whole again once it lost its base. Runs before
    the LoRA test (which leaves the server serving an adapter); the step it trains moves the
    module's actor by ~1e-6, far below that test's tolerances."""
    from servers.delta import DeltaEntry
    from servers.updates import DeltaUpdate
    from tests.integration.trainer.test_fsdp_workers import make_batch
    from trainer.workers.weight_delta import DeltaSpec

    server, group = setup
    original = load_file(str(tiny_qwen3_path / "model.safetensors"))
    load_named_sync(server, list(original.items()))  # buckets: the server holds no delta base
    assert ray.get(server.weight_sync_info.remote()).delta_base is None
    model = AutoModelForCausalLM.from_pretrained(trainer_model_path, dtype=torch.float32)
    full = sum(v.numel() * 4 for k, v in model.state_dict().items() if k != "lm_head.weight")
    exact = DeltaSpec(full_every=0)

    first = group.push_weights([server], 1 << 20, None, exact)
    assert (first["routes"], first["whole_servers"], first["bytes"]) == (["delta"], 1.0, full)
    base = ray.get(server.weight_sync_info.remote()).delta_base
    assert base is not None
    nothing = group.push_weights([server], 1 << 20, None, exact)
    assert (nothing["whole_servers"], nothing["bytes"]) == (0.0, 0.0)

    batch = make_batch()
    batch.old_log_probs = group.compute_log_prob(batch)[0]
    group.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
    diff = group.push_weights([server], 1 << 20, None, DeltaSpec(encoding="bf16_diff"))
    assert diff["whole_servers"] == 0.0 and diff["bytes"] == full / 2
    trained = group.full_state_dict()
    model.load_state_dict(trained, strict=False)
    sampled = ray.get(
        server.generate.remote(
            req(PROMPT, {"max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True})
        )
    )
    gap = (torch.tensor(sampled.log_probs) - _hf_logprobs(model.eval(), sampled.token_ids)).abs()
    assert gap.max().item() < 1e-3, gap.max().item()

    # a base file changed outside the sync: the next push's checksums differ
    held = ray.get(server.weight_sync_info.remote()).delta_base
    name = "model.norm.weight"
    poke = DeltaEntry(name, torch.tensor([5.0]), index=torch.tensor([0], dtype=torch.int32))
    update = DeltaUpdate(held, held, entries=[poke], begin=True, finish=True)
    ray.get(server.apply_weights.remote(update))
    with pytest.raises(RuntimeError, match=r"weight sync: server 0 \(actor [0-9a-f]{12}\) holds"):
        group.push_weights([server], 1 << 20, None, exact)

    load_named_sync(server, list(original.items()))  # another route: the base is gone
    again = group.push_weights([server], 1 << 20, None, exact)
    assert (again["whole_servers"], again["bytes"]) == (1.0, full)


def test_a_lora_actor_sends_its_adapter_or_merged_weights_and_the_server_serves_them(
    setup, trainer_model_path, tmp_path
):
    """The LoRA actor's base is the trainer model (pushed in full first); one update moves its
    adapter (B starts at zero). Merged: the server's base weights become W + scaling * B @ A.
    Adapter: the server is given its base back, then loads the adapter as version 1."""
    from peft import PeftModel

    from servers.lora import write_adapter
    from tests.integration.trainer.test_fsdp_workers import actor_config, make_batch

    server, group = setup
    path = str(trainer_model_path)
    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path, lora_rank=8, lora_alpha=16),
        actor=actor_config(optim=OptimConfig(lr=1e-2, weight_decay=0.0), ppo_epochs=1),
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    lora = WorkerGroup(spec, 2)
    try:
        batch = make_batch()
        batch.old_log_probs = lora.compute_log_prob(batch)[0]
        lora.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
        tensors, config = lora.adapter_state()
        write_adapter(tmp_path / "adapter", tensors, config)
        base = AutoModelForCausalLM.from_pretrained(trainer_model_path, dtype=torch.float32)
        full_bytes = sum(
            v.numel() * 4 for k, v in base.state_dict().items() if k != "lm_head.weight"
        )
        trained = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()

        def gap() -> tuple[float, float]:
            """Server vs the trained actor, and vs its base model, on sampled tokens."""
            params = {"max_tokens": 24, "temperature": 1.0, "seed": 5, "ignore_eos": True}
            out = ray.get(server.generate.remote(req(PROMPT, params)))
            served = torch.tensor(out.log_probs)
            with trained.disable_adapter():
                plain = _hf_logprobs(trained, out.token_ids)
            actor = _hf_logprobs(trained, out.token_ids)
            return (served - actor).abs().max().item(), (served - plain).abs().max().item()

        group.push_weights([server], 1 << 20)  # the LoRA actor's base, in full
        merged = lora.push_weights([server], 1 << 20, "merged")
        assert merged["bytes"] == full_bytes
        to_actor, to_base = gap()
        assert to_actor < 1e-3 and to_base > 1e-2, (to_actor, to_base)
        assert ray.get(server.health.remote())["lora_version"] == 0

        group.push_weights([server], 1 << 20)  # the base again, then the adapter on top
        sent = lora.push_weights([server], 1 << 20)  # the ranks pick: adapter
        assert sent["tensors"] == len(tensors)
        assert sent["bytes"] == sum(t.numel() * 4 for t in tensors.values()) < merged["bytes"] / 50
        assert ray.get(server.health.remote())["lora_version"] == 1
        to_actor, to_base = gap()
        assert to_actor < 1e-3 and to_base > 1e-2, (to_actor, to_base)
        with pytest.raises(ValueError, match="a LoRA actor sends its adapter or merged weights"):
            lora.push_weights([server], 1 << 20, "staged")
    finally:
        lora.shutdown()
