"""vf-calc: a verifiers ToolEnv where the model answers arithmetic questions with two tools.

Load with ``vf.load_environment("vf-calc", num_examples=64, seed=0, max_turns=4)``.
"""

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = (
    "You are a careful calculator. Use the add and multiply tools for every step, "
    "then state the final number."
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def _questions(n: int, rng: random.Random, skip: set[str]) -> list[dict]:
    rows: list[dict] = []
    while len(rows) < n:
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(1, 99)
        if rng.random() < 0.5:
            question, value = f"What is {a} * {b} + {c}? Use the tools.", a * b + c
        else:
            question, value = f"What is ({a} + {b}) * {c}? Use the tools.", (a + b) * c
        if question not in skip:
            skip.add(question)
            rows.append({"question": question, "answer": str(value)})
    return rows


def correct_answer(completion, answer, **kwargs) -> float:
    """1.0 when the last assistant text contains the answer as a whole number."""
    texts = [m.get("content") for m in completion if m.get("role") == "assistant"]
    texts = [t for t in texts if t]
    return 1.0 if texts and re.search(rf"(?<!\d){answer}(?!\d)", str(texts[-1])) else 0.0


def used_tools(completion, **kwargs) -> float:
    """1.0 when any assistant message called a tool."""
    return float(any(m.get("role") == "assistant" and m.get("tool_calls") for m in completion))


def load_environment(num_examples: int = 64, seed: int = 0, max_turns: int = 4, **kwargs):
    rng, seen = random.Random(seed), set()
    train = Dataset.from_list(_questions(num_examples, rng, seen))
    evals = Dataset.from_list(_questions(max(num_examples // 2, 1), rng, seen))
    rubric = vf.Rubric(funcs=[correct_answer, used_tools], weights=[1.0, 0.2])
    return vf.ToolEnv(
        tools=[add, multiply],
        dataset=train,
        eval_dataset=evals,
        system_prompt=SYSTEM_PROMPT,
        rubric=rubric,
        max_turns=max_turns,
        **kwargs,
    )
