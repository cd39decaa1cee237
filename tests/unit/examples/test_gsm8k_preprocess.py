"""examples/data_preprocess/gsm8k_tool_agent_loop.py on local files in the openai/gsm8k
layout: verl tool_agent rows the trainer loads and the built-in gsm8k rule scores, and a clear
error for each bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.rewards.rules import default_compute_score

SCRIPT = Path(__file__).resolve().parents[3] / "examples/data_preprocess/gsm8k_tool_agent_loop.py"
ROWS = [
    {
        "question": "Tom has 3 boxes of 12 pens and gives away 5. How many pens are left?",
        "answer": "3 boxes hold 3*12=<<3*12=36>>36 pens.\n36-5=<<36-5=31>>31\n#### 31",
    },
    {
        "question": "A farm sells 1,200 eggs a day for 20 days. How many eggs?",
        "answer": "1,200*20=<<1200*20=24000>>24,000\n#### 24,000",
    },
]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gsm8k_tool_agent_loop", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_local_parquet_and_jsonl_become_tool_agent_rows(script, tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:1]))
    out = tmp_path / "out"
    rc = script.main(
        [
            "--train_file",
            str(tmp_path / "train.parquet"),
            "--test_file",
            str(tmp_path / "test.jsonl"),
            "--out_dir",
            str(out),
        ]
    )
    assert rc == 0
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert len(train) == 2 and len(test) == 1
    row = train[1]
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "openai/gsm8k"
    assert row["reward_model"]["ground_truth"] == "24000"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == ROWS[1]["question"]
    tools_kwargs = {"calculator": {"create_kwargs": {"ground_truth": "24000"}}}
    assert row["extra_info"]["tools_kwargs"] == tools_kwargs
    assert (row["extra_info"]["split"], row["extra_info"]["index"]) == ("train", 1)
    # the built-in rule for this data_source scores the format the system prompt asks for
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score("openai/gsm8k", "so\n#### 24000", truth, {}) == 1.0
    assert default_compute_score("openai/gsm8k", "so\n#### 2400", truth, {}) == 0.0


def test_rows_load_through_the_trainer_data_path(script, tmp_path, tiny_qwen3_path):
    from transformers import AutoTokenizer

    from trainer.config import DataConfig
    from trainer.data.rows import load_rows

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    assert (
        script.main(
            [
                "--train_file",
                str(tmp_path / "train.parquet"),
                "--test_file",
                str(tmp_path / "train.parquet"),
                "--out_dir",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    rows = load_rows(
        [str(tmp_path / "o/train.parquet")],
        DataConfig(),
        AutoTokenizer.from_pretrained(tiny_qwen3_path),
    )
    assert len(rows) == 2 and rows[0]["raw_prompt"][1]["role"] == "user"
    from agentloop.worker import prepare_row

    fields = prepare_row(rows[0], "single_turn_agent")  # what the worker hands the loop
    assert fields["agent_name"] == "tool_agent"
    assert fields["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": "31"}}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "{path} does not exist: pass the local GSM8K parquet or jsonl file"),
        ("not json\n", "{path}:1: not a JSON line (Expecting value)"),
        ('{"question": "q"}\n', "{path}: row 0 needs string 'question' and 'answer' columns"),
        (
            '{"question": "q", "answer": "about 4"}\n',
            "{path}: row 0: the answer does not end with '#### <number>'",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(script, tmp_path, capsys, content, message):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    rc = script.main(
        ["--train_file", str(path), "--test_file", str(path), "--out_dir", str(tmp_path / "out")]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert err == f"gsm8k_tool_agent_loop: error: {message.format(path=path)}\n"
    assert not (tmp_path / "out").exists()  # nothing half-written
