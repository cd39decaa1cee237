"""Multi-turn SFT on the RL workers: start-up checks (``prepare``) and the training loop
(``train``) behind ``agentloop-sft`` (``trainer/cli/sft.py``).

Each row's conversation becomes the token trajectory RL would produce for it
(``trainer.sft.data``); the loss is the token-mean NLL of the assistant tokens
(``trainer.workers.sft_step``), one optimizer step per ``data.train_batch_size`` conversations,
on the same FSDP2 workers as RL. Checkpoints use the RL layout
(``global_step_N/actor/{dcp,huggingface}``). With LoRA (``model.lora_rank``) only an adapter
trains: ``huggingface`` is the adapter folder (RL's ``lora_adapter_path``) and
``huggingface_merged`` the model with it merged (RL's ``model.path``), the run's result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from trainer.config.sft import SFTConfig, SFTModelConfig
from trainer.launch.worker_logs import init_ray
from trainer.loop.checkpoint import CheckpointManager
from trainer.sft.data import SFTSample, collate_sft, encode_rows, epoch_order

__all__ = ["SFTSetup", "prepare", "train"]

if TYPE_CHECKING:
    from trainer.metrics.tracking import Tracking
    from trainer.workers import WorkerSpec

logger = logging.getLogger("agentloop.sft")

CONTENTS = ["model", "optimizer", "extra", "hf_model"]
LORA_CONTENTS = [*CONTENTS, "hf_merged"]


@dataclass(kw_only=True, slots=True)
class SFTSetup:
    """What start-up resolved and checked: everything the run needs besides the config."""

    model: SFTModelConfig
    """``model`` resolved at start-up (``resolve_model_config``): local folders, template text."""
    device: str
    pad_token_id: int
    train: list[SFTSample]
    val: list[SFTSample]
    steps_per_epoch: int
    total_steps: int
    resume_from: Path | None


def _samples(cfg: SFTConfig, tokenizer: Any, key: str) -> list[SFTSample]:
    from trainer.data.rows import read_rows

    files = cfg.data.files(getattr(cfg.data, key))
    if not files:
        return []
    try:
        rows = read_rows(files)
    except ValueError as exc:
        raise ValueError(f"data.{key}: {exc}") from None
    return encode_rows(
        rows,
        tokenizer,
        messages_key=cfg.data.messages_key,
        tools_key=cfg.data.tools_key,
        max_length=cfg.data.max_length,
        chat_template_kwargs=cfg.data.chat_template_kwargs,
        source=", ".join(files),
    )


def prepare(cfg: SFTConfig) -> SFTSetup:
    """Start-up checks (model, data, batch sizes, device, checkpoint folder), before any
    worker starts; every problem is a ``ValueError`` saying what to set."""
    from trainer.models import resolve_model_config, tokenizer_source

    trainer = cfg.trainer
    model = resolve_model_config(cfg.model, "model")
    device = trainer.resolve_device()
    tokenizer = tokenizer_source(model).load()  # custom_chat_template renders the conversations
    train = _samples(cfg, tokenizer, "train_files")
    val = _samples(cfg, tokenizer, "val_files")
    batch_size = cfg.data.train_batch_size
    steps_per_epoch = len(train) // batch_size
    if not steps_per_epoch:
        raise ValueError(
            f"data.train_batch_size={batch_size} is more than the {len(train)} training "
            "conversations: lower it"
        )
    ckpt = CheckpointManager(trainer.default_local_dir)
    ckpt.check_writable()
    resume_from = None
    if trainer.resume_mode == "auto":
        resume_from = ckpt.latest()
    elif trainer.resume_mode == "resume_path":
        assert trainer.resume_from_path is not None
        resume_from = Path(trainer.resume_from_path)
    if resume_from is not None and "next_batch" not in CheckpointManager.load_state(resume_from):
        raise ValueError(
            f"{resume_from} is not an agentloop-sft checkpoint (no data position in its "
            "trainer_state.json): set trainer.resume_mode=disable or another "
            "trainer.default_local_dir"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return SFTSetup(
        model=model,
        device=device,
        pad_token_id=int(pad),
        train=train,
        val=val,
        steps_per_epoch=steps_per_epoch,
        total_steps=trainer.total_training_steps or trainer.total_epochs * steps_per_epoch,
        resume_from=resume_from,
    )


def _worker_spec(cfg: SFTConfig, setup: SFTSetup) -> WorkerSpec:
    from trainer.config.actor import ActorConfig, RefConfig
    from trainer.workers import WorkerSpec

    data = cfg.data
    actor = ActorConfig(  # the worker builds its optimizer and micro-batching from this
        optim=cfg.optim,
        ppo_micro_batch_size_per_gpu=data.micro_batch_size_per_gpu,
        use_dynamic_bsz=data.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=data.max_token_len_per_gpu,
        grad_clip=cfg.optim.clip_grad,
        fsdp_config=cfg.model.fsdp_config,
    )
    world = cfg.trainer.world_size
    return WorkerSpec(
        model_path=setup.model.path,
        model=setup.model,
        actor=actor,
        ref=RefConfig(),
        need_ref=False,
        device=setup.device,
        threads=max(1, (os.cpu_count() or 1) // world) if setup.device == "cpu" else 1,
        total_steps=setup.total_steps,
    )


def _val_loss(group: Any, samples: list[SFTSample], cfg: SFTConfig, pad: int) -> float:
    """Token-mean NLL of the assistant tokens of ``samples`` (no update). The last chunk is
    filled up to a multiple of the ranks with copies whose loss mask is zeroed."""
    world, size = cfg.trainer.world_size, cfg.data.train_batch_size
    nll = tokens = 0.0
    for start in range(0, len(samples), size):
        chunk = samples[start : start + size]
        filler = [dataclasses.replace(chunk[0], response_mask=[0] * len(chunk[0].response_ids))]
        batch = collate_sft(chunk + filler * (-len(chunk) % world), pad)
        log_probs, _ = group.compute_log_prob(batch)  # [batch, R], 0 on padding
        nll -= float((log_probs * batch.response_mask).sum())
        tokens += float(batch.response_mask.sum())
    return nll / max(tokens, 1.0)


def train(cfg: SFTConfig, setup: SFTSetup) -> Path:
    """Run (or resume) the fit; returns the HF export of the last checkpoint (with LoRA the
    merged one)."""
    import ray

    from trainer.metrics.tracking import Tracking
    from trainer.workers import WorkerGroup

    trainer = cfg.trainer
    ckpt = CheckpointManager(trainer.default_local_dir, trainer.max_ckpt_to_keep)
    started_ray = not ray.is_initialized()
    if started_ray:
        init_ray()
    tracking = Tracking(
        trainer.logger,
        project=trainer.project_name,
        experiment=trainer.experiment_name,
        run_dir=ckpt.root,
        config=dataclasses.asdict(cfg),
    )
    group = None
    try:
        group = WorkerGroup(
            _worker_spec(cfg, setup),
            trainer.world_size,
            nnodes=trainer.nnodes,
            node_resource=trainer.node_resource,
        )
        return _fit(cfg, setup, group, ckpt, tracking)
    finally:
        if group is not None:
            group.shutdown()
        tracking.finish()
        if started_ray:
            ray.shutdown()


def _fit(
    cfg: SFTConfig, setup: SFTSetup, group: Any, ckpt: CheckpointManager, tracking: Tracking
) -> Path:
    data, trainer = cfg.data, cfg.trainer
    total, per_epoch = setup.total_steps, setup.steps_per_epoch
    step, epoch, next_batch = 0, 0, 0
    last_dir: Path | None = None
    if setup.resume_from is not None:
        state = CheckpointManager.load_state(setup.resume_from)
        group.load_checkpoint(str(setup.resume_from / "actor"))
        step, epoch, next_batch = state["step"], state["epoch"], state["next_batch"]
        last_dir = setup.resume_from
        if state.get("rows") != len(setup.train):
            logger.warning("the training data changed since the checkpoint: next epoch")
            next_batch = per_epoch
        logger.info("resumed from %s (step %d, epoch %d)", setup.resume_from, step, epoch)
    order = epoch_order(len(setup.train), epoch, trainer.seed, data.shuffle)
    with tqdm(total=total, initial=min(step, total), desc="sft", unit="step") as bar:
        while step < total:
            if next_batch >= per_epoch:  # an epoch ended (or the data changed)
                epoch, next_batch = epoch + 1, 0
                order = epoch_order(len(setup.train), epoch, trainer.seed, data.shuffle)
            rows = order[
                next_batch * data.train_batch_size : (next_batch + 1) * data.train_batch_size
            ]
            batch = collate_sft([setup.train[i] for i in rows], setup.pad_token_id)
            start = time.perf_counter()
            metrics = group.update_sft(
                batch,
                data.micro_batch_size_per_gpu,
                data.use_dynamic_bsz,
                data.max_token_len_per_gpu,
                cfg.optim.clip_grad,
            )
            step, next_batch = step + 1, next_batch + 1
            metrics["timing_s/step"] = time.perf_counter() - start
            metrics["train/epoch"] = float(epoch)
            if setup.val and (
                step == total or trainer.test_freq > 0 and step % trainer.test_freq == 0
            ):
                metrics["val/loss"] = _val_loss(group, setup.val, cfg, setup.pad_token_id)
            tracking.log(metrics, step)
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", epoch=epoch)
            if step == total or trainer.save_freq > 0 and step % trainer.save_freq == 0:
                state = {"epoch": epoch, "next_batch": next_batch, "rows": len(setup.train)}
                contents = LORA_CONTENTS if cfg.model.use_lora else CONTENTS
                last_dir = ckpt.save(step, group, contents, state)
    if last_dir is None:  # pragma: no cover - total_steps >= 1 always trains or resumes
        raise RuntimeError("no checkpoint was written")
    if step > total:
        logger.warning(
            "checkpoint %s is at step %d, past the %d steps asked", last_dir, step, total
        )
    if cfg.model.use_lora:
        logger.info("LoRA adapter: %s", last_dir / "actor" / "huggingface")
        return last_dir / "actor" / "huggingface_merged"
    return last_dir / "actor" / "huggingface"
