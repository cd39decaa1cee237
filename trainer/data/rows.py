"""Dataset rows for agent loops: parquet or jsonl in the verl layout.

A row: ``prompt`` (chat messages), ``data_source``, ``agent_name``, ``reward_model``
(``ground_truth``), ``extra_info`` (``index``, ``tools_kwargs``, ``interaction_kwargs``).
With ``data.return_raw_chat`` the messages are handed to the loops as ``raw_prompt``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop.tokens import encode_prompt
from trainer.config.schema import DataConfig

__all__ = ["filter_overlong", "load_rows", "read_rows", "to_agent_rows"]

logger = logging.getLogger(__name__)


def read_rows(files: Sequence[str]) -> list[dict[str, Any]]:
    """All rows of the given parquet / jsonl files, in order, as plain Python objects."""
    if not files:
        raise ValueError("no data files: set data.train_files (or data.val_files)")
    rows: list[dict[str, Any]] = []
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(f"data file {name!r} does not exist")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(path).to_pylist())
        elif path.suffix in (".jsonl", ".json"):
            with path.open() as f:
                for line_no, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise ValueError(
                                f"{name}:{line_no}: not a JSON object ({exc.msg})"
                            ) from None
        else:
            raise ValueError(f"data file {name!r}: expected a .parquet or .jsonl file")
    return rows


def to_agent_rows(
    rows: list[dict[str, Any]], config: DataConfig, source: str = "data"
) -> list[dict[str, Any]]:
    """Rows as agent loops receive them: ``raw_prompt`` messages, ``index``."""
    out = []
    for i, row in enumerate(rows):
        row = dict(row)
        if "raw_prompt" not in row:
            if not config.return_raw_chat:
                raise ValueError(
                    f"{source}: row {i} has no 'raw_prompt' and data.return_raw_chat is False; "
                    "agent loops need the chat messages: set data.return_raw_chat=True"
                )
            prompt = row.get(config.prompt_key)
            if prompt is None:
                raise ValueError(
                    f"{source}: row {i} has neither 'raw_prompt' nor '{config.prompt_key}' "
                    "(chat messages); set data.prompt_key to the column holding them"
                )
            row["raw_prompt"] = (
                [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            )
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        row.setdefault("index", extra.get("index", i))
        out.append(row)
    return out


def filter_overlong(
    rows: list[dict[str, Any]],
    tokenizer: Any,
    max_prompt_length: int,
    tools: Sequence[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Drop rows whose templated prompt (tool schemas included) exceeds ``max_prompt_length``;
    returns (kept rows, dropped count)."""
    kept = []
    for row in rows:
        ids = encode_prompt(
            tokenizer, row["raw_prompt"], tools=tools, chat_template_kwargs=chat_template_kwargs
        )
        if len(ids) <= max_prompt_length:
            kept.append(row)
    return kept, len(rows) - len(kept)


def load_rows(
    files: Sequence[str],
    config: DataConfig,
    tokenizer: Any,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Read (the files, or ``data.custom_cls`` over them), convert and (if configured)
    length-filter; an empty result is an error."""
    if config.custom_cls.path is not None:
        from trainer.data.custom import custom_rows

        raw = custom_rows(files, config, tokenizer)
        source = f"data.custom_cls {config.custom_cls.name}"
    else:
        raw, source = read_rows(files), ", ".join(files)
    rows = to_agent_rows(raw, config, source=source)
    total = len(rows)
    if config.filter_overlong_prompts:
        rows, dropped = filter_overlong(
            rows, tokenizer, config.max_prompt_length, tools, chat_template_kwargs
        )
        if dropped:
            logger.warning(
                "dropped %d of %d rows with prompts over data.max_prompt_length=%d tokens",
                dropped,
                total,
                config.max_prompt_length,
            )
    if not rows:
        raise ValueError(
            f"no rows left in {', '.join(files)} ({total} read) after filtering prompts over "
            f"data.max_prompt_length={config.max_prompt_length}: raise it"
        )
    return rows
