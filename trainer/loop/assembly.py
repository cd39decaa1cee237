"""Assembly of a training run, in two phases, so that every start-up check runs before any
server or trainer rank starts:

1. ``plan_run(config) -> RunPlan``: the checks (config, device, model, agent loops, tools,
   data, reward functions, checkpoint folder, loggers); nothing runs yet. Raises ValueError
   with a message that says what to set.
2. ``build_run(config, plan) -> RunParts``: starts the parts, each once, in a fixed order:
   rollout traces -> rollout servers + AgentLoopManager -> rewards (+ judge servers) ->
   trainer ranks -> weight sync. The servers' engines load while the rewards and the ranks
   start (except beside colocated GPU ranks), and are waited for before the weight sync. If
   one fails, those already started are stopped again.

``RayPPOTrainer`` receives the ``RunParts`` and drives them; it builds nothing itself.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from agentloop import AgentLoopManager
from agentloop.config import TraceConfig
from agentloop.tools.mcp_errors import RUN_DIR_ENV
from servers import stop_servers
from servers.config import parse_cores
from trainer.config import warn_no_effect
from trainer.config.run import TrainerConfig
from trainer.config.schema import Config
from trainer.data.curriculum import build_sampler
from trainer.data.sampler import PromptSampler
from trainer.launch.console import init_ray_routed
from trainer.launch.rollout import (
    RolloutSetup,
    load_split,
    prepare_rollout,
    serves_lora,
    start_rollout,
    start_user_model,
    stop_rollout,
    wait_for_servers,
)
from trainer.loop.checkpoint import CheckpointManager, checkpoint_bytes
from trainer.loop.trajectories import GenerationDump
from trainer.loop.weight_sync import WeightSync, delta_spec
from trainer.metrics.trace_tags import TraceTagger
from trainer.metrics.tracking import Tracking
from trainer.models.resolve import resolve_model
from trainer.rewards.build import build_rewards, check_rewards
from trainer.rewards.manager import RewardManager
from trainer.workers import WorkerGroup, WorkerSpec

__all__ = ["RunParts", "RunPlan", "build_run", "needs_ref_policy", "plan_run"]

logger = logging.getLogger("agentloop.train")


@dataclass(slots=True)
class RunPlan:
    """A checked training run: what ``plan_run`` loaded and opened; no server or rank runs."""

    device: str
    """``cpu`` or ``cuda`` (``trainer.device`` resolved)."""
    setup: RolloutSetup
    sampler: PromptSampler
    """Batches of the training rows."""
    val_rows: list[dict[str, Any]]
    """Validation rows (empty without ``data.val_files``)."""
    checkpoints: CheckpointManager
    """The run folder (checked writable, and big enough when checkpoints are saved)."""
    tracking: Tracking
    """The metric loggers, already open (an MLflow run, a W&B run, files)."""


@dataclass(slots=True)
class RunParts:
    """The running parts of a training run, built once by ``build_run``; ``close`` stops
    them (idempotent)."""

    manager: AgentLoopManager
    """Runs the agent loops on the rollout servers (and restarts a server that dies)."""
    servers: list[Any]
    """Rollout ``AsyncServer`` handles; the manager replaces a restarted one in place."""
    workers: WorkerGroup
    """The trainer ranks."""
    rewards: RewardManager
    judge_servers: list[Any]
    """The judge's own servers (empty without a judge reward)."""
    user_servers: list[Any]
    """The simulated users' own servers (empty without ``multi_turn.user_model``)."""
    sync: WeightSync
    """Sends the actor's weights to ``servers`` after each update."""
    tracking: Tracking
    checkpoints: CheckpointManager
    tagger: TraceTagger | None = None
    """Tags rollout traces with their rewards (None without ``rollout.trace.backend``)."""
    dump: GenerationDump | None = None
    """Writes each step's and each validation's scored samples (``trainer.rollout_data_dir``,
    ``trainer.validation_data_dir``; None with neither)."""
    timeline: str | None = None
    """Where Ray's timeline is written at the close (``ray_kwargs.timeline_json_file``)."""
    console: Any = None
    """Moves known-benign third-party messages off the console (``trainer.launch.console``);
    undone last, after the servers' shutdown messages."""
    closed: bool = field(default=False, init=False)

    def close(self) -> None:
        """Loggers, trace tags and rewards first, then the judge servers, the trainer ranks
        and the rollout (its agent-loop workers flush their traces, then the servers). Each
        is stopped even if one before it fails."""
        if self.closed:
            return
        self.closed = True
        with ExitStack() as stops:  # runs its callbacks last-registered first
            if self.console is not None:
                stops.callback(self.console.close)
            stops.callback(stop_servers, self.user_servers)
            stops.callback(stop_rollout, self.servers, self.manager)
            stops.callback(self.workers.shutdown)
            if self.timeline is not None:
                stops.callback(_write_timeline, self.timeline)
            stops.callback(_stop_rewards, self.rewards, self.judge_servers)
            if self.tagger is not None:
                stops.callback(self.tagger.close)
            stops.callback(self.tracking.finish)


def plan_run(config: Config) -> RunPlan:
    """Every start-up check of ``agentloop-train``, in order; raises ValueError saying what to
    set. The loggers open last, once everything else has passed."""
    config.check()
    warn_unscheduled_validation(config)
    # Tool servers (MCP) started from here on write their logs under the run folder.
    os.environ[RUN_DIR_ENV] = str(Path(config.trainer.default_local_dir).expanduser().resolve())
    device = config.trainer.resolve_device()
    warn_cpu_only_keys(config, device)
    if config.async_training.enable and device == "cuda" and config.actor_rollout_ref.hybrid_engine:
        raise ValueError(
            "async_training.enable=True needs rollout servers on their own GPUs (they generate "
            "while the trainer updates): set actor_rollout_ref.hybrid_engine=False"
        )
    if config.trainer.nnodes > 1 and device == "cuda" and config.actor_rollout_ref.hybrid_engine:
        raise ValueError(
            f"trainer.nnodes={config.trainer.nnodes} with servers colocated on the trainer's "
            "GPUs is not supported yet (a server and a rank would each take half a GPU outside "
            "one placement group): set actor_rollout_ref.hybrid_engine=False and give the "
            "servers GPUs of their own (actor_rollout_ref.rollout.node_resource, docs/cluster.md)"
        )
    config.actor_rollout_ref.check_weight_transfer(device)
    config.servers_for(device)  # raises when the GPUs do not split into rollout servers
    config.actor_rollout_ref.warn_cpu_noops(device)
    env = config.data.env_dataset
    has_val = config.data.val_files or (env.verifiers is not None and env.val_size != 0)
    if config.trainer.val_only and not has_val:
        raise ValueError(
            "trainer.val_only=True validates and ends, but there are no validation rows: set "
            "data.val_files"
        )
    setup = prepare_rollout(config)
    train_rows = load_split(config, setup, "train")
    val_rows = load_split(config, setup, "val") if has_val else []
    data, run = config.data, config.trainer
    sampler = build_sampler(train_rows, data)
    checkpoints = CheckpointManager(
        run.default_local_dir, run.max_actor_ckpt_to_keep, run.max_critic_ckpt_to_keep
    )
    checkpoints.check_writable()
    if run.save_freq > 0:
        contents = config.actor_rollout_ref.actor.checkpoint.save_contents
        lora_rank = config.actor_rollout_ref.model.lora_rank
        need = checkpoint_bytes(setup.model_path, contents, lora_rank)
        if config.use_critic:  # a value model of the same size (its own model path, if any)
            critic = config.critic
            need += checkpoint_bytes(
                setup.model_path, critic.checkpoint.save_contents, critic.model.lora_rank
            )
        checkpoints.check_free_space(need)
    # before any server starts: reward functions, and a built-in scorer for every row to score
    check_rewards(config, {"train": train_rows, "val": val_rows})
    write_config(config, checkpoints.root)
    tracking = Tracking(
        run.logger,
        project=run.project_name,
        experiment=run.experiment_name,
        run_dir=checkpoints.root,
        config=asdict(config),
    )
    return RunPlan(
        device=device,
        setup=setup,
        sampler=sampler,
        val_rows=val_rows,
        checkpoints=checkpoints,
        tracking=tracking,
    )


def warn_unscheduled_validation(config: Config) -> None:
    """``data.val_files`` given, but nothing ever runs validation: say so and what to set."""
    run = config.trainer
    if config.data.val_files and run.test_freq <= 0 and not (run.val_before_train or run.val_only):
        logger.warning(
            "data.val_files is set but validation never runs (trainer.test_freq=%d, "
            "trainer.val_before_train=False): set trainer.test_freq=N to validate every N steps "
            "and after the last one",
            run.test_freq,
        )


def write_config(config: Config, run_dir: Path) -> Path:
    """``<run dir>/config.yaml``: the whole resolved config this start runs with (defaults,
    overrides and interpolations applied), rewritten at every start."""
    path = run_dir / "config.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = json.loads(json.dumps(asdict(config), default=str))  # tuples -> lists
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    logger.info("resolved config written to %s", path)
    return path


def warn_cpu_only_keys(config: Config, device: str) -> None:
    """Keys that do something only on GPU say so once when set on CPU."""
    if device != "cpu":
        return
    keys = {
        "actor_rollout_ref.model.enable_activation_offload": (
            config.actor_rollout_ref.model.enable_activation_offload
        ),
        "critic.model.enable_activation_offload": config.critic.model.enable_activation_offload,
    }
    for key, value in keys.items():
        if value:
            warn_no_effect(logger, key, value, "on CPU: activations are in host memory already")


def build_run(config: Config, plan: RunPlan) -> RunParts:
    """Start the parts of a checked run. The parts own the plan's loggers from here on: if a
    part fails to start, the loggers are finished and what already started is stopped."""
    ref = config.actor_rollout_ref
    colocated = ref.hybrid_engine and plan.device == "cuda"
    # Colocated: a server and a trainer rank each take half of the same GPU in Ray's
    # accounting; the server sleeps while the trainer computes.
    share = 0.5 if colocated else None
    model = plan.setup.model  # resolved at start-up: local folders, template text
    critic = None
    if config.use_critic:
        path = config.critic.model.path
        path = resolve_model(path, "critic.model.path") if path is not None else None
        critic = config.critic.spec(ref.actor, model, path)
    with ExitStack() as undo:  # stops, newest first, what started if a later part fails
        undo.callback(plan.tracking.finish)
        tagger = configure_traces(ref.rollout.trace, config.trainer, plan)
        if tagger is not None:
            undo.callback(tagger.close)
        console = init_ray_routed(
            plan.checkpoints.root,
            config.trainer.worker_log_level,
            {RUN_DIR_ENV: str(plan.checkpoints.root)},
            config.ray_kwargs.ray_init,
        )
        if console is not None:
            undo.callback(console.close)
        # Before the servers: the agent-loop workers take the trace settings with them.
        count = config.servers_for(plan.device)
        lora = ref.rollout.lora_sync == "adapter"  # merged: servers without LoRA
        user_servers, user_path = start_user_model(ref.rollout.multi_turn.user_model, plan.device)
        undo.callback(stop_servers, user_servers)
        # The engines load while the rewards and the trainer ranks start (not beside ranks
        # on the same GPUs: vLLM sizes its memory from what is free when it starts).
        rollout = ref.rollout
        if config.async_training.recompute_kv_cache_after_weight_updates:
            engine = replace(rollout.engine, recompute_kv_after_weight_update=True)
            rollout = replace(rollout, engine=engine)
        servers, manager = start_rollout(
            rollout,
            model,
            share,
            num_servers=count,
            lora=lora,
            user_servers=user_servers,
            user_tokenizer=user_path,
            wait=colocated,
        )
        undo.callback(stop_rollout, servers, manager)
        rewards, judge_servers = build_rewards(config, plan.setup.tokenizer, plan.device)
        undo.callback(_stop_rewards, rewards, judge_servers)
        world = config.trainer.world_size
        spec = WorkerSpec(
            model_path=model.path,
            model=model,
            actor=ref.actor,
            ref=ref.ref,
            need_ref=needs_ref_policy(config),
            device=plan.device,
            temperature=ref.rollout.temperature or 1.0,
            correction=config.correction,
            threads=max(1, (os.cpu_count() or 1) // world),
            cpu_cores=parse_cores(ref.actor.cpu_cores, "actor_rollout_ref.actor.cpu_cores")
            if ref.actor.cpu_cores is not None
            else None,
            gpu_share=share or 1.0,
            total_steps=config.trainer.total_steps(len(plan.sampler)),
            critic=critic,
        )
        workers = WorkerGroup(
            spec,
            world,
            balance=config.trainer.balance_batch,
            nnodes=config.trainer.nnodes,
            node_resource=config.trainer.node_resource,
        )
        undo.callback(workers.shutdown)
        wait_for_servers(manager)  # the weight sync asks each server for its routes
        sync = WeightSync(
            workers,
            servers,
            bucket_mb=config.trainer.weight_sync_bucket_mb,
            colocated=colocated,
            delta=delta_spec(config.trainer.weight_sync_delta),
            # a starting LoRA adapter the servers do not load: they get merged weights first
            starts_ahead=model.lora_adapter_path is not None and not serves_lora(ref.rollout, lora),
        )
        manager.on_server_restart = sync.push_to  # a restarted server gets the current weights
        undo.pop_all()  # all started: from here ``RunParts.close`` stops them
    return RunParts(
        manager=manager,
        servers=servers,
        workers=workers,
        rewards=rewards,
        judge_servers=judge_servers,
        user_servers=user_servers,
        sync=sync,
        tracking=plan.tracking,
        checkpoints=plan.checkpoints,
        tagger=tagger,
        dump=generation_dump(config.trainer, plan.setup.tokenizer),
        timeline=config.ray_kwargs.timeline_json_file,
        console=console,
    )


def _write_timeline(path: str) -> None:
    """Ray's timeline of the run's tasks and actors (chrome://tracing JSON)."""
    import ray

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=path)
    logger.info("Ray timeline -> %s", path)


def needs_ref_policy(config: Config) -> bool:
    """A KL term (in the loss or in the reward) needs the reference policy's log-probs."""
    return config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def generation_dump(run: TrainerConfig, tokenizer: Any) -> GenerationDump | None:
    """The run's trajectory dump, or None where neither folder is set."""
    if run.rollout_data_dir is None and run.validation_data_dir is None:
        return None
    return GenerationDump(tokenizer, run.rollout_data_dir, run.validation_data_dir)


def configure_traces(trace: TraceConfig, run: TrainerConfig, plan: RunPlan) -> TraceTagger | None:
    """Rollout traces go to the training run's MLflow store and experiment, linked to its
    run (``trainer.logger`` with mlflow); else to ``MLFLOW_TRACKING_URI`` or
    ``sqlite:///<run dir>/mlruns.db``. Fills the unset keys of ``trace`` in place; returns the
    tagger that adds rewards to the traces (None when tracing is off)."""
    if trace.backend is None:
        return None
    tracking = plan.tracking
    trace.run_id = trace.run_id or tracking.mlflow_run_id
    trace.experiment_name = trace.experiment_name or run.project_name
    if not trace.tracking_uri:
        store = Path(plan.checkpoints.root, "mlruns.db").resolve()
        trace.tracking_uri = tracking.mlflow_tracking_uri or os.environ.get(
            "MLFLOW_TRACKING_URI", f"sqlite:///{store}"
        )
    logger.info("rollout traces -> %s (experiment %r)", trace.tracking_uri, trace.experiment_name)
    return TraceTagger(trace.tracking_uri)


def _stop_rewards(rewards: RewardManager, judge_servers: list[Any]) -> None:
    try:
        rewards.close()
    finally:
        if judge_servers:
            stop_servers(judge_servers)
