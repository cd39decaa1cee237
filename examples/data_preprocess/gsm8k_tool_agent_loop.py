"""GSM8K from local files to ``tool_agent`` rows with the calculator tool.

    python examples/data_preprocess/gsm8k_tool_agent_loop.py \
        --train_file ~/data/gsm8k/main/train-00000-of-00001.parquet \
        --test_file ~/data/gsm8k/main/test-00000-of-00001.parquet --out_dir data/gsm8k_tool

Input: parquet or jsonl files with the GSM8K columns ``question`` and ``answer`` (worked
solution ending in ``#### <number>``), as in the ``openai/gsm8k`` release. Output:
``train.parquet`` and ``test.parquet`` in the verl layout: ``prompt`` (system + user
messages), ``data_source: openai/gsm8k`` (scored by the built-in gsm8k rule), ``agent_name:
tool_agent``, ``ability``, ``reward_model.ground_truth`` (the number after ``####``, commas
dropped) and ``extra_info`` (split, index, the original question and answer, and
``tools_kwargs`` for the ``calculator`` tool of ``examples/gsm8k/tool_config.yaml``: with
the ground truth it reports a tool reward of 1.0 when one of its results was the answer).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "openai/gsm8k"
SYSTEM = (
    "Solve the math word problem step by step. For any arithmetic, call the calculator tool "
    "instead of computing in your head. When you are done, write the final number on its own "
    "line as '#### <number>'."
)
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist: pass the local GSM8K parquet or jsonl file")
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
        return rows
    suffix = path.suffix or "no suffix"
    raise ValueError(f"{path}: expected a .parquet or .jsonl file, got {suffix}")


def ground_truth(answer: str) -> str:
    """The number after ``####`` in a GSM8K worked answer, without thousands separators."""
    match = _FINAL.search(answer.strip())
    if match is None:
        raise ValueError("the answer does not end with '#### <number>'")
    return match.group(1).replace(",", "")


def to_row(row: dict[str, Any], index: int, split: str, where: str) -> dict[str, Any]:
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise ValueError(f"{where}: row {index} needs string 'question' and 'answer' columns")
    try:
        truth = ground_truth(answer)
    except ValueError as exc:
        raise ValueError(f"{where}: row {index}: {exc}") from None
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question.strip()},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {
            "split": split,
            "index": index,
            "question": question,
            "answer": answer,
            "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": truth}}},
        },
    }


def convert(path: Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    rows = read_rows(path)[:limit]
    return [to_row(r, i, split, str(path)) for i, r in enumerate(rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_file", type=Path, required=True)
    parser.add_argument("--test_file", type=Path, required=True)
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None, help="first N rows of each file")
    args = parser.parse_args(argv)
    try:
        splits = {
            "train": convert(args.train_file, "train", args.limit),
            "test": convert(args.test_file, "test", args.limit),
        }
    except ValueError as exc:
        print(f"gsm8k_tool_agent_loop: error: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), args.out_dir / f"{split}.parquet")
        print(f"{split}: {len(rows)} rows -> {args.out_dir / f'{split}.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
