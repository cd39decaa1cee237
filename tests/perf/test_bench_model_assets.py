"""Benchmarks for the model assets (run by `make bench`, not by `make test`).

- prepare: cold build of tiny-qwen3 vs. a cache hit.
- tokenizer: the built Qwen tokenizer (HF tokenizers, batch) vs. tiktoken over the same BPE.
Both sides are measured in the same run after a warm-up and printed.
"""

from __future__ import annotations

import time
import unicodedata

import tiktoken
from transformers import AutoTokenizer

from trainer.models import prepare
from trainer.models.qwen_tokenizer import QWEN_PATTERN, load_ranks, qwen_tiktoken_path


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def test_bench_prepare_cold_vs_cached(tmp_path):
    t = time.perf_counter()
    path = prepare("tiny-qwen3", cache_dir=tmp_path)
    cold = time.perf_counter() - t
    cached = _best(lambda: prepare("tiny-qwen3", cache_dir=tmp_path), repeat=5)
    print(
        f"\n[bench] prepare tiny-qwen3: cold {cold:.2f} s, cached {cached * 1e3:.2f} ms, "
        f"ratio {cold / cached:.0f}x (target: cached < 50 ms)"
    )
    assert path.is_dir()


def test_bench_tokenizer_vs_tiktoken(tiny_qwen3_path):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    ref = tiktoken.Encoding(
        "qwen",
        pat_str=QWEN_PATTERN,
        mergeable_ranks=load_ranks(qwen_tiktoken_path()),
        special_tokens={},
    )
    base = "def f(x):\n    return x * 2  # double\n你好，世界。The quick brown fox 🙂 3.14159\n"
    docs = [unicodedata.normalize("NFC", base * (1 + i % 7)) for i in range(2000)]
    n_tokens = sum(len(ids) for ids in ref.encode_batch(docs))  # warm-up
    tok(docs[:10])
    hf = _best(lambda: tok(docs, add_special_tokens=False))
    tk = _best(lambda: ref.encode_ordinary_batch(docs))
    print(
        f"\n[bench] tokenize {len(docs)} docs / {n_tokens} tokens: "
        f"HF tokenizer {n_tokens / hf / 1e6:.2f} Mtok/s, tiktoken {n_tokens / tk / 1e6:.2f} "
        f"Mtok/s, HF/tiktoken time ratio {hf / tk:.2f}"
    )
    assert tok(docs[:5], add_special_tokens=False)["input_ids"] == ref.encode_ordinary_batch(
        docs[:5]
    )
