"""AgentLoopManager + Ray AgentLoopWorkers + a real vLLM CPU engine (SmolLM2-135M) on a
small parquet of single_turn_agent and tool_agent rows: batch shapes and trajectory
invariants, the engine's log-probs match a transformers forward over the trajectory, and
validation batches are greedy by default (``rollout.val_kwargs``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
import yaml
from transformers import AutoTokenizer

from agentloop import AgentConfig, AgentLoopManager, MultiTurnConfig, RolloutConfig, TraceContext
from agentloop.tokens import mask_spans
from servers import ServerConfig, launch_servers
from tests.integration.agentloop.helpers import ECHO_SCHEMA, max_logprob_gap
from trainer.config import DataConfig
from trainer.data.rows import load_rows

pytestmark = pytest.mark.integration

PROMPT_LEN, RESPONSE_LEN = 256, 160
QUESTIONS = ["Name a color.", "What is 2+2?", "Say hi.", "Name a fruit."]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def server(local_ray, smollm2_path):
    (handle,) = launch_servers(
        ServerConfig(model=str(smollm2_path), max_model_len=PROMPT_LEN + RESPONSE_LEN), 1
    )
    yield handle
    ray.get(handle.shutdown.remote())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("agentloop")
    (d / "tools.yaml").write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "tests.integration.agentloop.helpers.EchoTool",
                        "config": {"type": "native", "latency_s": 0.05},
                        "tool_schema": ECHO_SCHEMA,
                    }
                ]
            }
        )
    )
    (d / "loops.yaml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "forced_tool_agent",
                    "_target_": "tests.integration.agentloop.helpers.ForcedToolAgentLoop",
                    "tag": "t",
                }
            ]
        )
    )
    rows = []
    for i, q in enumerate(QUESTIONS):
        content = f"{q} Answer in at most five words."
        kwargs = {"echo": {"create_kwargs": {"prefix": f"r{i}:"}}}
        for agent in ("single_turn_agent", "forced_tool_agent"):
            rows.append(
                {
                    "prompt": [{"role": "user", "content": content}],
                    "data_source": "toy",
                    "agent_name": agent,
                    "extra_info": {"index": i, "tools_kwargs": kwargs},
                }
            )
    pq.write_table(pa.Table.from_pylist(rows), d / "train.parquet")
    return d


@pytest.fixture(scope="module")
def config(files):
    return RolloutConfig(
        prompt_length=PROMPT_LEN,
        response_length=RESPONSE_LEN,
        n=2,
        multi_turn=MultiTurnConfig(
            max_assistant_turns=3, tool_config_path=str(files / "tools.yaml")
        ),
        agent=AgentConfig(num_workers=2, agent_loop_config_path=str(files / "loops.yaml")),
    )


@pytest.fixture(scope="module")
def manager(server, config, smollm2_path):
    manager = AgentLoopManager(config, [server], str(smollm2_path))
    yield manager
    manager.shutdown()


@pytest.fixture(scope="module")
def rows(files, tokenizer):
    return load_rows([str(files / "train.parquet")], DataConfig(), tokenizer)


@pytest.fixture(scope="module")
def batch(manager, rows):
    manager.validate(rows)
    return manager.generate_sequences(
        rows, sampling_params={"temperature": 1.0, "top_p": 1.0, "max_tokens": 40}
    )


def test_batch_has_padded_shapes_and_group_uids(batch):
    b = 16  # 8 rows x n=2
    assert batch.input_ids.shape == (b, PROMPT_LEN + RESPONSE_LEN)
    assert batch.prompts.shape == (b, PROMPT_LEN) and batch.responses.shape == (b, RESPONSE_LEN)
    assert batch.response_mask.shape == batch.rollout_log_probs.shape == (b, RESPONSE_LEN)
    assert batch.rollout_log_probs.dtype == torch.float32
    assert torch.equal(batch.input_ids, torch.cat([batch.prompts, batch.responses], dim=1))
    # n=2 consecutive samples per row share a uid; rows differ
    assert [batch.uid[i] == batch.uid[i + 1] for i in range(0, b, 2)] == [True] * 8
    assert len(set(batch.uid)) == 8
    assert (
        batch.agent_name
        == ["single_turn_agent"] * 2
        + ["forced_tool_agent"] * 2
        + (["single_turn_agent"] * 2 + ["forced_tool_agent"] * 2) * 3
    )


def test_prompt_is_left_padded_and_response_right_padded(batch):
    attn = batch.attention_mask
    prompt_attn, resp_attn = attn[:, :PROMPT_LEN], attn[:, PROMPT_LEN:]
    # left padding: zeros then ones; right padding: ones then zeros
    assert torch.all(prompt_attn[:, 1:] >= prompt_attn[:, :-1])
    assert torch.all(resp_attn[:, 1:] <= resp_attn[:, :-1])
    assert torch.all(prompt_attn[:, -1] == 1) and torch.all(resp_attn[:, 0] == 1)
    # positions count real tokens from 0
    expected = (attn.cumsum(1) - 1).clamp(min=0)
    assert torch.equal(batch.position_ids, expected)
    # the loss mask and log-probs live only on real response tokens, 0 elsewhere
    assert torch.all(batch.response_mask <= resp_attn)
    assert torch.all(batch.rollout_log_probs[batch.response_mask == 0] == 0)
    sampled = batch.rollout_log_probs[batch.response_mask == 1]
    assert torch.all(torch.isfinite(sampled)) and torch.all(sampled <= 0)


def test_tool_rows_take_several_turns_and_their_deltas_are_template_text(batch, tokenizer):
    multi = 0
    for i in range(len(batch)):
        record = batch.records[i]
        if batch.agent_name[i] == "single_turn_agent":
            assert batch.num_turns[i] == 2 and batch.tool_calls[i] == 0
            assert batch.response_mask[i].sum() == batch.attention_mask[i, PROMPT_LEN:].sum()
            continue
        assert batch.num_turns[i] == 1 + record.assistant_turns + record.user_turns
        assert batch.tool_calls[i] == record.user_turns and batch.tool_errors[i] == 0
        multi += record.user_turns >= 2
        n = int(batch.attention_mask[i, PROMPT_LEN:].sum())
        ids, mask = batch.responses[i, :n].tolist(), batch.response_mask[i, :n].tolist()
        zero_spans = mask_spans(ids, mask, 0)
        assert len(zero_spans) == record.user_turns
        prefix = f"r{batch.rows[i]['index']}:echo("
        for span in zero_spans:
            text = tokenizer.decode(span, skip_special_tokens=False)
            assert text.startswith("\n<|im_start|>user\n<tool_response>\n" + prefix), text
            assert text.endswith(" chars)\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        for span in mask_spans(ids, mask, 1)[:-1]:  # every model turn before a tool turn closed
            assert span[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert multi >= 1, "no tool row reached two tool turns"


def test_engine_log_probs_match_a_transformers_forward_over_the_trajectory(batch, smollm2_path):
    worst = max_logprob_gap(batch, smollm2_path, PROMPT_LEN)
    print(f"max |engine - transformers| log-prob gap {worst:.2e}")
    assert worst < 1e-3, f"max |engine - transformers| log-prob gap {worst:.4f}"


def test_rollout_metrics_cover_phases_and_the_slowest_sample(batch):
    m = batch.metrics
    for key in (
        "timing_s/gen",
        "agent_loop/generate_s/max",
        "agent_loop/tool_s/mean",
        "agent_loop/num_turns/mean",
        "agent_loop/slowest/total_s",
        "agent_loop/slowest/num_turns",
    ):
        assert key in m, key
    assert m["agent_loop/slowest/total_s"] == m["agent_loop/total_s/max"]
    assert 0 < m["agent_loop/total_s/max"] <= m["timing_s/gen"]
    assert m["agent_loop/tool_s/max"] > 0


def test_validation_batches_are_greedy_by_default(manager, rows):
    single = [r for r in rows if r["agent_name"] == "single_turn_agent"][:2]
    val = manager.generate_sequences(single, n=2, trace=TraceContext(step=1, validate=True))
    # default val_kwargs (do_sample=false): the engine decodes greedily, so both responses of
    # a prompt are the same tokens
    lengths = val.attention_mask[:, PROMPT_LEN:].sum(-1)
    for i in (0, 2):
        assert val.uid[i] == val.uid[i + 1] and lengths[i] == lengths[i + 1] > 0
        assert torch.equal(val.responses[i], val.responses[i + 1]), i


def test_manager_rejects_rows_naming_unknown_loops_or_tools_at_start(server, config, smollm2_path):
    manager = AgentLoopManager(config, [server], str(smollm2_path))
    try:
        row = {"raw_prompt": [{"role": "user", "content": "x"}]}
        with pytest.raises(ValueError, match=r"agent_name 'nope' is not a registered agent loop"):
            manager.validate([{**row, "agent_name": "nope"}])
        with pytest.raises(ValueError, match=r"tools_kwargs names tool 'search'"):
            manager.validate([{**row, "tools_kwargs": {"search": {}}}])
    finally:
        manager.shutdown()
