"""OpenAI request and response shapes of the gateway: chat completions (plain and streamed
as server-sent events), the Responses API's input items and output, and the error body.

Only the fields SDKs read are produced; a request field the gateway cannot honour
(``n`` > 1, a non-function tool) is a 400 naming it rather than ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from agentloop.gateway.messages import GatewayInputError, tool_schemas
from agentloop.gateway.session import ChatCall, Completion

__all__ = [
    "chat_call",
    "chat_chunks",
    "chat_response",
    "error_body",
    "responses_call",
    "responses_events",
    "responses_response",
]


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error"):
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _number(body: dict[str, Any], key: str, kind: type, low: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayInputError(f"{key} must be a number, got {value!r}", key)
    if kind is int and int(value) != value:
        raise GatewayInputError(f"{key} must be an integer, got {value!r}", key)
    if low is not None and value < low:
        raise GatewayInputError(f"{key} must be >= {low}, got {value!r}", key)
    return kind(value)


def _common(body: dict[str, Any], max_keys: tuple[str, ...]) -> dict[str, Any]:
    n = _number(body, "n", int, 1)
    if n not in (None, 1):
        raise GatewayInputError(
            "n must be 1: a session samples one completion per call (GRPO's n is "
            "actor_rollout_ref.rollout.n sessions per prompt)",
            "n",
        )
    max_tokens = None
    for key in max_keys:
        max_tokens = _number(body, key, int, 1) if max_tokens is None else max_tokens
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop)
    ):
        raise GatewayInputError("stop must be a string or a list of up to 4 strings", "stop")
    return {
        "stop": stop or [],
        "temperature": _number(body, "temperature", float, 0),
        "top_p": _number(body, "top_p", float, 0),
        "max_tokens": max_tokens,
        "tool_choice": body.get("tool_choice"),
    }


def chat_call(body: Any) -> ChatCall:
    """A chat-completions body as a ``ChatCall`` (400 naming the field when malformed)."""
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object", None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayInputError("messages must be a non-empty list of messages", "messages")
    common = _common(body, ("max_completion_tokens", "max_tokens"))
    return ChatCall(messages=messages, tools=tool_schemas(body.get("tools")), **common)


def _usage(c: Completion) -> dict[str, int]:
    total = c.prompt_tokens + c.completion_tokens
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": total,
    }


def chat_response(c: Completion, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.tool_calls:
        message["tool_calls"] = c.tool_calls
    return {
        "id": c.call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}
        ],
        "usage": _usage(c),
    }


def chat_chunks(c: Completion, model: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The completion as stream chunks: role, content, each tool call whole, finish."""
    base = {"id": c.call_id, "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**base, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    if c.content:
        yield chunk({"content": c.content})
    for i, call in enumerate(c.tool_calls):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, c.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(c)}


# ---- the Responses API ------------------------------------------------------------------------
def _item_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in (
                "input_text",
                "output_text",
                "text",
            ):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "refusal":
                parts.append(str(part.get("refusal", "")))
            else:
                raise GatewayInputError(f"{where}: only text content is supported", where)
        return "".join(parts)
    raise GatewayInputError(f"{where}.content must be text or a list of text parts", where)


def _input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses ``instructions`` + ``input`` items as chat messages: consecutive
    ``function_call`` items become one assistant message's ``tool_calls``."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise GatewayInputError("input must be a string or a list of input items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise GatewayInputError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            text = _item_text(item.get("content"), where)
            messages.append({"role": item.get("role"), "content": text})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the same model turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _item_text(output, where)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # the sampled tokens hold the reasoning; nothing to render
        else:
            raise GatewayInputError(
                f"{where}.type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                f"{where}.type",
            )
    return messages


def responses_call(body: Any) -> ChatCall:
    """A Responses-API body as a ``ChatCall``."""
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object", None)
    if body.get("previous_response_id"):
        raise GatewayInputError(
            "previous_response_id is not supported: the gateway stores no responses; send the "
            "whole conversation as input (the Agents SDK does by default)",
            "previous_response_id",
        )
    tools = []
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise GatewayInputError(f"tools[{i}]: only function tools are supported", f"tools[{i}]")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    messages = _input_messages(body)
    if not messages:
        raise GatewayInputError("input has no message", "input")
    common = _common(body, ("max_output_tokens",))
    return ChatCall(messages=messages, tools=tool_schemas(tools), **common)


def _output_items(c: Completion) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if c.content:
        text = {"type": "output_text", "text": c.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in c.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call['id'][5:]}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def responses_response(c: Completion, model: str, status: str = "completed") -> dict[str, Any]:
    # A turn cut by max_output_tokens reports "completed" with incomplete_details set: the
    # Agents SDK raises on "incomplete", and the rollout's own budget makes such cuts routine.
    incomplete = c.finish_reason == "length" and not c.tool_calls
    return {
        "id": f"resp_{c.call_id[9:]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": model,
        "output": _output_items(c) if status == "completed" else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "usage": {
            "input_tokens": c.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.prompt_tokens + c.completion_tokens,
        },
    }


def responses_events(c: Completion, model: str) -> Iterator[dict[str, Any]]:
    """The response as Responses streaming events (each item added and done whole)."""
    start = responses_response(c, model, status="in_progress")
    start["usage"] = None
    yield {"type": "response.created", "response": start}
    yield {"type": "response.in_progress", "response": start}
    for index, item in enumerate(_output_items(c)):
        pending = {**item, "status": "in_progress"}
        if item["type"] == "message":
            pending["content"] = []
        event = {"output_index": index, "item": pending}
        yield {"type": "response.output_item.added", **event}
        if item["type"] == "message":
            part = item["content"][0]
            at = {"item_id": item["id"], "output_index": index, "content_index": 0}
            empty = {**part, "text": ""}
            yield {"type": "response.content_part.added", **at, "part": empty}
            yield {"type": "response.output_text.delta", **at, "delta": part["text"]}
            yield {"type": "response.output_text.done", **at, "text": part["text"]}
            yield {"type": "response.content_part.done", **at, "part": part}
        else:
            at = {"item_id": item["id"], "output_index": index}
            delta = item["arguments"]
            yield {"type": "response.function_call_arguments.delta", **at, "delta": delta}
            yield {"type": "response.function_call_arguments.done", **at, **item}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    done = responses_response(c, model)
    yield {"type": "response.completed", "response": done}


def sse(events: Iterator[dict[str, Any]], *, named: bool) -> Iterator[bytes]:
    """Server-sent events; ``named``: an ``event:`` line per event (the Responses API)."""
    for n, event in enumerate(events):
        if named:
            event["sequence_number"] = n
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
        else:
            yield f"data: {json.dumps(event)}\n\n".encode()
    if not named:
        yield b"data: [DONE]\n\n"
