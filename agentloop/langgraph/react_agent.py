"""``react_agent``: a LangGraph ReAct graph (agent node + tools node around LangGraph's
``ToolNode``) whose model is the token chat model, so the sample's trajectory is exact.

Subclasses supply LangChain tools (``langchain_tools``) on top of the rollout's configured
tools (``multi_turn.tool_config_path``, run through the worker's ``ToolRunner`` with the row's
``tools_kwargs``), and may supply their own graph (``build_graph``). The output has the same
fields as ``tool_agent``'s: a two-call episode gives the same ids, mask and ``record``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool as LangChainTool
from langchain_core.tools import StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import GraphBubbleUp
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from agentloop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, register
from agentloop.langgraph.chat_model import (
    AgentLoopChatModel,
    TrajectoryLimitError,
    trajectory_of,
    turn_limit,
)
from agentloop.langgraph.messages import from_chat_dicts, text_of
from agentloop.parsers import ToolCall
from agentloop.tokens import Trajectory
from agentloop.tools.runner import CallOutcome
from agentloop.tools.session import ToolSession

__all__ = ["ReactAgentLoop", "build_react_graph"]

Node = Callable[..., Awaitable[dict[str, Any]]]


def build_react_graph(model: Runnable, tools_node: Any, route: Callable[..., str]) -> Any:
    """agent -> (route) -> tools -> agent ... -> END; works with any chat model (the token
    chat model for training, ``ChatOpenAI`` against the HTTP front for evaluation)."""

    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools_node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


@register("react_agent")
class ReactAgentLoop(AgentLoopBase):
    offers_tools = True

    parser: Any = None
    """Tool-call parser of the chat model (None: ``multi_turn.format``)."""
    recursion_limit: int | None = None
    """LangGraph steps per sample (None: 4 x response_length + 16, never the binding limit:
    every model turn samples at least one token)."""

    def __init__(self, context: AgentLoopContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.kwargs = kwargs
        self.multi_turn = self.config.multi_turn
        self.chat_model: AgentLoopChatModel | None = None
        self.messages: list[BaseMessage] = []
        """The graph's final messages (empty when a budget ended the graph)."""
        self.session: ToolSession | None = None
        self._turn = 0

    # ---- what subclasses supply ---------------------------------------------------------
    def langchain_tools(self) -> list[LangChainTool]:
        """LangChain tools of this loop, besides the rollout's configured tools."""
        return []

    def build_graph(self, model: Runnable, tools_node: Node) -> Any:
        """The compiled graph of one sample (state key ``messages``). ``model`` is the token
        chat model with the tools bound; ``tools_node`` answers the last AIMessage's calls,
        invalid ones included, in order."""
        return build_react_graph(model, tools_node, self.route)

    def route(self, state: MessagesState) -> str:
        """``tools`` when the last turn made calls and no turn limit is reached, else END."""
        message = state["messages"][-1]
        if not isinstance(message, AIMessage):
            return END
        if not (message.tool_calls or message.invalid_tool_calls):
            return END
        traj = trajectory_of(message)
        if traj is not None and turn_limit(traj, self.multi_turn) is not None:
            return END
        return "tools"

    # ---- one sample -----------------------------------------------------------------------
    async def run(
        self,
        sampling_params: dict[str, Any],
        *,
        raw_prompt: list[dict[str, Any]],
        tools_kwargs: dict[str, Any] | None = None,
        **row: Any,
    ) -> AgentLoopOutput:
        self.session = self.tool_session(tools_kwargs)
        self.row = row
        own = self.langchain_tools()
        clash = sorted({t.name for t in own} & set(self.context.tools))
        if clash:
            raise ValueError(
                f"{type(self).__name__}.langchain_tools() and the configured tools both "
                f"define {', '.join(clash)}: rename one"
            )
        schemas = [t.tool_schema for t in self.context.tools.values()]
        schemas += [convert_to_openai_tool(t) for t in own]
        tools = [self._configured_tool(n) for n in self.context.tools] + own
        self.chat_model = AgentLoopChatModel.for_loop(
            self, sampling_params, session_id=self.session.session_id, parser=self.parser
        )
        model = self.chat_model.bind_tools(schemas) if schemas else self.chat_model
        graph = self.build_graph(model, self.tools_node(tools))
        limit = self.recursion_limit or 4 * self.config.response_length + 16
        stop: str | None = None
        try:
            final = await graph.ainvoke(
                {"messages": from_chat_dicts(raw_prompt)},
                config={"recursion_limit": limit},
            )
            self.messages = final["messages"]
            last = next((m for m in reversed(self.messages) if trajectory_of(m)), None)
            state = trajectory_of(last) if last is not None else None
        except TrajectoryLimitError as exc:
            stop, state = exc.reason, self.chat_model.last_trajectory
        finally:
            tool_rewards = await self.session.release()
        if state is None:
            raise RuntimeError(
                f"the {type(self).__name__} graph ended before the model sampled a turn"
            )
        if stop is None:
            stop = state["stop"] or turn_limit(state, self.multi_turn)
            stop = stop or ("no_tool_call" if not state["call_order"] else "graph_end")
        traj = Trajectory.restore(
            state["prompt_ids"],
            self.config.response_length,
            state["response_ids"],
            state["response_mask"],
            state["response_log_probs"],
            state.get("response_versions"),
        )
        return self.output(
            traj,
            num_turns=1 + state["assistant_turns"] + state["user_turns"],
            record=self.session.sample_record(
                finish_reasons=state["finish_reasons"],
                turn_ends=state["turn_ends"],
                stop_reason=stop,
                assistant_turns=state["assistant_turns"],
                user_turns=state["user_turns"],
                tool_rewards=tool_rewards,
            ),
        )

    # ---- tools ------------------------------------------------------------------------------
    def tools_node(self, tools: Sequence[LangChainTool]) -> Node:
        """A graph node: runs the last AIMessage's valid calls through a ``ToolNode`` (timed
        out, errors as messages, results truncated, every call recorded) and answers its
        invalid calls with their errors; tool messages in the order the calls appeared."""
        tool_node = ToolNode(list(tools), handle_tool_errors=False, awrap_tool_call=self._wrap)

        async def run_tools(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            message = state["messages"][-1]
            assert isinstance(message, AIMessage), "the tools node follows a model turn"
            traj = trajectory_of(message) or {}
            self._turn = traj.get("assistant_turns", 1) - 1
            replies: list[ToolMessage] = []
            if message.tool_calls:
                only_valid = AIMessage(content="", tool_calls=message.tool_calls)
                start = time.perf_counter()
                out = await tool_node.ainvoke({"messages": [only_valid]}, config)
                self.metrics["tool_s"] += time.perf_counter() - start
                replies.extend(out["messages"])
            kinds = traj.get("error_kinds", {})
            for call in message.invalid_tool_calls:
                assert self.session is not None
                self.session.record_error(kinds.get(call["id"], "bad_json"))
                replies.append(
                    ToolMessage(
                        content=f"Error: {call['error']}",
                        tool_call_id=call["id"],
                        name=call["name"] or "",
                        status="error",
                    )
                )
            order = {cid: i for i, cid in enumerate(traj.get("call_order", []))}
            replies.sort(key=lambda m: order.get(m.tool_call_id, len(order)))
            return {"messages": replies}

        return run_tools

    def _configured_tool(self, name: str) -> StructuredTool:
        """A configured tool as a LangChain tool running on this sample's instance."""
        function = self.context.tools[name].tool_schema["function"]

        async def call(**arguments: Any) -> tuple[str, dict[str, Any]]:
            assert self.session is not None
            (outcome,) = await self.session.execute([ToolCall(name, arguments, "")], self._turn)
            # plain data, so LangGraph checkpointers can serialize the message
            return outcome.text, {"ok": outcome.ok, "error_kind": outcome.error_kind}

        return StructuredTool(
            name=name,
            description=function.get("description", ""),
            args_schema=function.get("parameters") or {"type": "object", "properties": {}},
            coroutine=call,
            response_format="content_and_artifact",
        )

    async def _wrap(self, request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        """Around every ToolNode call: configured tools record themselves (ToolRunner); a
        LangChain tool gets the rollout's timeout, its exceptions become error messages in
        the runner's words, its result is truncated, and the call is recorded here."""
        assert self.session is not None
        name, args, call_id = (request.tool_call[k] for k in ("name", "args", "id"))
        if name in self.context.tools:
            message = await execute(request)
            if isinstance(message.artifact, dict) and message.artifact.get("ok") is False:
                message.status = "error"
            return message
        timeout = self.multi_turn.tool_timeout_s
        start, start_ns = time.perf_counter(), time.time_ns()
        kind = None
        try:
            message = await asyncio.wait_for(execute(request), timeout)
        except TimeoutError:
            kind, error = "tool_timeout", f"Error: tool {name!r} timed out after {timeout:g} s"
        except GraphBubbleUp:  # LangGraph control flow (interrupts), not a failure
            raise
        except Exception as exc:  # a tool bug must not end the rollout (same text as runner)
            kind, error = "tool_failed", f"Error: tool {name!r} failed: {type(exc).__name__}: {exc}"
        if kind is not None:
            message = ToolMessage(content=error, tool_call_id=call_id, name=name, status="error")
        text = text_of(message.content) if isinstance(message, ToolMessage) else str(message)
        ok = kind is None and getattr(message, "status", "success") != "error"
        if not ok:
            kind = kind or "tool_failed"
        outcome = CallOutcome(name, text, ok, time.perf_counter() - start, error_kind=kind)
        self.session.record(ToolCall(name, dict(args), ""), outcome, self._turn, start_ns)
        if isinstance(message, ToolMessage):
            message.content = self.session.truncate(text)
        return message
