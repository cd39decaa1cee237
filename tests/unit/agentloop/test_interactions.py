"""Interactions (simulated users, verl's API) in tool_agent against a scripted server: the user
turn as a template delta under mask 0, termination, max_user_turns, turn scores per model turn,
the final score, finalize exactly once on every path, and each fault failing only its sample."""

from __future__ import annotations

import json

import pytest

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, encode_delta
from agentloop.interactions import InteractionSession, load_interactions
from agentloop.tool_agent import ToolAgentLoop
from tests.unit.agentloop import verl_api_interactions as verl_api
from tests.unit.agentloop.scripted import CalcTool, ScriptedServer

PROMPT = [
    {"role": "system", "content": "Put your final answer as #### <answer>."},
    {"role": "user", "content": "What is 2 + 3?"},
]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": -1}
ROW = {"extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "5"}}}


def make_loop(tokenizer, turns, interaction, *, name="gsm8k", tools=None, **multi_turn):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=1024, response_length=1024, multi_turn=MultiTurnConfig(**multi_turn)
    )
    context = AgentLoopContext(
        server, tokenizer, config, tools or {}, interactions={name: interaction}
    )
    return ToolAgentLoop(context), server


def row(name: str = "gsm8k", **kwargs) -> dict:
    return {"extra_info": {"interaction_kwargs": {"name": name, **kwargs}}}


@pytest.fixture(autouse=True)
def _fresh_logs():
    for cls in (verl_api.Gsm8kInteraction, verl_api.BaseSignatures, verl_api.PlainDef):
        cls.calls = []
    verl_api.Faulty.calls = []


async def test_the_users_reply_is_a_masked_delta_and_its_ok_ends_the_episode(tokenizer):
    user = verl_api.Gsm8kInteraction({"name": "gsm8k"})
    turns = ["I think #### 4", "Sorry: #### 5"]
    loop, server = make_loop(tokenizer, turns, user)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)

    history = [*PROMPT, {"role": "assistant", "content": turns[0]}]
    reply = {"role": "user", "content": "Your response is incorrect! Try again."}
    delta = encode_delta(tokenizer, history, [reply], [])
    assert out.response_ids == server.sampled[0] + delta + server.sampled[1]
    assert out.response_mask == [1] * len(server.sampled[0]) + [0] * len(delta) + [1] * len(
        server.sampled[1]
    )
    # the second turn was generated from exactly the prompt, the first turn and the delta
    assert server.requests[1]["prompt_ids"] == out.prompt_ids + server.sampled[0] + delta
    record = out.record
    assert record.stop_reason == "interaction_done"  # the final "correct!" is not appended
    assert (record.assistant_turns, record.user_turns, out.num_turns) == (2, 1, 4)
    assert record.turn_scores == [0.0, 1.0]  # one per model turn, the user's score of it
    assert record.interaction.turn_scores == [0.0, 1.0]
    assert record.interaction.final_score == 1.0 and record.interaction.terminated
    assert record.interaction.error is None and record.weight == 1.0
    request_id = server.requests[0]["session_id"]
    starts = [c for c in verl_api.Gsm8kInteraction.calls if c[0] == "start"]
    assert starts == [("start", request_id, "5", {"name": "gsm8k"})]
    responds = [c for c in verl_api.Gsm8kInteraction.calls if c[0] == "respond"]
    assert responds[0] == ("respond", request_id, ["system", "user", "assistant"])
    assert responds[1][2] == ["system", "user", "assistant", "user", "assistant"]
    assert verl_api.Gsm8kInteraction.calls[-1] == ("finalize", request_id)
    assert user._instance_dict == {}  # finalized once: a second call would raise KeyError


async def test_max_user_turns_stops_a_user_that_never_ends(tokenizer):
    loop, _ = make_loop(
        tokenizer, ["a", "b", "c", "d"], verl_api.BaseSignatures({}), max_user_turns=2
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    assert out.record.stop_reason == "max_user_turns"
    assert (out.record.assistant_turns, out.record.user_turns) == (3, 2)
    assert out.record.interaction.turn_scores == [0.5, 0.5]
    # verl's base signatures: calculate_score() and finalize_interaction() take no instance id
    assert out.record.interaction.final_score == 0.25
    assert verl_api.BaseSignatures.calls == [("score",), ("finalize",)]


async def test_tool_turns_and_user_turns_mix_and_scores_land_on_their_model_turn(tokenizer):
    call = json.dumps({"name": "calc", "arguments": {"a": 2, "b": 3}})
    turns = [f"<tool_call>\n{call}\n</tool_call>", "#### 5"]
    user = verl_api.Gsm8kInteraction({"name": "gsm8k"})
    loop, _ = make_loop(tokenizer, turns, user, tools={"calc": CalcTool()})
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    assert out.record.stop_reason == "interaction_done"
    assert out.record.tool_calls == 1 and out.record.user_turns == 1  # the tool's turn
    assert out.record.turn_scores == [0.0, 1.0]  # the tool turn has no user score


class NamingUser(verl_api.BaseSignatures):
    """Names the state of the turn it asks for in its reply's metadata (a room per reply),
    except on its second reply."""

    async def generate_response(self, instance_id, messages, **kwargs):
        replies = sum(m["role"] == "assistant" for m in messages)
        return False, "Go on.", 0.5, ({} if replies == 2 else {"state_key": f"room-{replies}"})


async def test_a_users_metadata_state_key_names_the_next_model_turns_state(tokenizer):
    loop, _ = make_loop(tokenizer, ["a", "b", "c", "d"], NamingUser({}), max_user_turns=3)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    assert out.record.assistant_turns == 4
    # turn 0 acts on the prompt; the replies to turns 0 and 2 name turns 1 and 3's states
    assert out.record.turn_states == [None, "room-1", None, "room-3"]


async def test_plain_def_methods_run_and_a_none_score_counts_as_no_score(tokenizer):
    loop, server = make_loop(tokenizer, ["a", "b"], verl_api.PlainDef({}))
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    assert out.record.stop_reason == "interaction_done"
    assert out.record.interaction.turn_scores == [None, None]
    assert out.record.turn_scores == []  # no turn was scored
    assert verl_api.PlainDef.calls == [("finalize", server.requests[0]["session_id"])]


FAULTS = {
    "raise": "interaction 'gsm8k': generate_response raised KeyError: 'persona'",
    "hang": "interaction 'gsm8k': generate_response took longer than 0.2 s "
    "(multi_turn.interaction_timeout_s)",
    "tuple3": "interaction 'gsm8k': generate_response returned (False, 'hi', 1.0); it must "
    "return (should_terminate: bool, text: str, turn_score: float | None, metadata: dict)",
    "bad_score": "interaction 'gsm8k': generate_response returned turn_score='high' is not a "
    "finite number or None; it must return (should_terminate: bool, text: str, turn_score: "
    "float | None, metadata: dict)",
    "bad_text": "interaction 'gsm8k': generate_response returned text=None is not a string; "
    "it must return (should_terminate: bool, text: str, turn_score: float | None, metadata: "
    "dict)",
    "start": "interaction 'gsm8k': start_interaction raised ConnectionError: user service "
    "unreachable",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_faulty_user_fails_only_its_sample_and_is_finalized_once(tokenizer, fault):
    loop, server = make_loop(
        tokenizer, ["a", "b"], verl_api.Faulty({"fault": fault}), interaction_timeout_s=0.2
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    assert out.record.stop_reason == "interaction_error"
    assert out.record.interaction.error == FAULTS[fault]
    assert out.extra["interaction_error"] == FAULTS[fault]
    assert out.record.weight == 0.0  # the environment failed, not the model: out of the loss
    assert out.record.interaction.final_score is None
    request_id = server.requests[0]["session_id"] if server.requests else None
    assert [c[0] for c in verl_api.Faulty.calls] == ["finalize"]
    if request_id is not None:
        assert verl_api.Faulty.calls == [("finalize", request_id)]


async def test_other_samples_of_a_batch_go_on_when_one_user_fails(tokenizer):
    """The worker runs samples concurrently: a failing user costs its own sample only."""
    import asyncio

    good, _ = make_loop(tokenizer, ["#### 5"], verl_api.Gsm8kInteraction({"name": "gsm8k"}))
    bad, _ = make_loop(tokenizer, ["a"], verl_api.Faulty({"fault": "raise"}))
    outs = await asyncio.gather(
        good.run(SAMPLING, raw_prompt=PROMPT, **ROW), bad.run(SAMPLING, raw_prompt=PROMPT, **ROW)
    )
    assert [o.record.stop_reason for o in outs] == ["interaction_done", "interaction_error"]
    assert [o.record.weight for o in outs] == [1.0, 0.0]


async def test_close_is_idempotent(tokenizer):
    user = verl_api.Gsm8kInteraction({"name": "gsm8k"})
    session = InteractionSession(user, "gsm8k", {"ground_truth": "5"}, "id-1", timeout_s=5)
    await session.start()
    await session.close()
    await session.close()
    assert [c[0] for c in verl_api.Gsm8kInteraction.calls] == ["start", "finalize"]


# ---- the YAML (verl's layout) ----------------------------------------------------------------
MODULE = "tests.unit.agentloop.verl_api_interactions"


def write(tmp_path, text: str):
    path = tmp_path / "interaction.yaml"
    path.write_text(text)
    return path


def test_the_verl_layout_loads_with_names_given_or_derived(tmp_path):
    path = write(
        tmp_path,
        f"interaction:\n  - class_name: {MODULE}.Gsm8kInteraction\n    config: {{x: 1}}\n"
        f"  - name: plain\n    class_name: {MODULE}.PlainDef\n",
    )
    loaded = load_interactions(path)
    assert sorted(loaded) == ["gsm8k", "plain"]  # verl: the class name less "Interaction"
    assert loaded["gsm8k"].config == {"x": 1, "name": "gsm8k"}
    assert loaded["plain"].config == {"name": "plain"}


def test_a_name_is_derived_however_the_class_is_named(tmp_path):
    (tmp_path / "users.py").write_text(
        "class QuizInteraction:\n"
        "    def __init__(self, config):\n"
        "        self.config = config\n\n"
        "    async def generate_response(self, instance_id, messages, **kwargs):\n"
        "        return True, '', 0.0, {}\n"
    )
    path = write(
        tmp_path,
        f"interaction:\n  - class_name: {MODULE}:PlainDef\n"
        f"  - class_name: {tmp_path / 'users.py'}:QuizInteraction\n",
    )
    assert sorted(load_interactions(path)) == ["plaindef", "quiz"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tools: []\n", "expected a top-level 'interaction:' list with one entry or more"),
        ("interaction:\n  - name: x\n", "interaction[0] needs class_name"),
        (
            f"interaction:\n  - class_name: {MODULE}.NoResponse\n",
            f"interaction[0]: {MODULE}.NoResponse has no generate_response method",
        ),
        (
            f"interaction:\n  - class_name: {MODULE}.Missing\n",
            f"interaction[0].class_name='{MODULE}.Missing': module '{MODULE}' defines no "
            "'Missing'; define it there or name one it defines",
        ),
        (
            f"interaction:\n  - {{name: a, class_name: {MODULE}.PlainDef}}\n"
            f"  - {{name: a, class_name: {MODULE}.PlainDef}}\n",
            "interaction[1]: an interaction named 'a' is already configured",
        ),
        (
            f"interaction:\n  - class_name: {MODULE}.Faulty\n",
            f"interaction[0]: {MODULE}.Faulty(config=...) raised KeyError: 'fault'",
        ),
    ],
)
def test_a_bad_interaction_file_is_refused_naming_the_entry(tmp_path, text, error):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as exc:
        load_interactions(path)
    assert error in str(exc.value)


def test_a_missing_interaction_file_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="multi_turn.interaction_config_path: '.*nope.yaml' does"):
        load_interactions(tmp_path / "nope.yaml")


# ---- start-up: rows and the default loop -----------------------------------------------------
def test_rows_must_name_a_configured_interaction():
    from agentloop import validate_rows

    ok = {"raw_prompt": PROMPT, **row()}
    validate_rows([ok], [], "tool_agent", ["gsm8k"])
    single = {"raw_prompt": PROMPT, "agent_name": "single_turn_agent"}
    validate_rows([single], [], "tool_agent", ["gsm8k"])  # its loop talks to no user
    with pytest.raises(ValueError) as exc:
        validate_rows([ok, {"raw_prompt": PROMPT}], [], "tool_agent", ["gsm8k"])
    assert str(exc.value) == (
        "row 1 has no extra_info.interaction_kwargs.name: with interactions configured "
        "(gsm8k; actor_rollout_ref.rollout.multi_turn.interaction_config_path), each "
        "tool_agent row names the one it talks to"
    )
    with pytest.raises(ValueError) as exc:
        validate_rows([{"raw_prompt": PROMPT, **row("chess")}], [], "tool_agent", ["gsm8k"])
    assert str(exc.value) == (
        "row 0 names interaction 'chess' in extra_info.interaction_kwargs, which is not "
        "configured; configured: gsm8k (actor_rollout_ref.rollout.multi_turn."
        "interaction_config_path)"
    )


def test_rows_without_an_agent_name_run_tool_agent_when_interactions_are_configured():
    assert RolloutConfig().default_agent_loop == "single_turn_agent"
    with_users = RolloutConfig(multi_turn=MultiTurnConfig(interaction_config_path="u.yaml"))
    assert with_users.default_agent_loop == "tool_agent"
    assert with_users.agent.default_agent_loop is None  # the key stays unset
    from agentloop.config import AgentConfig

    chosen = RolloutConfig(
        multi_turn=MultiTurnConfig(interaction_config_path="u.yaml"),
        agent=AgentConfig(default_agent_loop="single_turn_agent"),
    )
    assert chosen.default_agent_loop == "single_turn_agent"  # set explicitly: kept


def test_interaction_metrics_cover_the_samples_that_talked_to_a_user():
    from agentloop.batch import interaction_metrics
    from agentloop.records import InteractionRecord, SampleRecord

    records = [
        SampleRecord(),
        SampleRecord(
            interaction=InteractionRecord(
                name="g", turn_scores=[0.0, 1.0], final_score=1.0, terminated=True, seconds=0.5
            )
        ),
        SampleRecord(
            interaction=InteractionRecord(name="g", turn_scores=[None], seconds=1.5, error="x")
        ),
    ]
    assert interaction_metrics(records) == {
        "interaction/samples": 2.0,
        "interaction/user_turns/mean": 1.5,
        "interaction/terminated_frac": 0.5,
        "interaction/errors": 1.0,
        "interaction/seconds_mean": 1.0,
        "interaction/seconds_max": 1.5,
        "interaction/turn_score/mean": 0.5,
        "interaction/final_score/mean": 1.0,
    }
    assert interaction_metrics([SampleRecord()]) == {}


async def test_a_worker_loads_the_yaml_and_traces_each_user_turn(tokenizer, tmp_path):
    import mlflow

    from agentloop import AgentLoopWorker
    from agentloop.config import TraceConfig
    from agentloop.trace import TraceContext

    path = write(tmp_path, f"interaction:\n  - class_name: {MODULE}.Gsm8kInteraction\n")
    previous = mlflow.get_tracking_uri()
    trace = TraceConfig(
        backend="mlflow",
        tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}",
        experiment_name="users",
    )
    config = RolloutConfig(
        prompt_length=1024,
        response_length=1024,
        multi_turn=MultiTurnConfig(interaction_config_path=str(path)),
        trace=trace,
    )
    server = ScriptedServer(tokenizer, ["#### 4", "#### 5"])
    worker = AgentLoopWorker(config, server, tokenizer, tools={})
    assert worker.interaction_names() == ["gsm8k"]
    try:
        (out,) = await worker.generate_sequences(
            [{"raw_prompt": PROMPT, **ROW}], None, TraceContext(step=1)
        )  # no agent_name: tool_agent, as interactions are configured
        worker.tracer.flush()
        spans = mlflow.get_trace(out.record.trace_id).data.spans
    finally:
        mlflow.set_tracking_uri(previous)
    users = sorted((s for s in spans if s.name == "user:gsm8k"), key=lambda s: s.start_time_ns)
    assert [s.attributes["terminate"] for s in users] == ["False", "True"]
    assert [s.attributes["score"] for s in users] == ["0.0", "1.0"]
    assert users[0].outputs["text"] == "Your response is incorrect! Try again."
    assert out.record.stop_reason == "interaction_done"
