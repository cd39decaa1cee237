"""An ``openai`` SDK agent that keeps its context short: after ``summarize_after`` tool
rounds it replaces the older turns by one summary of the results so far (the user message
is rewritten with them). The next call extends no earlier call, so the gateway starts a new
segment (a new training sample of the same session, its branch point recorded)."""

from __future__ import annotations

from typing import Any

from examples.gateway.calc_tools import TOOLS, prompt_of, run_tool, score

__all__ = ["agent"]


def _summarized(prompt: list[dict[str, Any]], notes: list[str]) -> list[dict[str, Any]]:
    """The row's prompt with the notes appended to its last user message (every chat template
    accepts it: the roles still alternate)."""
    messages = [dict(m) for m in prompt]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    summary = "\n".join(f"- {note}" for note in notes)
    messages[last]["content"] += f"\n\nResults so far:\n{summary}"
    return messages


async def agent(
    row: dict[str, Any], llm: Any, max_turns: int = 6, summarize_after: int = 2
) -> float:
    prompt = prompt_of(row)
    messages, notes, rounds, answer = list(prompt), [], 0, ""
    for _ in range(max_turns):
        reply = await llm.client.chat.completions.create(
            model=llm.model, messages=messages, tools=TOOLS
        )
        message = reply.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            notes.append(f"{call.function.name}({call.function.arguments}) = {result}")
        rounds += 1
        if rounds % summarize_after == 0:
            messages = _summarized(prompt, notes)
    return score(row, answer)
