"""``agentloop-sft`` end to end on tiny-qwen3 with 2 FSDP2 ranks over gloo: the loss goes down
over epochs, the first step equals the same step in one process, the HF export loads and fits
the conversations better than the initial model, and a second run resumes from the checkpoint
without repeating a step."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.unit.agentloop.scripted import CALC_SCHEMA
from trainer.cli.sft import main
from trainer.config.actor import ModelConfig
from trainer.data.rows import read_rows
from trainer.sft.data import collate_sft, encode_rows, epoch_order
from trainer.workers import forward_log_probs
from trainer.workers.fsdp import load_model
from trainer.workers.sft_step import sft_update

pytestmark = pytest.mark.integration


def conversation(a: int, b: int) -> dict:
    call = {"type": "function", "function": {"name": "calc", "arguments": {"a": a, "b": b}}}
    return {
        "messages": [
            {"role": "system", "content": "You are a calculator. Use the calc tool."},
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": f"The answer is {a + b}."},
        ],
        "tools": [CALC_SCHEMA],
    }


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    rows = [conversation(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@torch.no_grad()
def mean_nll(model_path, data_file) -> float:
    """Token-mean NLL of the assistant tokens of every training conversation."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    samples = encode_rows(read_rows([str(data_file)]), tokenizer, max_length=4096)
    batch = collate_sft(samples, tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    log_probs, _ = forward_log_probs(model, batch.trimmed())
    mask = batch.response_mask.float()
    return float(-(log_probs * mask).sum() / mask.sum())


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def first_step_in_one_process(model_path, data_file) -> dict[str, float]:
    """The run's first optimizer step (same rows, same micro-batches) without FSDP."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    samples = encode_rows(read_rows([str(data_file)]), tokenizer, max_length=4096)
    rows = epoch_order(len(samples), 0, seed=1, shuffle=True)[:8]
    batch = collate_sft([samples[i] for i in rows], tokenizer.pad_token_id)
    model = load_model(str(model_path), ModelConfig(path=str(model_path)), "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = {"micro_batch_size": 4, "use_dynamic_bsz": False, "max_token_len": 4096}
    return sft_update(model, optimizer, None, batch, **step, grad_clip=1.0)


def test_sft_learns_exports_and_resumes(local_ray, data_file, tiny_qwen3_path, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    common = [
        f"data.train_files={data_file}",
        "model.path=tiny-qwen3",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",  # 2 micro-batches on each of the 2 ranks
        "trainer.n_gpus_per_node=2",
        "optim.lr=1e-3",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={ckpt}",
    ]
    assert main([*common, "trainer.total_epochs=3"]) == 0
    hf = ckpt / "global_step_6" / "actor" / "huggingface"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(hf)
    first = metrics(ckpt)
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6]
    curve = [r["train/loss"] for r in first]
    per_epoch = [sum(curve[i : i + 2]) / 2 for i in (0, 2, 4)]
    with capsys.disabled():
        print("\nloss per step:", " ".join(f"{x:.4f}" for x in curve))
        print("loss per epoch:", " ".join(f"{x:.4f}" for x in per_epoch))
    assert per_epoch[0] > per_epoch[1] > per_epoch[2]
    # normalised over micro-batches and ranks: the first step equals the one-process step
    single = first_step_in_one_process(tiny_qwen3_path, data_file)
    for key in ("train/loss", "train/grad_norm", "train/loss_tokens"):
        assert first[0][key] == pytest.approx(single[key], rel=1e-5), key
    # the export is a transformers folder that fits the training conversations better
    before, after = mean_nll(tiny_qwen3_path, data_file), mean_nll(hf, data_file)
    with capsys.disabled():
        print(f"NLL on the training conversations: initial {before:.4f}, after SFT {after:.4f}")
    assert after < before - 0.1
    # resume: one more step from global_step_6 (weights, optimizer and data position),
    # with a validation loss at the last step
    resume = [*common, "trainer.total_training_steps=7", f"data.val_files={data_file}"]
    assert main(resume) == 0
    hf7 = ckpt / "global_step_7" / "actor" / "huggingface"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(hf7)
    records = metrics(ckpt)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert records[6]["train/epoch"] == 3.0
    with capsys.disabled():
        print(f"resumed step 7 loss: {records[6]['train/loss']:.4f}")
    assert records[6]["train/loss"] < per_epoch[1]  # trained weights came back, not initial ones
    state = json.loads((ckpt / "global_step_7" / "trainer_state.json").read_text())
    assert (state["step"], state["epoch"], state["next_batch"]) == (7, 3, 1)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert records[6]["val/loss"] == pytest.approx(mean_nll(hf7, data_file), rel=1e-4)
    assert "val/loss" not in records[5]


def test_sft_with_lora_trains_an_adapter_and_prints_the_merged_model(
    local_ray, data_file, tiny_qwen3_path, tmp_path, capsys
):
    """``model.lora_rank``: only an adapter trains; the checkpoint's ``huggingface`` folder is
    the adapter (PEFT loads it), ``huggingface_merged`` the model with it merged (printed: the
    RL run's model.path); both give the same, lower NLL."""
    from peft import PeftModel

    ckpt = tmp_path / "ckpt"
    args = [
        f"data.train_files={data_file}",
        "model.path=tiny-qwen3",
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "data.train_batch_size=8",
        "trainer.n_gpus_per_node=2",
        "optim.lr=1e-2",
        "trainer.total_training_steps=2",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={ckpt}",
    ]
    assert main(args) == 0
    actor = ckpt / "global_step_2" / "actor"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(actor / "huggingface_merged")
    assert (actor / "huggingface" / "adapter_config.json").is_file()
    before = mean_nll(tiny_qwen3_path, data_file)
    merged = mean_nll(actor / "huggingface_merged", data_file)
    tokenizer = AutoTokenizer.from_pretrained(actor / "huggingface")  # the run's tokenizer
    samples = encode_rows(read_rows([str(data_file)]), tokenizer, max_length=4096)
    batch = collate_sft(samples, tokenizer.pad_token_id).trimmed()
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32)
    with torch.no_grad():
        log_probs, _ = forward_log_probs(
            PeftModel.from_pretrained(base, actor / "huggingface"), batch
        )
    mask = batch.response_mask.float()
    adapter = float(-(log_probs * mask).sum() / mask.sum())
    with capsys.disabled():
        print(f"\nLoRA SFT NLL: initial {before:.4f}, merged {merged:.4f}, adapter {adapter:.4f}")
    assert merged < before - 0.05
    assert adapter == pytest.approx(merged, abs=1e-5)
