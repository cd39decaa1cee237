"""Context compaction benchmark (``make bench``): ``tool_agent`` samples at the same context
budget with compaction off and on (``multi_turn.max_context_tokens``), both modes: older
outputs dropped (``drop_tool_outputs`` keeping the newest) and the history summarized by the
policy (``summarize``), in the same run.

Workload: scripted model turns (``ScriptedServer``: the real tiny-qwen3 tokenizer and Qwen3
chat template, the real loop, parser, tools and template deltas). A random tiny model cannot
hold a long tool-using session that ends with an answer, so the model's side is scripted:
each of ``SAMPLES`` seeded sessions reads 3-9 pages of 20-75 words (their token counts are
measured and printed), then answers. Off, a history past the budget ends the sample
(``length``: the engine's context is the budget); on, older pages are dropped and the sample
goes on in a new segment. The scripted policy answers a summary request with a one-line summary
of the pages it read (``SummarizingServer``).

Measured per side: samples that finish (the model answered: ``no_tool_call``) and tokens
trained (mask-1 tokens over every training sample, segments included), with the samples,
segments, compactions and stops. Writes bench_results/compaction.json; printed, not asserted,
except that every on-side segment fits the budget.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from pathlib import Path

from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.config import SUMMARY_PROMPT, CompactionConfig
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from servers import EngineConfig
from servers.types import GenerateRequest, TokenOutput
from tests.unit.agentloop.scripted import ScriptedServer

REPO = Path(__file__).resolve().parents[2]
SAMPLES, BUDGET, TURN, SEED, SUMMARY = 64, 1536, 64, 7, 48
PROMPT = [{"role": "user", "content": "Read the pages you need, then answer."}]
PAGE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "page",
        "description": "Read page n (words: its length).",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "words": {"type": "integer"}},
            "required": ["n", "words"],
        },
    },
}


class PageTool(BaseTool):
    schema = PAGE_SCHEMA

    async def execute(self, instance_id, arguments):
        n, words = arguments["n"], arguments["words"]
        return ToolResult(f"page {n}: " + " ".join(f"w{n}.{i}" for i in range(words)))


class SummarizingServer(ScriptedServer):
    """The scripted policy, which answers a summary request (its prompt ends with
    ``SUMMARY_PROMPT``) with the pages read so far instead of its next scripted turn."""

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        tail = self.tokenizer.decode(request.prompt_ids[-96:])
        if SUMMARY_PROMPT not in tail:
            return await super().generate(request)
        read = self.tokenizer.decode(request.prompt_ids).count('"name": "page"')
        self.turns.insert(0, f"I read {read} pages; their words are w-numbers. Read on.")
        return await super().generate(request)


def sessions() -> list[list[str]]:
    """Each sample's scripted model turns: its page reads, then the answer."""
    rng = random.Random(SEED)
    out = []
    for _ in range(SAMPLES):
        reads = []
        for n in range(rng.randint(3, 9)):
            call = json.dumps({"name": "page", "arguments": {"n": n, "words": rng.randint(20, 75)}})
            reads.append(f"Reading page {n}.\n<tool_call>\n{call}\n</tool_call>")
        out.append([*reads, "I have read enough: the answer is 42."])
    return out


async def run_side(tokenizer, turns: list[list[str]], mode: str | None) -> dict:
    """One side: compaction off (``mode`` None) or in ``mode``."""
    multi_turn = MultiTurnConfig(
        max_tokens_per_turn=TURN,
        max_tool_response_length=4000,
        max_context_tokens=BUDGET if mode else None,
        compaction=CompactionConfig(mode=mode or "drop_tool_outputs", summary_tokens=SUMMARY),
    )
    config = RolloutConfig(
        prompt_length=BUDGET,
        response_length=BUDGET,
        engine=EngineConfig(max_model_len=BUDGET),  # the same context budget on both sides
        multi_turn=multi_turn,
    )
    stops: collections.Counter[str] = collections.Counter()
    finished = trained = samples = compactions = 0
    start = time.perf_counter()
    for script in turns:
        server = SummarizingServer(tokenizer, script)
        loop = ToolAgentLoop(AgentLoopContext(server, tokenizer, config, {"page": PageTool()}))
        out = await loop.run(config.sampling_params(), raw_prompt=PROMPT)
        every = [out, *out.segments]
        final = every[-1].record.stop_reason
        stops[final] += 1
        finished += final == "no_tool_call"
        trained += sum(sum(o.response_mask) for o in every)
        samples += len(every)
        compactions += int(out.metrics.get("compactions", 0))
        if mode:
            assert all(len(o.prompt_ids) + len(o.response_ids) <= BUDGET for o in every)
    return {
        "finished": finished,
        "tokens_trained": trained,
        "training_samples": samples,
        "compactions": compactions,
        "stops": dict(stops),
        "seconds": time.perf_counter() - start,
    }


def page_tokens(tokenizer, turns: list[list[str]]) -> list[int]:
    """The token count of every page the sessions read."""
    counts = []
    for script in turns:
        for turn in script[:-1]:
            args = json.loads(turn.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
            text = asyncio.run(PageTool().execute("i", args["arguments"])).text
            counts.append(len(tokenizer.encode(text, add_special_tokens=False)))
    return counts


def test_bench_compaction_on_vs_off(tiny_qwen3_path, capsys):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    turns = sessions()
    pages = page_tokens(tokenizer, turns)
    asyncio.run(run_side(tokenizer, turns[:2], "summarize"))  # warm-up (template compile)
    off = asyncio.run(run_side(tokenizer, turns, None))
    on = asyncio.run(run_side(tokenizer, turns, "drop_tool_outputs"))
    summarized = asyncio.run(run_side(tokenizer, turns, "summarize"))
    result = {
        "workload": (
            f"{SAMPLES} scripted tool_agent sessions (ScriptedServer: a random tiny model "
            "cannot hold long tool-using sessions), 3-9 page reads of "
            f"{min(pages)}-{max(pages)} tokens then an answer; context budget {BUDGET} "
            f"tokens, {TURN} tokens per turn, summaries up to {SUMMARY} tokens"
        ),
        "off": off,
        "on": on,
        "summarize": summarized,
    }
    out_dir = REPO / "bench_results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "compaction.json").write_text(json.dumps(result, indent=2))
    with capsys.disabled():
        print(f"\ncontext compaction, {result['workload']}")
        print(f"{'':>14} {'finished':>9} {'tokens trained':>15} {'samples':>8} {'compactions':>12}")
        sides = (("off", off), ("on (drop, 1)", on), ("on (summary)", summarized))
        for side, r in sides:
            print(
                f"{side:>14} {r['finished']:>5}/{SAMPLES:<3} {r['tokens_trained']:>15,} "
                f"{r['training_samples']:>8} {r['compactions']:>12}   stops {r['stops']}"
            )
