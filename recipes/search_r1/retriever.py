"""BM25 over a passage corpus (``bm25s``): build once into a folder, load in the search server.

Passages are ``{"id", "title", "contents"}`` (the Search-R1 / wiki-dump layout also puts
the title as the first line of ``contents``; both work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import bm25s

__all__ = ["Bm25Index", "format_hits", "read_corpus"]


def read_corpus(path: Path) -> list[dict[str, Any]]:
    """A jsonl corpus; each line needs ``contents`` (or ``text``), ``title`` is optional."""
    passages = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("contents", row.get("text"))
        if not isinstance(text, str):
            raise ValueError(f"{path}:{n}: a passage needs a 'contents' (or 'text') string")
        passages.append(
            {"id": str(row.get("id", n - 1)), "title": row.get("title", ""), "contents": text}
        )
    if not passages:
        raise ValueError(f"{path} has no passages")
    return passages


class Bm25Index:
    def __init__(self, retriever: bm25s.BM25, passages: list[dict[str, Any]]) -> None:
        self.retriever = retriever
        self.passages = passages

    @staticmethod
    def _doc(p: dict[str, Any]) -> str:
        return f"{p['title']}\n{p['contents']}" if p.get("title") else p["contents"]

    @classmethod
    def build(cls, passages: list[dict[str, Any]], folder: Path | None = None) -> Bm25Index:
        tokens = bm25s.tokenize(
            [cls._doc(p) for p in passages], stopwords="en", show_progress=False
        )
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        index = cls(retriever, passages)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            retriever.save(str(folder))
            (folder / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
        return index

    @classmethod
    def load(cls, folder: Path) -> Bm25Index:
        if not (folder / "passages.jsonl").is_file():
            raise ValueError(
                f"{folder} is not a BM25 index (no passages.jsonl): build one with "
                "python -m recipes.search_r1.data"
            )
        passages = [json.loads(x) for x in (folder / "passages.jsonl").read_text().splitlines()]
        return cls(bm25s.BM25.load(str(folder)), passages)

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        k = max(1, min(k, len(self.passages)))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.ids[0]:  # only stopwords or punctuation
            return []
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        return [
            {**self.passages[int(i)], "score": float(s)}
            for i, s in zip(ids[0], scores[0], strict=True)
            if s > 0
        ]


def format_hits(hits: list[dict[str, Any]]) -> str:
    if not hits:
        return "No passage matched the query."
    return "\n".join(
        f"Doc {n} (Title: {h['title']}) {h['contents']}" for n, h in enumerate(hits, start=1)
    )
