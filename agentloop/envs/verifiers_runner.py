"""Run a Prime Intellect ``verifiers`` environment (classic API) in its own interpreter.

verifiers cannot share a venv with agentloop (it pins ``mcp<2``), so this script runs under
the verifiers venv as a subprocess, one process per sample, and talks to agentloop only
through environment variables, files and exit codes. It imports nothing from agentloop:
only the standard library, ``verifiers``, ``openai`` and (through verifiers) ``datasets``.

Subcommands:

``rollout``
    Env vars: OPENAI_BASE_URL, OPENAI_API_KEY (optional), OPENAI_MODEL, AGENTLOOP_ROW (path
    of a JSON dataset row holding ``verifiers``: the env's own example), AGENTLOOP_VERIFIERS
    (JSON: ``{"env_id", "env_args", "sampling_args", "client_args"?}``) and AGENTLOOP_RESULT
    (path the result JSON is written to). Runs the env's own rollout against the endpoint,
    scores it with the env's rubric the way the env's evaluation does, and writes
    ``{"reward", "scores", "weights", "state", "completion", "stop_condition", "error"}``.
``dataset --env-id ID --env-args JSON --split train|eval --n N --out PATH``
    Writes the env's dataset as JSONL rows in agentloop's row format.
``score --env-id ID --env-args JSON --in PATH``
    Scores ``{"row", "completion", "state"?}`` with the env's rubric; prints
    ``{"reward", "scores", "weights"}``.
``check --env-id ID``
    Exit 0 when the environment loads; exit 3 when its module is not installed.

Exit codes: 0 success, 1 failure (traceback on stderr), 3 environment module not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextvars
import copy
import importlib.util
import inspect
import json
import math
import os
import sys
import time
import traceback
import uuid
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

EXIT_OK, EXIT_FAIL, EXIT_NOT_INSTALLED = 0, 1, 3
# keys of a dataset row that verifiers treats specially when it may be absent
OPTIONAL_KEYS = ("answer", "info", "task")
UNUSED_URL = "http://127.0.0.1:9/v1"  # a client that is never called (dataset, score)


class EnvNotInstalled(Exception):
    pass


# ---------------------------------------------------------------- JSON conversion


def jsonable(obj: Any) -> Any:
    """Plain JSON data from anything verifiers hands back (pydantic models, Arrow rows...)."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return jsonable(obj.model_dump(mode="json"))
    if isinstance(obj, bytes | bytearray):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item) and getattr(obj, "shape", None) == ():
        return jsonable(item())
    tolist = getattr(obj, "tolist", None)  # numpy arrays
    if callable(tolist):
        return jsonable(tolist())
    return str(obj)


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def message_to_openai(msg: Any) -> dict:
    """One chat message as an OpenAI-style dict (tool calls nested under ``function``)."""
    d = jsonable(msg)
    if not isinstance(d, dict):
        return {"role": "user", "content": str(d)}
    d = _drop_none(d)
    calls = d.get("tool_calls")
    if isinstance(calls, list):
        out = []
        for tc in calls:
            if isinstance(tc, str):
                tc = json.loads(tc)
            if isinstance(tc, dict) and "function" not in tc and "name" in tc:
                args = tc.get("arguments")
                tc = {
                    "id": tc.get("id"),
                    "type": "function",
                    "function": {"name": tc["name"], "arguments": args},
                }
            out.append(tc)
        d["tool_calls"] = out
    return d


def messages_to_openai(messages: Any) -> Any:
    if isinstance(messages, str):
        return messages
    return [message_to_openai(m) for m in messages or []]


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    os.replace(tmp, path)


# ---------------------------------------------------------------- environment access


def module_name(env_id: str) -> str:
    """The module verifiers imports for ``env_id`` (its own rule, with a fallback copy)."""
    try:
        from verifiers.utils.env_utils import env_module_name
    except ImportError:
        return env_id.replace("-", "_").split("/")[-1]
    return env_module_name(env_id)


def load_env(env_id: str, env_args: Mapping[str, Any] | None):
    name = module_name(env_id)
    if importlib.util.find_spec(name) is None:
        raise EnvNotInstalled(
            f"verifiers environment {env_id!r}: module {name!r} is not installed "
            "in this interpreter (pip install it, or put it on PYTHONPATH)"
        )
    import verifiers as vf

    return vf.load_environment(env_id, **dict(env_args or {}))


def rollout_input(row: Mapping[str, Any]) -> dict:
    """The env's own example from one of our rows (``row["verifiers"]``), as RolloutInput."""
    example = row.get("verifiers")
    if isinstance(example, Mapping) and isinstance(example.get("example"), Mapping):
        example = example["example"]  # the row names its env: {env_id, env_args, example}
    if not isinstance(example, Mapping):
        raise ValueError("the dataset row has no 'verifiers' object (the env's own example)")
    example = copy.deepcopy(dict(example))
    if "prompt" not in example or "example_id" not in example:
        raise ValueError("row['verifiers'] needs at least 'prompt' and 'example_id'")
    for key in OPTIONAL_KEYS:  # absent in the env's dataset -> absent here too
        if key in example and example[key] is None:
            del example[key]
    return example


def unused_client():
    """A vf chat-completions client for code paths that never call the model."""
    import verifiers as vf
    from openai import AsyncOpenAI

    return vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=UNUSED_URL, api_key="unused"))


def rubric_weights(rubric: Any) -> dict[str, float]:
    names, weights = rubric._get_reward_func_names(), rubric._get_reward_weights()
    return {name: float(w) for name, w in zip(names, weights, strict=False)}


async def score_state(env: Any, state: Any) -> None:
    """Score in place as the env's evaluation does (per rollout; a group of one if needed)."""
    if not env.score_rollouts:
        await env.rubric.dummy_score_rollout(state)
    elif env.rubric.has_group_rewards:
        await env.rubric.score_group([state])
    else:
        await env.rubric.score_rollout(state)


def score_json(env: Any, state: Any) -> dict:
    metrics = state.get("metrics") or {}
    return {
        "reward": float(state.get("reward") or 0.0),
        "scores": {str(k): float(v) for k, v in metrics.items()},
        "weights": rubric_weights(env.rubric),
    }


def _count_tool_calls(completion: Any) -> tuple[int, int]:
    calls = tool_msgs = 0
    for m in completion if isinstance(completion, list) else []:
        role = m.get("role") if hasattr(m, "get") else None
        if role == "assistant":
            calls += len(m.get("tool_calls") or [])
        elif role == "tool":
            tool_msgs += 1
    return calls, tool_msgs


_TOOL_COUNTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "tool_counts", default=None
)


def _count_call_tool(env: Any) -> bool:
    """Wrap an async ``env.call_tool`` (ToolEnv and kin), once per env, to count the tool
    runs of the rollout that made them (its task's counts, so rollouts may share the env)."""
    original = getattr(env, "call_tool", None)
    if getattr(env, "_agentloop_counted", False):
        return True
    if not inspect.iscoroutinefunction(original):
        return False

    async def call_tool(*args, **kwargs):
        counts = _TOOL_COUNTS.get()
        try:
            result = await original(*args, **kwargs)
        except Exception:
            if counts is not None:
                counts["failed"] += 1
            raise
        if counts is not None:
            counts["ok"] += 1
        return result

    env.call_tool = call_tool
    env._agentloop_counted = True
    return True


def state_summary(env: Any, state: Any, tool_counts: dict | None) -> dict:
    calls, tool_msgs = _count_tool_calls(state.get("completion"))
    errors = None
    if tool_counts is not None:
        errors = max(tool_msgs - tool_counts["ok"], tool_counts["failed"])
    usage = env.get_state_usage(state) or {}
    timing = state.get("timing")
    out = {
        "turns": len(state.get("trajectory") or []),
        "tool_calls": calls,
        "tool_errors": errors,
        "completed": bool(state.get("is_completed")),
        "truncated": bool(state.get("is_truncated")),
        "prompt_too_long": bool(state.get("prompt_too_long", False)),
        "timed_out": bool(state.get("timed_out", False)),
        "input_tokens": int(usage.get("input_tokens", 0)),
        "output_tokens": int(usage.get("output_tokens", 0)),
    }
    if timing is not None:
        out.update(
            setup_s=timing.setup.duration,
            generation_s=timing.generation.duration,
            model_s=timing.model.duration,
            env_s=timing.env.duration,
            scoring_s=timing.scoring.duration,
        )
    return jsonable(out)


def error_text(err: Any) -> str:
    """``Type: message`` for an error and each error it was raised from."""
    if not isinstance(err, BaseException):
        return json.dumps(jsonable(err))
    parts, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        parts.append(f"{type(err).__name__}: {err}".rstrip(": "))
        err = err.__cause__ or err.__context__
    return " <- ".join(parts)


def _is_infra_error(err: Any) -> bool:
    """A failure of the endpoint or the machinery, not an outcome of the rollout."""
    import verifiers as vf

    if isinstance(err, vf.InvalidModelResponseError):  # the model's own (empty) answer
        return False
    return isinstance(err, vf.ModelError | vf.InfraError)


# ---------------------------------------------------------------- subcommands


async def run_one(
    env: Any,
    row: Mapping[str, Any],
    spec: Mapping[str, Any],
    base_url: str,
    api_key: str,
    model: str,
) -> tuple[dict, bool]:
    """One rollout of ``row``'s example against the endpoint, scored as the env's evaluation
    scores it: (the result JSON, whether it failed for an infrastructure reason)."""
    import verifiers as vf
    from openai import AsyncOpenAI

    example = rollout_input(row)
    # what Environment.generate does: the env's defaults, then the caller's (shallow update)
    sampling_args = copy.deepcopy(env.sampling_args)
    sampling_args.update(spec.get("sampling_args") or {})
    oai = AsyncOpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", **(spec.get("client_args") or {})
    )
    counted = _count_call_tool(env)
    tool_counts = {"ok": 0, "failed": 0}
    _TOOL_COUNTS.set(tool_counts)
    try:
        client = vf.OpenAIChatCompletionsClient(oai)
        state = await env.rollout(example, client, model, sampling_args)
        state["timing"].scoring.start = time.time()
        await score_state(env, state)
        state["timing"].scoring.end = time.time()
        await env.rubric.cleanup(state)
    finally:
        await oai.close()
    err = state.get("error")
    result = score_json(env, state)
    result.update(
        state=state_summary(env, state, tool_counts if counted else None),
        completion=messages_to_openai(state.get("completion")),
        stop_condition=state.get("stop_condition"),
        error=None if err is None else error_text(err),
    )
    return result, err is not None and _is_infra_error(err)


async def _rollout() -> int:
    spec = json.loads(os.environ["AGENTLOOP_VERIFIERS"])
    with open(os.environ["AGENTLOOP_ROW"], encoding="utf-8") as f:
        row = json.load(f)
    env = load_env(spec["env_id"], spec.get("env_args"))
    result, infra = await run_one(
        env,
        row,
        spec,
        os.environ["OPENAI_BASE_URL"],
        os.environ.get("OPENAI_API_KEY", ""),
        os.environ["OPENAI_MODEL"],
    )
    _write_json(os.environ["AGENTLOOP_RESULT"], result)
    if infra:
        sys.stderr.write(f"rollout failed: {result['error']}\n")
        return EXIT_FAIL
    return EXIT_OK


async def _serve() -> int:
    """Rollouts for as long as stdin is open: one JSON request a line (``{"id", "env_id",
    "env_args", "row", "base_url", "api_key", "model"}``), answered in any order on the
    protocol stream, one JSON line each (``{"id", "result"}`` or ``{"id", "error",
    "not_installed"?}``); environments loaded once per (id, args). What the libraries print
    goes to stderr: the protocol keeps the original stdout to itself."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    envs: dict[str, Any] = {}
    running: set[asyncio.Task] = set()

    def answer(message: dict) -> None:
        out.write(json.dumps(message, ensure_ascii=False) + "\n")
        out.flush()

    async def handle(req: dict) -> None:
        try:
            key = json.dumps([req["env_id"], req.get("env_args") or {}], sort_keys=True)
            if key not in envs:
                envs[key] = load_env(req["env_id"], req.get("env_args"))
            result, infra = await run_one(
                envs[key], req["row"], req, req["base_url"], req.get("api_key", ""), req["model"]
            )
            message = {"id": req["id"], "result": result}
            if infra:
                message["error"] = f"rollout failed: {result['error']}"
        except EnvNotInstalled as e:
            message = {"id": req["id"], "error": str(e), "not_installed": True}
        except Exception:  # noqa: BLE001 - this request's failure, not the server's
            message = {"id": req["id"], "error": traceback.format_exc()}
        answer(message)

    sys.stderr.write("verifiers runner serving\n")
    while line := await reader.readline():
        if line.strip():
            task = asyncio.create_task(handle(json.loads(line)))
            running.add(task)
            task.add_done_callback(running.discard)
    if running:
        await asyncio.wait(running)
    return EXIT_OK


async def _dataset(args: argparse.Namespace) -> int:
    from verifiers.utils.message_utils import normalize_messages

    env = load_env(args.env_id, json.loads(args.env_args))
    ds = env.get_dataset(args.n) if args.split == "train" else env.get_eval_dataset(args.n)
    client = unused_client()
    with open(args.out, "w", encoding="utf-8") as f:
        for example in ds:
            example = jsonable(example)
            native, _ = await client.to_native_prompt(normalize_messages(example["prompt"]))
            out = {
                "data_source": f"verifiers/{args.env_id}",
                "raw_prompt": [_drop_none(dict(m)) for m in jsonable(native)],
                "verifiers": example,
                "reward_model": {"ground_truth": example.get("answer")},
            }
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    await client.close()
    return EXIT_OK


def rebuild_trajectory(prompt: list, completion: list, trajectory_id: str) -> list[dict]:
    """One trajectory step per assistant message, as MultiTurnEnv records them."""
    steps = []
    for i, msg in enumerate(completion):
        if msg.role == "assistant":
            steps.append(
                {
                    "prompt": [*prompt, *completion[:i]],
                    "completion": [msg],
                    "response": None,
                    "tokens": None,
                    "reward": None,
                    "advantage": None,
                    "is_truncated": False,
                    "trajectory_id": trajectory_id,
                    "extras": {},
                }
            )
    return steps


async def _score(args: argparse.Namespace) -> int:
    from verifiers.utils.message_utils import normalize_messages

    with open(args.in_path, encoding="utf-8") as f:
        payload = json.load(f)
    env = load_env(args.env_id, json.loads(args.env_args))
    extra = payload.get("state") or {}
    client = unused_client()
    state = await env.init_state(rollout_input(payload["row"]), client, "unused", None)
    completion = normalize_messages(payload.get("completion") or [], field_name="completion")
    state["completion"] = completion
    state["trajectory"] = rebuild_trajectory(state["prompt"], completion, uuid.uuid4().hex)
    state["is_completed"] = bool(extra.get("completed", True))
    state["is_truncated"] = bool(extra.get("truncated", False))
    for key, value in extra.items():  # caller-supplied extras never override vf's keys
        state.setdefault(key, value)
    await score_state(env, state)
    await env.rubric.cleanup(state)
    await client.close()
    sys.stdout.write(json.dumps(score_json(env, state)) + "\n")
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    import verifiers as vf

    env = load_env(args.env_id, json.loads(args.env_args))
    info = {"env_id": args.env_id, "module": module_name(args.env_id)}
    info.update(env_class=type(env).__name__, verifiers=vf.__version__)
    sys.stdout.write(json.dumps(info) + "\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("rollout", help="one rollout, configured by environment variables")
    sub.add_parser("serve", help="rollouts requested as JSON lines on stdin, until it closes")
    for name in ("dataset", "score", "check"):
        s = sub.add_parser(name)
        s.add_argument("--env-id", required=True)
        s.add_argument("--env-args", default="{}", help="JSON object of load_environment kwargs")
        if name == "dataset":
            s.add_argument("--split", choices=("train", "eval"), default="train")
            s.add_argument("--n", type=int, default=-1, help="rows to write; <=0 means all")
            s.add_argument("--out", required=True)
        if name == "score":
            s.add_argument("--in", dest="in_path", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "rollout":
            return asyncio.run(_rollout())
        if args.cmd == "serve":
            return asyncio.run(_serve())
        if args.cmd == "dataset":
            return asyncio.run(_dataset(args))
        if args.cmd == "score":
            return asyncio.run(_score(args))
        return _check(args)
    except EnvNotInstalled as e:
        sys.stderr.write(f"{e}\n")
        return EXIT_NOT_INSTALLED
    except Exception:
        traceback.print_exc()
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
