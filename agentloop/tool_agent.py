"""``tool_agent``: generate -> parse tool calls -> run them concurrently -> append the tool
messages as a template delta (mask 0) -> generate again.

With an interaction (simulated user, ``agentloop.interactions``) configured for the row, a
turn without a tool call is answered by the user instead: its text is appended as a user
message delta (mask 0) and the model goes on, until the user ends the episode
(``interaction_done``). Each user turn score is the score of the model turn it answered
(``SampleRecord.turn_scores``); an interaction that fails fails only this sample
(``interaction_error``: weight 0, the error recorded).

Stops when a turn has no tool call (and no user answers it), at
``max_assistant_turns``/``max_user_turns``, when the model's turn did not end with its
end-of-turn token (length, abort, another stop token), or when the next delta would not leave
room in the response budget. Malformed calls, unknown tools, schema failures, tool exceptions
and timeouts all come back as tool messages.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentloop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, register
from agentloop.interactions import InteractionError, InteractionSession, row_interaction
from agentloop.parsers import ParsedTurn, ToolCall, check_calls, limit_calls
from agentloop.tokens import Trajectory
from agentloop.tools.session import ToolSession

__all__ = ["ToolAgentLoop", "reached"]

logger = logging.getLogger(__name__)


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    offers_tools = True
    talks_to_users = True

    def __init__(self, context: AgentLoopContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.multi_turn = self.config.multi_turn
        self.schemas = {name: tool.tool_schema for name, tool in context.tools.items()}
        self.parser = self.chat_format.new_parser(
            repair=self.multi_turn.repair_tool_calls, schemas=self.schemas
        )

    async def run(
        self,
        sampling_params: dict[str, Any],
        *,
        raw_prompt: list[dict[str, Any]],
        tools_kwargs: dict[str, Any] | None = None,
        **row: Any,
    ) -> AgentLoopOutput:
        session = self.tool_session(tools_kwargs)
        user = self._interaction(session.session_id, row)
        schemas = list(self.schemas.values())
        messages = list(raw_prompt)
        session.agent_data.messages = messages  # verl tools read the chat so far
        head = len(messages)
        traj = Trajectory(await self.encode_prompt(messages, schemas), self.config.response_length)
        sampling_params = self.with_end_tokens(sampling_params)
        assistant_turns = user_turns = 0
        finish_reasons: list[str] = []
        turn_ends: list[int] = []  # each model turn's last response index (per-turn rewards)
        turn_scores: list[float] = []  # the user's score of each model turn (0: none)
        error: str | None = None
        try:
            if user is not None:
                await user.start()
            while True:
                out = await self.generate(session.session_id, traj, sampling_params)
                assistant_turns += 1
                finish_reasons.append(out.finish_reason)
                turn_ends.append(len(traj) - 1)
                if not self.turn_closed(out):
                    stop = out.finish_reason if out.finish_reason != "stop" else "stop_token"
                    break
                text = self.tokenizer.decode(out.token_ids[:-1], skip_special_tokens=False)
                parse_ns = time.time_ns()
                parsed = check_calls(self.parser.parse(text), self.schemas)
                limit_calls(parsed, self.multi_turn.max_parallel_calls)
                if self.trace is not None:
                    self.trace.parse(parse_ns, text, parsed.calls, parsed.errors)
                no_call = not parsed.items or out.token_ids[-1] not in self.ends.call_ids
                if no_call and user is None:
                    stop = "no_tool_call"  # also a turn that ended the conversation
                    break
                if reached(self.multi_turn.max_assistant_turns, assistant_turns):
                    stop = "max_assistant_turns"
                    break
                if reached(self.multi_turn.max_user_turns, user_turns):
                    stop = "max_user_turns"
                    break
                if no_call:
                    assert user is not None
                    messages.append(self.chat_format.assistant_message(text, parsed))
                    reply = await self._user_turn(user, messages)
                    turn_scores += [0.0] * (assistant_turns - 1 - len(turn_scores))
                    turn_scores.append(reply.score or 0.0)
                    if reply.terminate:
                        stop = "interaction_done"
                        break
                    user_message = {"role": "user", "content": reply.text}
                    delta = await self.encode_delta(
                        messages, [user_message], schemas, head=head, sampled_end=out.token_ids[-1]
                    )
                    messages.append(user_message)
                    if not traj.add_template(delta):
                        stop = "length"
                        break
                    user_turns += 1
                    continue
                results = await self._call_tools(session, parsed, assistant_turns - 1)
                fmt = self.chat_format
                assistant = fmt.assistant_message(text, parsed)
                tool_messages = [
                    fmt.tool_message(content, item, i, assistant)
                    for i, (content, item) in enumerate(zip(results, parsed.items, strict=True))
                ]
                messages.append(assistant)
                delta = await self.encode_delta(
                    messages, tool_messages, schemas, head=head, sampled_end=out.token_ids[-1]
                )
                messages.extend(tool_messages)
                if not traj.add_template(delta):
                    stop = "length"
                    break
                user_turns += 1
        except InteractionError as exc:
            stop, error = "interaction_error", str(exc)
        finally:
            tool_rewards = await session.release()
            if user is not None:
                await user.close(error)
        out = self.output(
            traj,
            num_turns=1 + assistant_turns + user_turns,
            record=session.sample_record(
                finish_reasons=finish_reasons,
                turn_ends=turn_ends,
                stop_reason=stop,
                assistant_turns=assistant_turns,
                user_turns=user_turns,
                tool_rewards=tool_rewards,
                turn_scores=turn_scores if any(turn_scores) else [],
                interaction=None if user is None else user.record,
            ),
        )
        if error is not None:  # the environment failed, not the model: left out of the loss
            logger.warning("%s (sample left out: weight 0)", error)
            out.record.weight = 0.0
            out.extra["interaction_error"] = error
        return out

    async def _user_turn(self, user: InteractionSession, messages: list[dict[str, Any]]) -> Any:
        """The simulated user's reply (traced as a ``user:<name>`` span)."""
        start_ns = time.time_ns()
        try:
            reply = await user.respond(messages)
        except InteractionError as exc:
            if self.trace is not None:
                self.trace.user(start_ns, user.name, None, str(exc))
            raise
        if self.trace is not None:
            self.trace.user(start_ns, user.name, reply)
        return reply

    def _interaction(self, session_id: str, row: dict[str, Any]) -> InteractionSession | None:
        """The row's simulated user, when interactions are configured."""
        interactions = self.context.interactions
        if not interactions:
            return None
        name, kwargs = row_interaction(row, sorted(interactions))
        return InteractionSession(
            interactions[name],
            name,
            kwargs,
            session_id,
            timeout_s=self.multi_turn.interaction_timeout_s,
        )

    async def _call_tools(self, session: ToolSession, parsed: ParsedTurn, turn: int) -> list[str]:
        """The answer text for every item of model turn ``turn``, in order; calls run
        concurrently, errors answer in their place."""
        for error in parsed.errors:
            session.record_error(error.kind)
        start = time.perf_counter()
        outcomes = iter(await session.execute(parsed.calls, turn))
        self.metrics["tool_s"] += time.perf_counter() - start
        return [
            next(outcomes).text if isinstance(item, ToolCall) else item.to_message()["content"]
            for item in parsed.items
        ]


def reached(limit: int | None, count: int) -> bool:
    """A turn limit (None: no limit) is reached."""
    return limit is not None and count >= limit
