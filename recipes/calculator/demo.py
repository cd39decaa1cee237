"""``make demo``: train a tool-using model on CPU, end to end, and show what each stage did.

1. prepare ``smollm2-135m-instruct`` (offline asset) and generate the calculator task;
2. evaluate the base model on held-out prompts (``agentloop-rollout``, greedy);
3. multi-turn SFT warm start on solved tool-call conversations (``agentloop-sft``);
4. GRPO with ``tool_agent`` (``agentloop-train``: async rollout on a vLLM CPU server, FSDP2
   on gloo, weight sync, MLflow metrics and rollout traces);
5. evaluate the SFT and RL models the same way, draw the reward curve, print the table.

Every stage is the project's own CLI in a subprocess, so the demo is what a user would run.
Environment knobs: ``DEMO_DIR`` (checkpoints/demo), ``DEMO_SFT_STEPS`` (3: a light warm start
leaves RL room; 12 steps make the model perfect on this task), ``DEMO_RL_STEPS`` (5),
``DEMO_RL_LR`` (1e-5), ``DEMO_VAL`` (held-out prompts, 64), ``DEMO_MODEL``, ``DEMO_ASYNC``
(0, the default: the synchronous GRPO loop; 1: async mode, the next step's rollout overlapping
the update, staleness 1 with partial rollout; on 2 cores it was not sooner, see docs/demo.md),
``DEMO_LORA`` (0; 1: a second GRPO run from the same SFT model training a LoRA adapter, rank
16 on every linear layer, reported beside full fine-tuning), ``DEMO_LORA_LR`` (1e-4),
``DEMO_LORA_SYNC`` (``adapter``: the server loads each adapter version; ``merged``: it runs
without LoRA and gets merged weights, sooner on CPU: docs/demo.md), ``DEMO_GATEWAY`` (0; 1: a
second GRPO run from the same SFT model whose rollouts are an agent on the bare ``openai`` SDK
served by the session gateway, ``recipes/calculator/gateway_agent.py``, reported beside
``tool_agent`` with its step time), ``DEMO_PPO`` (0; 1: a second run from the same SFT model
with PPO instead of GRPO: ``algorithm.adv_estimator=gae`` and a critic of the same model
(``DEMO_CRITIC_LR``, 1e-5), on the same samples, reported beside GRPO with its critic's update
time and memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "evaluate",
    "evaluate_records",
    "grpo",
    "grpo_mode",
    "lora_overrides",
    "main",
    "ppo_overrides",
    "reward_curve",
    "sft_warm_start",
    "trained_model",
]

REPO = Path(__file__).resolve().parents[2]
TOOLS = "recipes/calculator/tool_config.yaml"
REWARD = "recipes/calculator/reward.py"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _run(args: list[str], *, capture: bool = False) -> str:
    """Run a project CLI from the repository root; its progress bars go to the console."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE if capture else None,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"demo: `{' '.join(args[:2])}` failed with exit code {proc.returncode}")
    if capture:
        sys.stdout.write(proc.stdout)
        return proc.stdout
    return ""


def evaluate_records(records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Accuracy (the task reward) and valid-tool-call rate (the sample made at least one call
    and every call parsed and ran) of rollout records against their rows, as
    ``agentloop-rollout`` reports them (``trainer.metrics.rollout_score``)."""
    from recipes.calculator.reward import compute_score
    from trainer.metrics.rollout_score import summarize

    truth = {r["extra_info"]["index"]: r["reward_model"]["ground_truth"] for r in rows}
    scored = [
        {**rec, "score": compute_score("calculator", rec["response_text"], truth[rec["index"]], {})}
        for rec in records
    ]
    summary = summarize(scored)
    return {
        "accuracy": summary.accuracy,
        "valid_tool_calls": summary.valid_tool_calls,
        "samples": summary.samples,
    }


def sft_warm_start(model: str, data: Path, out: Path, steps: int) -> str:
    """Multi-turn SFT on the task's solved conversations (16 a step, 2 gloo ranks); returns
    the trained model's folder."""
    printed = _run(
        [
            "-m",
            "trainer.cli.sft",
            f"data.train_files={data / 'sft.jsonl'}",
            "data.train_batch_size=16",
            "data.micro_batch_size_per_gpu=4",
            f"model.path={model}",
            "optim.lr=1e-4",
            "trainer.n_gpus_per_node=2",
            f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={out}",
        ],
        capture=True,
    )
    return printed.strip().splitlines()[-1]


def evaluate(
    model: str, data: Path, out: Path, overrides: tuple[str, ...] = ()
) -> dict[str, float]:
    """Greedy held-out accuracy of ``model`` (``overrides``: e.g. a LoRA adapter to serve)."""
    _run(
        [
            "-m",
            "trainer.cli.rollout",
            f"data.train_files={data / 'train.jsonl'}",
            f"data.val_files={data / 'val.jsonl'}",
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.temperature=0",
            "actor_rollout_ref.rollout.response_length=128",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
            f"custom_reward_function.path={REWARD}",
            "+split=val",
            f"+output={out}",
            *overrides,
        ]
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [json.loads(line) for line in (data / "val.jsonl").read_text().splitlines()]
    return evaluate_records(records, rows)


LORA_RANK, LORA_ALPHA = 16, 32


def lora_overrides(
    rank: int = LORA_RANK, alpha: int = LORA_ALPHA, sync: str = "adapter"
) -> list[str]:
    """``agentloop-train`` overrides (verl's keys) for a LoRA adapter on every linear layer,
    synced to the server as ``sync`` (``actor_rollout_ref.rollout.lora_sync``)."""
    return [
        f"actor_rollout_ref.model.lora_rank={rank}",
        f"actor_rollout_ref.model.lora_alpha={alpha}",
        "actor_rollout_ref.model.target_modules=all-linear",
        f"actor_rollout_ref.rollout.lora_sync={sync}",
    ]


def trained_model(rl_dir: Path, steps: int, base: str, lora: bool) -> tuple[str, tuple[str, ...]]:
    """The model a GRPO run from ``base`` exported at its last step, as ``evaluate`` takes
    it: the full transformers folder, or (LoRA) ``base`` with the adapter folder to serve."""
    export = rl_dir / f"global_step_{steps}" / "actor" / "huggingface"
    if not lora:
        return str(export), ()
    return base, (
        f"actor_rollout_ref.model.lora_rank={LORA_RANK}",
        f"actor_rollout_ref.model.lora_adapter_path={export}",
    )


def grpo(
    model: str,
    data: Path,
    rl_dir: Path,
    steps: int,
    lr: str,
    overrides: list[str],
    train_file: str = "train.jsonl",
) -> float:
    """GRPO with ``tool_agent`` from ``model`` (or the loop the rows of ``train_file`` name);
    returns the minutes it took."""
    start = time.perf_counter()
    _run(
        [
            "-m",
            "trainer.cli.train",
            f"data.train_files={data / train_file}",
            "data.train_batch_size=8",
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.response_length=128",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            "actor_rollout_ref.rollout.trace.backend=mlflow",
            "actor_rollout_ref.rollout.trace.token2text=True",
            "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            f"actor_rollout_ref.actor.optim.lr={lr}",
            f"custom_reward_function.path={REWARD}",
            "trainer.n_gpus_per_node=2",
            f"trainer.total_training_steps={steps}",
            f"trainer.save_freq={steps}",
            "trainer.logger=[console,jsonl,mlflow]",
            "trainer.project_name=agentloop_demo",
            f"trainer.default_local_dir={rl_dir}",
            *overrides,
        ]
    )
    return (time.perf_counter() - start) / 60


def gateway_rows(data: Path, home: Path) -> tuple[str, list[str]]:
    """The training rows for the gateway agent (``agent_name: calc_gateway``) and the
    overrides that register it; returns the rows' file name in ``data``."""
    from recipes.calculator.gateway_agent import AGENT_YAML

    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    lines = [json.dumps({**row, "agent_name": "calc_gateway"}) for row in rows]
    (data / "train_gateway.jsonl").write_text("\n".join(lines) + "\n")
    (home / "gateway_agents.yaml").write_text(AGENT_YAML)
    path = home / "gateway_agents.yaml"
    return "train_gateway.jsonl", [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}"]


def step_seconds(metrics_path: Path) -> float:
    """Mean wall time of a GRPO step after the first (``timing_s/step``)."""
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    times = [r["timing_s/step"] for r in steps if "timing_s/step" in r][1:]
    return sum(times) / max(len(times), 1)


def ppo_overrides(critic_lr: str) -> list[str]:
    """``agentloop-train`` overrides (verl's keys) for PPO: GAE with verl's defaults (gamma =
    lambda = 1) and a critic started from the actor's model (``critic.enable: null``)."""
    return ["algorithm.adv_estimator=gae", f"critic.optim.lr={critic_lr}"]


def critic_figures(metrics_path: Path) -> dict[str, float]:
    """Mean actor and critic update seconds (after the first step) and their state MB."""
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines()][1:]
    if not steps:
        return {}

    def mean(key: str) -> float:
        values = [r[key] for r in steps if key in r]
        return sum(values) / max(len(values), 1)

    return {
        key.split("/")[-1]: round(mean(key), 2)
        for key in (
            "timing_s/update_actor",
            "timing_s/update_critic",
            "timing_s/values",
            "perf/actor_state_mb",
            "perf/critic_state_mb",
            "critic/vf_explained_var",
        )
    }


def grpo_mode(async_mode: bool) -> tuple[str, list[str]]:
    """The GRPO mode's name in the table and its ``agentloop-train`` overrides."""
    if not async_mode:
        return "sync", []
    return "async (staleness 1, partial rollout)", [
        "async_training.enable=True",
        "async_training.staleness_threshold=1",
        "async_training.partial_rollout=True",
    ]


def reward_curve(metrics_path: Path, png: Path) -> None:
    """Training reward per step (and the tool-call rate) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    train = [r for r in records if "reward/mean" in r]
    steps = [r["step"] for r in train]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["reward/mean"] for r in train], marker="o", label="reward (accuracy)")
    ax.plot(
        steps,
        [r.get("agent_loop/tool_calls/mean", 0.0) for r in train],
        marker="s",
        label="tool calls / sample",
    )
    ax.set_xlabel("GRPO step")
    ax.set_title("calculator task, smollm2-135m-instruct, GRPO")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _run_dir(name: str) -> str:
    """The run folder of a GRPO run of the table, under the demo's folder."""
    return {
        "RL": "grpo",
        "RL (LoRA)": "grpo_lora",
        "RL (gateway)": "grpo_gateway",
        "RL (PPO)": "ppo",
    }[name]


def main() -> int:
    from recipes.calculator.data import write_task
    from trainer.models import prepare

    start = time.perf_counter()
    home = (REPO / _env("DEMO_DIR", "checkpoints/demo")).resolve()
    model_name = _env("DEMO_MODEL", "smollm2-135m-instruct")
    sft_steps, rl_steps = int(_env("DEMO_SFT_STEPS", "3")), int(_env("DEMO_RL_STEPS", "5"))
    data = home / "data"
    print(f"[demo] 1/5 model {model_name} and the calculator task in {data}", flush=True)
    model = str(prepare(model_name))
    write_task(data, train=256, val=int(_env("DEMO_VAL", "64")), sft=16 * sft_steps)

    print("[demo] 2/5 base model on the held-out prompts", flush=True)
    (home / "eval").mkdir(parents=True, exist_ok=True)
    results = {"base model": evaluate(model, data, home / "eval/base.jsonl")}

    print(f"[demo] 3/5 SFT warm start: {sft_steps} steps x 16 conversations", flush=True)
    sft_model = sft_warm_start(model, data, home / "sft", sft_steps)

    mode, mode_overrides = grpo_mode(_env("DEMO_ASYNC", "0") != "0")
    runs = [("RL", False)] + ([("RL (LoRA)", True)] if _env("DEMO_LORA", "0") != "0" else [])
    if _env("DEMO_GATEWAY", "0") != "0":
        runs.append(("RL (gateway)", False))
    if _env("DEMO_PPO", "0") != "0":
        runs.append(("RL (PPO)", False))
    minutes: dict[str, float] = {}
    for index, (name, lora) in enumerate(runs, start=1):
        kind = f"LoRA rank {LORA_RANK}, all linear layers" if lora else "full fine-tuning"
        print(
            f"[demo] 4/5 GRPO ({index}/{len(runs)}): {rl_steps} steps, {mode}, {kind}", flush=True
        )
        lr = _env("DEMO_LORA_LR", "1e-4") if lora else _env("DEMO_RL_LR", "1e-5")
        sync = _env("DEMO_LORA_SYNC", "adapter")
        extra = mode_overrides + (lora_overrides(sync=sync) if lora else [])
        rl_dir = home / _run_dir(name)
        train_file = "train.jsonl"
        if name == "RL (gateway)":
            train_file, gateway = gateway_rows(data, home)
            extra += gateway
        if name == "RL (PPO)":
            extra += ppo_overrides(_env("DEMO_CRITIC_LR", "1e-5"))
        minutes[name] = grpo(sft_model, data, rl_dir, rl_steps, lr, extra, train_file)

    print("[demo] 5/5 SFT and RL models on the held-out prompts", flush=True)
    results["after SFT"] = evaluate(sft_model, data, home / "eval/sft.jsonl")
    for name, lora in runs:
        rl_dir = home / _run_dir(name)
        model_dir, serve = trained_model(rl_dir, rl_steps, sft_model, lora)
        label = f"after {name}"
        out = home / f"eval/{_run_dir(name).replace('grpo', 'rl')}.jsonl"
        results[label] = evaluate(model_dir, data, out, serve)
    png = home / "reward_curve.png"
    reward_curve(home / "grpo" / "metrics.jsonl", png)
    summary = {
        **results,
        "grpo": {"mode": mode, "minutes": round(minutes["RL"], 2)},
        **{
            _run_dir(name): {
                "minutes": round(minutes[name], 2),
                "step_s": round(step_seconds(home / _run_dir(name) / "metrics.jsonl"), 2),
            }
            for name, _ in runs[1:]
        },
    }
    if "RL (PPO)" in minutes:
        summary["ppo"]["critic"] = critic_figures(home / "ppo" / "metrics.jsonl")
    (home / "results.json").write_text(json.dumps(summary, indent=2) + "\n")

    n = results["base model"]["samples"]
    print(f"\ncalculator task, {n} held-out prompts, greedy decoding; GRPO {mode}:")
    print(f"| {'model':<18} | accuracy | valid tool-call rate |")
    print(f"|{'-' * 20}|----------|----------------------|")
    for name, r in results.items():
        print(f"| {name:<18} | {r['accuracy']:8.1%} | {r['valid_tool_calls']:20.1%} |")
    print(f"\nreward curve: {png}")
    print(f"rollout traces (MLflow): .venv/bin/agentloop-traces --run-dir {home / 'grpo'}")
    for name, took in minutes.items():
        step = step_seconds(home / _run_dir(name) / "metrics.jsonl")
        print(
            f"{name} ({mode}) took {took:.1f} min, {step:.1f} s per step after the first "
            "(DEMO_ASYNC=0/1 picks the mode)"
        )
    if "RL (PPO)" in minutes:
        print(f"PPO critic vs actor (s per update, MB of state): {summary['ppo']['critic']}")
    print(f"demo took {(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
