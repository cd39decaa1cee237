"""Search-R1 data: a BM25 index served over MCP, and ``tool_agent`` rows.

    # a generated world (fictional facts, one- and two-hop questions)
    python -m recipes.search_r1.data --out data/search_r1 --synthetic
    # your corpus and NQ / HotpotQA-style files you have locally
    python -m recipes.search_r1.data --out data/search_r1 --corpus wiki.jsonl \
        --train_file nq_train.jsonl --val_file nq_dev.jsonl --data_source nq

Writes ``index/`` (BM25), ``train.jsonl``, ``val.jsonl`` and ``mcp_search.json`` (the MCP
config for ``multi_turn.tool_config_path``: this Python running ``search_server.py`` on the
index, absolute paths). QA files: jsonl or parquet with ``question`` and ``golden_answers``
(FlashRAG / Search-R1), ``answers`` (list) or ``answer`` (string).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from recipes.search_r1.corpus import make_world
from recipes.search_r1.retriever import Bm25Index, read_corpus

__all__ = ["INSTRUCTION", "main", "make_rows", "mcp_config", "read_qa"]

REPO = Path(__file__).resolve().parents[2]
INSTRUCTION = (
    "Answer the question using the search tool, which looks facts up in a knowledge base; "
    "search as often as you need. When you know the answer, write only the answer inside "
    "<answer> and </answer>.\nQuestion: "
)


def read_qa(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw = pq.read_table(path).to_pylist()
    else:
        raw = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out = []
    for i, row in enumerate(raw):
        answers = row.get("golden_answers", row.get("answers", row.get("answer")))
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(row.get("question"), str) or not answers:
            raise ValueError(
                f"{path}: row {i} needs 'question' and 'golden_answers' (or 'answers'/'answer')"
            )
        out.append({"question": row["question"], "answers": [str(a) for a in answers]})
    return out


def make_rows(qa: list[dict[str, Any]], data_source: str, split: str) -> list[dict[str, Any]]:
    return [
        {
            "prompt": [{"role": "user", "content": INSTRUCTION + q["question"].strip()}],
            "data_source": data_source,
            "agent_name": "tool_agent",
            "reward_model": {"style": "rule", "ground_truth": {"target": q["answers"]}},
            "extra_info": {"split": split, "index": i, "hops": q.get("hops")},
        }
        for i, q in enumerate(qa)
    ]


def mcp_config(index: Path) -> dict[str, Any]:
    server = Path(__file__).resolve().parent / "search_server.py"
    return {
        "mcpServers": {
            "retriever": {
                "command": sys.executable,
                "args": [str(server), "--index", str(index.resolve())],
                "env": {"PYTHONPATH": str(REPO)},
            }
        }
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--synthetic", action="store_true", help="generate the world")
    parser.add_argument("--corpus", type=Path, help="jsonl passages {id, title, contents}")
    parser.add_argument("--train_file", type=Path)
    parser.add_argument("--val_file", type=Path)
    parser.add_argument("--data_source", default="nq")
    parser.add_argument("--train", type=int, default=None, help="at most N train rows")
    parser.add_argument("--val", type=int, default=64, help="at most N val rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.synthetic:
            passages, qa = make_world(args.seed)
            n_val = min(args.val, len(qa) // 4)
            train_qa, val_qa, source = qa[n_val:], qa[:n_val], "search_synthetic"
        else:
            if not (args.corpus and args.train_file and args.val_file):
                raise ValueError("give --synthetic, or --corpus, --train_file and --val_file")
            passages = read_corpus(args.corpus)
            train_qa, val_qa = read_qa(args.train_file), read_qa(args.val_file)
            random.Random(args.seed).shuffle(train_qa)
            source = args.data_source
    except ValueError as exc:
        print(f"search_r1 data: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    Bm25Index.build(passages, args.out / "index")
    write_jsonl(args.out / "train.jsonl", make_rows(train_qa[: args.train], source, "train"))
    write_jsonl(args.out / "val.jsonl", make_rows(val_qa[: args.val], source, "val"))
    (args.out / "mcp_search.json").write_text(json.dumps(mcp_config(args.out / "index"), indent=2))
    print(
        f"{len(passages)} passages indexed, {len(train_qa[: args.train])} train / "
        f"{len(val_qa[: args.val])} val rows, MCP config {args.out / 'mcp_search.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
