"""vf-guess: a verifiers MultiTurnEnv where the model guesses a secret number from 1 to 16.

After each guess the environment answers "higher", "lower" or "correct" as a user message.
Load with ``vf.load_environment("vf-guess", num_examples=64, seed=0, max_turns=5)``.
"""

import random
import re

import verifiers as vf
from datasets import Dataset

PROMPT = (
    "I am thinking of a whole number from 1 to 16. Guess it: reply with one number only. "
    "After each guess I will say higher, lower or correct."
)


def _guesses(messages) -> list[int | None]:
    """The number in each assistant message (None when it holds no number)."""
    out: list[int | None] = []
    for m in messages:
        if m.get("role") == "assistant":
            found = re.findall(r"-?\d+", str(m.get("content") or ""))
            out.append(int(found[-1]) if found else None)
    return out


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs):
        guess, secret = _guesses(messages)[-1], int(state["answer"])
        if guess == secret:
            reply = [vf.UserMessage(content="correct")]
            state["final_env_response"] = reply  # stops the rollout after this reply
            return reply
        if guess is None:
            return [vf.UserMessage(content="Reply with one number from 1 to 16.")]
        return [vf.UserMessage(content="higher" if guess < secret else "lower")]


def load_environment(num_examples: int = 64, seed: int = 0, max_turns: int = 5, **kwargs):
    rng = random.Random(seed)
    rows = []
    for _ in range(num_examples):
        secret = rng.randint(1, 16)
        rows.append({"question": PROMPT, "answer": str(secret), "info": {"secret": secret}})

    def solved(completion, answer, **kw) -> float:
        return 1.0 if int(answer) in _guesses(completion) else 0.0

    def efficiency(completion, answer, **kw) -> float:
        guesses = _guesses(completion)
        if int(answer) not in guesses:
            return 0.0
        return (max_turns - (guesses.index(int(answer)) + 1) + 1) / max_turns

    rubric = vf.Rubric(funcs=[solved, efficiency], weights=[1.0, 0.5])
    return GuessEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns, **kwargs)
