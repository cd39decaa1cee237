"""LoRA on the actor in one process (no process group): ``apply_lora`` wraps the model so only
the adapter trains, ``adapter_tensors`` / ``adapter_config`` are what PEFT saves,
``merged_tensors`` is the plain transformers state dict with ``W + scaling * B @ A`` merged,
and every bad LoRA key stops the start with a message naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from trainer.config import ConfigError, load_config
from trainer.config.actor import ModelConfig
from trainer.config.sft import SFTModelConfig
from trainer.config.verl.compat import translate_overrides
from trainer.workers.fsdp import decoder_layers, load_model
from trainer.workers.log_prob_head import install_log_prob_head
from trainer.workers.lora import (
    adapter_config,
    adapter_tensors,
    apply_lora,
    is_lora,
    merged_tensors,
    trainable_parameters,
)

RANK, ALPHA = 8, 16
Q = "model.layers.0.self_attn.q_proj"


def lora_config(path: Path, **overrides) -> ModelConfig:
    return ModelConfig(path=str(path), lora_rank=RANK, lora_alpha=ALPHA, **overrides)


def ids(n: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(10, 5000, (n, length), generator=torch.Generator().manual_seed(0))


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.fixture(scope="module")
def base(tiny_qwen3_path):
    return load_model(str(tiny_qwen3_path), ModelConfig(path=str(tiny_qwen3_path)), "cpu")


@pytest.fixture(scope="module")
def trained(tiny_qwen3_path):
    """A LoRA model whose B matrices moved off zero (as after training)."""
    torch.manual_seed(0)
    model = load_model(str(tiny_qwen3_path), lora_config(tiny_qwen3_path), "cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_a_new_adapter_trains_alone_and_starts_as_the_model(tiny_qwen3_path, base):
    model = load_model(str(tiny_qwen3_path), lora_config(tiny_qwen3_path), "cpu")
    assert is_lora(model) and not is_lora(base)
    assert apply_lora(base, ModelConfig(path=str(tiny_qwen3_path))) is base  # rank 0: as is
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {p.dtype for p in trainable_parameters(model)} == {torch.float32}
    # every linear layer of every block but the head (all-linear): 7 per layer x (A, B)
    assert len(trainable) == 2 * 7 * len(decoder_layers(model))
    assert len(decoder_layers(model)) == len(decoder_layers(base)) == 2
    assert torch.equal(logits(model, ids()), logits(base, ids()))  # B starts at zero
    # log-probs come from the chunked LM head through the PEFT wrapper too
    assert install_log_prob_head(model) is model.get_base_model().lm_head


def test_target_and_exclude_modules_pick_the_adapted_layers(tiny_qwen3_path):
    config = lora_config(tiny_qwen3_path, target_modules=["q_proj", "v_proj"])
    names = {n for n, _ in load_model(str(tiny_qwen3_path), config, "cpu").named_parameters()}
    assert {n.split(".")[-4] for n in names if "lora_A" in n} == {"q_proj", "v_proj"}
    config = lora_config(tiny_qwen3_path, exclude_modules=["down_proj", "up_proj", "gate_proj"])
    names = {n for n, _ in load_model(str(tiny_qwen3_path), config, "cpu").named_parameters()}
    adapted = {n.split(".")[-4] for n in names if "lora_A" in n}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_adapter_tensors_are_what_peft_saves(trained, tmp_path):
    got = dict(adapter_tensors(trained))
    assert next(iter(got)) == f"base_model.model.{Q}.lora_A.weight"
    expected = get_peft_model_state_dict(trained)
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    trained.save_pretrained(tmp_path)
    assert set(load_file(tmp_path / "adapter_model.safetensors")) == set(got)
    served = dict(adapter_tensors(trained, dtype=torch.bfloat16, device=None))
    assert {v.dtype for v in served.values()} == {torch.bfloat16}


def test_adapter_config_is_peft_s_adapter_config_json(trained, tiny_qwen3_path, tmp_path):
    config = adapter_config(trained)
    assert json.loads(json.dumps(config)) == config  # JSON-safe
    trained.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "adapter_config.json").read_text())
    assert set(config) == set(written)
    for key, value in written.items():
        if key == "target_modules":
            assert sorted(value) == config[key]
        else:
            assert config[key] == value, key
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA
    assert config["base_model_name_or_path"] == str(tiny_qwen3_path)
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"


def test_merged_tensors_are_the_plain_state_dict_with_the_adapter_merged(trained, base):
    merged = dict(merged_tensors(trained))
    plain = base.state_dict()
    assert list(merged) == list(plain)  # transformers' names, in its order
    scaling = ALPHA / RANK
    layer = trained.get_base_model().get_submodule(Q)
    delta = scaling * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert delta.abs().max() > 1e-3
    assert torch.allclose(merged[f"{Q}.weight"], plain[f"{Q}.weight"] + delta, atol=1e-7)
    assert torch.equal(merged["model.norm.weight"], plain["model.norm.weight"])
    unloaded = copy.deepcopy(trained).merge_and_unload().state_dict()  # PEFT's own merge
    assert max((merged[k] - v).abs().max().item() for k, v in unloaded.items()) < 1e-6
    # the merged weights in a plain transformers model give the adapter model's outputs
    plain_model = copy.deepcopy(base)
    plain_model.load_state_dict(merged)
    assert torch.allclose(logits(plain_model, ids()), logits(trained, ids()), atol=1e-5)
    # served: cast after the float32 merge; a tied head can stay behind
    served = dict(merged_tensors(trained, dtype=torch.bfloat16, skip_tied_head=True))
    assert list(served) == [k for k in plain if k != "lm_head.weight"]
    assert torch.equal(served[f"{Q}.weight"], merged[f"{Q}.weight"].bfloat16())


def test_the_disabled_adapter_is_the_base_model(trained, base):
    with trained.disable_adapter():
        assert torch.equal(logits(trained, ids()), logits(base, ids()))
    assert not torch.allclose(logits(trained, ids()), logits(base, ids()), atol=1e-3)


def test_gradient_checkpointing_backpropagates_into_the_adapter(tiny_qwen3_path):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        config = lora_config(tiny_qwen3_path, enable_gradient_checkpointing=checkpointing)
        model = load_model(str(tiny_qwen3_path), config, "cpu")
        model.train()
        with torch.no_grad():  # B != 0, so A gets a gradient too
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.fill_(0.01)
        x = ids()
        model(input_ids=x, labels=x).loss.backward()
        assert model.get_base_model().is_gradient_checkpointing == checkpointing
        assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    plain, checkpointed = grads
    assert all(g is not None and g.abs().max() > 0 for g in checkpointed.values())
    assert all(torch.allclose(checkpointed[k], v, atol=1e-6) for k, v in plain.items())


def test_an_adapter_folder_loads_trainable_and_sets_the_rank(trained, tiny_qwen3_path, tmp_path):
    trained.save_pretrained(tmp_path)
    config = ModelConfig(path=str(tiny_qwen3_path), lora_adapter_path=str(tmp_path))
    assert config.lora_rank == RANK  # verl's: the adapter says its rank
    model = load_model(str(tiny_qwen3_path), config, "cpu")
    assert len(trainable_parameters(model)) == len(trainable_parameters(trained))
    got, expected = dict(adapter_tensors(model)), dict(adapter_tensors(trained))
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    again = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_qwen3_path), tmp_path
    )
    assert torch.allclose(logits(again, ids()), logits(model, ids()), atol=1e-6)


# ---- bad keys -----------------------------------------------------------------------------------
M = "actor_rollout_ref.model"


def test_bad_lora_keys_name_themselves(tiny_qwen3_path, tmp_path):
    path = str(tiny_qwen3_path)
    cases = [
        (dict(lora_rank=-1), f"{M}.lora_rank must be >= 0 (0: no LoRA), got -1"),
        (dict(lora_rank=8, lora_alpha=0), f"{M}.lora_alpha must be > 0, got 0"),
        (
            dict(lora_rank=8, target_modules=[]),
            f"{M}.target_modules is empty: use all-linear or a list of module names "
            "(e.g. [q_proj, v_proj])",
        ),
        (
            dict(lora_adapter_path=str(tmp_path / "gone")),
            f"{M}.lora_adapter_path={tmp_path / 'gone'} is not a folder: point it at a PEFT "
            "adapter folder (what PeftModel.save_pretrained writes), or set it to null",
        ),
        (
            dict(lora_adapter_path=str(tmp_path)),
            f"{M}.lora_adapter_path={tmp_path} has no adapter_config.json: point it at a PEFT "
            "adapter folder (what PeftModel.save_pretrained writes), or set it to null",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as err:
            ModelConfig(path=path, **kwargs)
        assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        SFTModelConfig(path=path, lora_rank=-2)
    assert str(err.value) == "model.lora_rank must be >= 0 (0: no LoRA), got -2"


def test_an_adapter_of_another_rank_says_which_key_to_change(trained, tiny_qwen3_path, tmp_path):
    trained.save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        ModelConfig(path=str(tiny_qwen3_path), lora_rank=16, lora_adapter_path=str(tmp_path))
    assert str(err.value) == (
        f"{M}.lora_rank=16 but the adapter at {M}.lora_adapter_path has rank 8: set "
        f"{M}.lora_rank=8 (or 0), or point {M}.lora_adapter_path at a rank-16 adapter"
    )


def test_a_dora_adapter_is_refused(tiny_qwen3_path, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path)
    lora = LoraConfig(r=4, target_modules=["q_proj"], use_dora=True, task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(tmp_path)
    config = ModelConfig(path=str(tiny_qwen3_path), lora_adapter_path=str(tmp_path))
    with pytest.raises(ValueError) as err:
        load_model(str(tiny_qwen3_path), config, "cpu")
    assert str(err.value) == (
        f"the adapter at {M}.lora_adapter_path={tmp_path}: only plain LoRA adapters train here "
        "(no DoRA, no trained biases, no modules_to_save)"
    )


# ---- verl's keys --------------------------------------------------------------------------------
def test_verls_lora_keys_are_ours(tiny_qwen3_path):
    keys = [
        f"{M}.lora_rank=32",
        f"{M}.lora_alpha=32",
        f"{M}.target_modules=all-linear",
        f"{M}.exclude_modules=null",
        f"{M}.lora_adapter_path=null",
    ]
    assert translate_overrides(keys) == keys
    config, _ = load_config([f"{M}.path={tiny_qwen3_path}", "data.train_files=x.jsonl", *keys])
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (32, 32, "all-linear")


def test_verls_megatron_lora_block_is_refused_with_our_keys():
    with pytest.raises(ValueError) as err:
        translate_overrides([f"{M}.lora.rank=8"])
    assert str(err.value) == (
        f"{M}.lora.rank=8 is not supported here: verl's Megatron LoRA block (Megatron module "
        f"names); the FSDP2 actor here reads {M}.lora_rank, lora_alpha, target_modules "
        "(transformers names, e.g. all-linear), exclude_modules and lora_adapter_path"
    )


def test_layered_summon_is_a_no_op(caplog, monkeypatch):
    monkeypatch.setattr("trainer.config._warned", set())
    assert translate_overrides(["actor_rollout_ref.rollout.layered_summon=True"]) == []
    assert "only the adapter is gathered" in caplog.text


def test_hf_merged_needs_lora(tiny_qwen3_path):
    args = [
        f"{M}.path={tiny_qwen3_path}",
        "data.train_files=x.jsonl",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model,hf_merged]",
    ]
    with pytest.raises(ValueError) as err:
        load_config(args)[0].check()
    assert str(err.value) == (
        "actor_rollout_ref.actor.checkpoint.save_contents has hf_merged, which merges a LoRA "
        f"adapter, but {M}.lora_rank=0: hf_model is the full model already; drop hf_merged "
        f"(or set {M}.lora_rank)"
    )
    load_config([*args, f"{M}.lora_rank=4"])[0].check()
    with pytest.raises(ConfigError) as err:
        load_config([*args[:2], "actor_rollout_ref.actor.checkpoint.save_contents=[hf_mergd]"])
    assert "unknown item 'hf_mergd'; use model, optimizer, extra, hf_model, hf_merged" in str(
        err.value
    )


def test_the_free_space_check_counts_the_adapter_not_the_model(trained, tiny_qwen3_path):
    """With every linear layer adapted, the model and optimizer parts of a checkpoint are the
    adapter's numbers exactly (float32 weights + Adam's two moments); hf_merged stays whole."""
    from trainer.loop.checkpoint import checkpoint_bytes

    adapter = sum(p.numel() for p in trainable_parameters(trained))
    full = checkpoint_bytes(tiny_qwen3_path, ["model", "optimizer"])
    assert checkpoint_bytes(tiny_qwen3_path, ["model", "optimizer"], RANK) == 12 * adapter < full
    merged = checkpoint_bytes(tiny_qwen3_path, ["hf_merged"], RANK)
    assert merged == checkpoint_bytes(tiny_qwen3_path, ["hf_model"]) > 40 * adapter
