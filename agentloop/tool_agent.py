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

With ``multi_turn.max_context_tokens`` set, a turn that would push the next model call past
the context budget compacts the history instead (``agentloop.compaction``): the sample goes on
in a new segment whose prompt is the compacted history, the full one closes as a training
sample of its own (``AgentLoopOutput.segments``, weighted as a gateway session's segments);
a history no compaction makes fit stops the sample (``context_full``). With
``compaction.mode=summarize`` the policy writes that history's summary as the full segment's
last model turn (it counts as a model turn, and toward ``max_assistant_turns``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.base import (
    AgentLoopBase,
    AgentLoopContext,
    AgentLoopOutput,
    PromptTooLongError,
    register,
)
from agentloop.compaction import (
    CONTEXT_FULL,
    Compaction,
    context_limit,
    drop_tool_outputs,
    summary_text,
    with_user_text,
)
from agentloop.interactions import InteractionError, InteractionSession, row_interaction
from agentloop.parsers import ParsedTurn, ToolCall, check_calls, limit_calls
from agentloop.records import SampleRecord
from agentloop.tokens import Trajectory
from agentloop.tools.session import ToolSession
from servers.types import SamplingParams, TokenOutput

__all__ = ["ToolAgentLoop", "reached"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Segment:
    """One segment of a compacted sample: its trajectory and where its turns, calls and
    tool errors start in the sample's counts."""

    traj: Trajectory
    turn: int = 0
    """Model turns of the sample before this segment."""
    user_turn: int = 0
    """Tool/user turns of the sample before this segment (those in its prompt included)."""
    call: int = 0
    error: int = 0
    history: int = 0
    """Messages of its prompt after the row's prompt (the compacted history)."""
    compaction: Compaction | None = None
    """The compaction that opened it (None: the first segment)."""
    branch_point: int | None = None


@dataclass(frozen=True, slots=True)
class _Pending:
    """The tool or user turn about to be appended: the last ``new`` messages of the history,
    their template delta, and the end token of the model turn they answer."""

    delta: list[int]
    new: int
    sampled_end: int


SUMMARY_TEMPLATE_SLACK = 16
"""Tokens a chat template may add around a message of the summary request (its header and
end): reserved with the request's own tokens, as the exact delta is known only when made."""


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
        self.summary_room = 0
        """Tokens every model call leaves free for a summary (``compaction.mode=summarize``)."""
        policy = self.multi_turn.compaction
        if self.multi_turn.max_context_tokens is not None and policy.mode == "summarize":
            # the summary, its request, and a placeholder for each output of the last turn
            # (when they are too long to go in whole), each message with its template
            request = len(self.tokenizer.encode(policy.summary_prompt, add_special_tokens=False))
            hidden = len(self.tokenizer.encode(policy.placeholder, add_special_tokens=False))
            outputs = self.multi_turn.max_parallel_calls
            self.summary_room = policy.summary_tokens + request + SUMMARY_TEMPLATE_SLACK
            self.summary_room += outputs * (hidden + SUMMARY_TEMPLATE_SLACK)

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
        compacts = self.multi_turn.max_context_tokens is not None
        if compacts:  # the room a turn is given is what the context check reserves
            sampling_params = self._turn_capped(sampling_params)
        segments = [_Segment(traj)]
        # a summary turn samples with these params and replaces the history after this prompt
        self._params, self._row_prompt = sampling_params, list(raw_prompt)
        context_full = ""
        assistant_turns = user_turns = 0
        finish_reasons: list[str] = []
        turn_ends: list[int] = []  # each model turn's last response index (per-turn rewards)
        turn_scores: list[float] = []  # the user's score of each model turn (0: none)
        turn_states: list[str | None] = []  # each model turn's state as the user named it
        error: str | None = None
        try:
            if user is not None:
                await user.start()
            while True:
                if compacts and assistant_turns == 0 and not self._fits(traj, ()):
                    stop = CONTEXT_FULL
                    context_full = self._too_long(len(traj.prompt_ids), traj)
                    break
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
                    state = reply.metadata.get("state_key")
                    if state is not None and not reply.terminate:  # the next turn's state
                        turn_states += [None] * (assistant_turns - len(turn_states))
                        turn_states.append(str(state))
                    if reply.terminate:
                        stop = "interaction_done"
                        break
                    user_message = {"role": "user", "content": reply.text}
                    delta = await self.encode_delta(
                        messages, [user_message], schemas, head=head, sampled_end=out.token_ids[-1]
                    )
                    messages.append(user_message)
                    pending = _Pending(delta, 1, out.token_ids[-1])
                    log = (finish_reasons, turn_ends, user_turns + 1)
                    messages, traj, ended, context_full = await self._next_turn(
                        messages, traj, pending, head, schemas, segments, session, log
                    )
                    assistant_turns = len(finish_reasons)  # with a summary turn, if one
                    if ended is not None:
                        stop = ended
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
                pending = _Pending(delta, len(tool_messages), out.token_ids[-1])
                log = (finish_reasons, turn_ends, user_turns + 1)
                messages, traj, ended, context_full = await self._next_turn(
                    messages, traj, pending, head, schemas, segments, session, log
                )
                assistant_turns = len(finish_reasons)
                if ended is not None:
                    stop = ended
                    break
                user_turns += 1
        except InteractionError as exc:
            stop, error = "interaction_error", str(exc)
        finally:
            tool_rewards = await session.release()
            if user is not None:
                await user.close(error)
        if len(segments) == 1:
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
                    turn_states=turn_states,
                    interaction=None if user is None else user.record,
                ),
            )
        else:
            end = _Segment(traj, assistant_turns, user_turns, len(session.calls))
            end.error = len(session.error_kinds)
            out = self._segment_outputs(
                session,
                segments,
                end,
                stop,
                finish_reasons=finish_reasons,
                turn_ends=turn_ends,
                turn_scores=turn_scores,
                turn_states=turn_states,
                tool_rewards=tool_rewards,
                interaction=None if user is None else user.record,
            )
        if compacts:
            out.metrics["compactions"] = float(len(segments) - 1)
        if context_full:
            final = out.segments[-1] if out.segments else out
            final.extra["context_full"] = context_full
        if error is not None:  # the environment failed, not the model: left out of the loss
            logger.warning("%s (sample left out: weight 0)", error)
            for sample in (out, *out.segments):
                sample.record.weight = 0.0
            out.extra["interaction_error"] = error
        return out

    # ---- context compaction (multi_turn.max_context_tokens) --------------------------------
    async def _next_turn(
        self,
        messages: list[dict[str, Any]],
        traj: Trajectory,
        pending: _Pending,
        head: int,
        schemas: list[dict[str, Any]],
        segments: list[_Segment],
        session: ToolSession,
        log: tuple[list[str], list[int], int],
    ) -> tuple[list[dict[str, Any]], Trajectory, str | None, str]:
        """Append the pending turn (the tool or user messages just added to ``messages``) to
        the segment, or, when the next call would pass the context budget, compact the
        history into a new segment: (messages, trajectory, the stop reason or None to go on,
        why the context is full). ``log``: the sample's finish reasons and turn ends (a
        summary turn is added to them) and its tool/user turns before the new segment."""
        if self.multi_turn.max_context_tokens is not None and not self._fits(traj, pending.delta):
            compacted = await self._compact(
                messages, traj, pending, head, schemas, segments, session, log
            )
            if isinstance(compacted, str):
                return messages, traj, CONTEXT_FULL, compacted
            session.agent_data.messages = compacted
            return compacted, segments[-1].traj, None, ""
        if not traj.add_template(pending.delta):
            return messages, traj, "length", ""
        return messages, traj, None, ""

    def _turn_capped(self, params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens`` at most ``max_tokens_per_turn``: a turn never
        takes more room than the context check reserved for it."""
        reserve = self.multi_turn.max_tokens_per_turn
        assert reserve is not None  # MultiTurnConfig requires it with max_context_tokens
        if params.max_tokens is not None and params.max_tokens <= reserve:
            return params
        return dataclasses.replace(params, max_tokens=reserve)

    def _limit(self, traj: Trajectory) -> int:
        budget = self.multi_turn.max_context_tokens
        assert budget is not None
        return context_limit(budget, self.config.context_length, len(traj.prompt_ids), traj.budget)

    def _fits(self, traj: Trajectory, delta: Sequence[int]) -> bool:
        """The next model call, after ``delta``, fits the segment's context limit with
        ``max_tokens_per_turn`` of room, and room for a summary after it with
        ``compaction.mode=summarize`` (lengths only: nothing is tokenized)."""
        reserve = (self.multi_turn.max_tokens_per_turn or 0) + self.summary_room
        used = len(traj.prompt_ids) + len(traj) + len(delta)
        return used + reserve <= self._limit(traj)

    def _too_long(self, prompt: int, traj: Trajectory) -> str:
        summary = ""
        if self.summary_room:
            summary = (
                f" + {self.summary_room} for a summary (multi_turn.compaction.summary_tokens="
                f"{self.multi_turn.compaction.summary_tokens} and its request)"
            )
        return (
            f"a prompt of {prompt} tokens + multi_turn.max_tokens_per_turn="
            f"{self.multi_turn.max_tokens_per_turn}{summary} does not fit the context limit "
            f"{self._limit(traj)} (multi_turn.max_context_tokens="
            f"{self.multi_turn.max_context_tokens})"
        )

    async def _compact(
        self,
        messages: list[dict[str, Any]],
        traj: Trajectory,
        pending: _Pending,
        head: int,
        schemas: list[dict[str, Any]],
        segments: list[_Segment],
        session: ToolSession,
        log: tuple[list[str], list[int], int],
    ) -> list[dict[str, Any]] | str:
        """Compact the history (``messages``, the pending turn included) and open the next
        segment on its prompt (one render), appended to ``segments``; returns the compacted
        messages, or why no compaction fits (the stop's explanation)."""
        start_ns = time.time_ns()
        policy = self.multi_turn.compaction
        before = len(traj.prompt_ids) + len(traj) + len(pending.delta)
        if policy.mode == "summarize":
            summarized = await self._summarize(
                messages, traj, pending, head, schemas, session.session_id, log
            )
            if isinstance(summarized, str):
                return summarized
            compacted, summary, kept = summarized
            dropped = 0
        else:
            compacted, dropped = drop_tool_outputs(
                messages, head=head, keep=policy.keep, placeholder=policy.placeholder
            )
            summary, kept = None, False
            if not dropped:
                return (
                    f"the history ({before} tokens with the last turn) has no tool output left "
                    f"to drop (multi_turn.compaction.keep={policy.keep}) and does not fit "
                    f"multi_turn.max_context_tokens={self.multi_turn.max_context_tokens}"
                )
        # the first message the compaction changed (a summary may leave the history shorter)
        changed = zip(messages, compacted, strict=False)
        branch_point = next((i for i, (a, b) in enumerate(changed) if a is not b), head)
        try:
            prompt = await self.encode_prompt(compacted, schemas)
        except PromptTooLongError as exc:
            return f"the compacted history does not fit: {exc}"
        fresh = Trajectory(prompt, self.config.response_length)
        if not self._fits(fresh, ()):
            return f"after compaction, {self._too_long(len(prompt), fresh)}"
        event = Compaction(
            segment=len(segments),
            mode=policy.mode,
            dropped=dropped,
            messages=len(compacted),
            before_tokens=before,
            after_tokens=len(prompt),
            summary_tokens=0 if summary is None else len(summary.token_ids),
            kept_turn=kept,
        )
        segments.append(
            _Segment(
                fresh,
                turn=len(log[0]),
                user_turn=log[2],
                call=len(session.calls),
                error=len(session.error_kinds),
                history=len(compacted) - head,
                compaction=event,
                branch_point=branch_point,
            )
        )
        if self.trace is not None:
            self.trace.compaction(start_ns, event)
        logger.debug("sample %s: %s", session.session_id, event.reason)
        return compacted

    async def _summarize(
        self,
        messages: list[dict[str, Any]],
        traj: Trajectory,
        pending: _Pending,
        head: int,
        schemas: list[dict[str, Any]],
        session_id: str,
        log: tuple[list[str], list[int], int],
    ) -> tuple[list[dict[str, Any]], TokenOutput, bool] | str:
        """The policy's summary of the history as the full segment's last turn: the pending
        turn and the summary request appended as one delta (mask 0), the summary sampled
        after it (mask 1, a model turn added to ``log``). A pending turn too long to leave
        room for the summary is summarized with its outputs as the placeholder, and then
        follows the summary whole. Returns the next segment's messages, the summary turn and
        whether the pending turn was kept whole; or why no summary fits."""
        policy = self.multi_turn.compaction
        earlier, new = messages[: -pending.new], messages[-pending.new :]
        used = len(traj.prompt_ids) + len(traj)
        room = self._limit(traj) - used - policy.summary_tokens
        hidden = [{**m, "content": policy.placeholder} for m in new]
        for shown in (new, hidden):  # the outputs whole, else hidden (then kept after it)
            request = await self.encode_delta(
                earlier,
                with_user_text(shown, policy.summary_prompt),
                schemas,
                head=head,
                sampled_end=pending.sampled_end,
            )
            if len(request) <= room:
                break
        else:
            return (
                f"the history ({used} tokens) leaves {room} tokens for the summary request "
                f"of {len(request)} after multi_turn.compaction.summary_tokens="
                f"{policy.summary_tokens} (multi_turn.max_context_tokens="
                f"{self.multi_turn.max_context_tokens})"
            )
        kept = shown is hidden
        if not traj.add_template(request):
            return f"the summary request ({len(request)} tokens) does not fit the response budget"
        params = dataclasses.replace(self._params, max_tokens=policy.summary_tokens)
        out = await self.generate(session_id, traj, params)
        log[0].append(out.finish_reason)
        log[1].append(len(traj) - 1)
        closed = self.turn_closed(out)
        ids = out.token_ids[:-1] if closed else out.token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        summary = summary_text(self.parser.parse(text).content)
        # the row's prompt as it was: a new summary replaces an earlier one
        compacted = with_user_text(self._row_prompt, policy.summary_header + summary)
        if kept:
            compacted += messages[-pending.new - 1 :]  # the model's last turn and its outputs
        return compacted, out, kept

    def _segment_outputs(
        self,
        session: ToolSession,
        segments: list[_Segment],
        end: _Segment,
        stop: str,
        **fields: Any,
    ) -> AgentLoopOutput:
        """The first segment's output, the others in its ``segments``; ``end``: the sample's
        counts at its end; ``fields``: per-turn lists and what every record shares."""
        weight = self.config.gateway.segment_weight_of(len(segments))
        interaction = fields.pop("interaction")
        outs = []
        for i, (seg, nxt) in enumerate(zip(segments, [*segments[1:], end], strict=True)):
            last = nxt is end
            record = _segment_record(
                session,
                seg,
                nxt,
                index=i,
                weight=weight,
                stop_reason=stop if last else "compacted",
                interaction=interaction if last else None,
                **fields,
            )
            turns = record.assistant_turns + record.user_turns
            outs.append(self.output(seg.traj, num_turns=1 + seg.history + turns, record=record))
        first, first.segments = outs[0], outs[1:]
        return first

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


def _moved_turns(nxt: _Segment) -> int:
    """Tool/user turns of the sample counted before segment ``nxt`` that are in its prompt
    and not in the tokens of the segment before it: the turn that filled a segment, except
    when the policy summarized it (then it is in the full segment's tokens)."""
    compaction = nxt.compaction
    return int(compaction is not None and compaction.mode != "summarize")


def _segment_record(
    session: ToolSession,
    seg: _Segment,
    nxt: _Segment,
    *,
    finish_reasons: list[str],
    turn_ends: list[int],
    turn_scores: list[float],
    turn_states: list[str | None],
    index: int,
    **fields: Any,
) -> SampleRecord:
    """The record of segment ``seg`` of a compacted sample (``nxt``: where the next one
    starts): its own turns, calls (their ``turn`` counted from its first model turn) and
    tool errors; the sample's tool rewards; the compaction that opened it."""
    first, last = seg.turn, nxt.turn
    calls = [
        dataclasses.replace(c, turn=c.turn - first) for c in session.calls[seg.call : nxt.call]
    ]
    kinds = session.error_kinds[seg.error : nxt.error]
    scores = turn_scores[first:last]
    return SampleRecord(
        finish_reasons=finish_reasons[first:last],
        turn_ends=turn_ends[first:last],
        assistant_turns=last - first,
        user_turns=nxt.user_turn - seg.user_turn - _moved_turns(nxt),
        tool_calls=sum(c.ok for c in calls),
        tool_errors=len(kinds),
        tool_error_kinds=list(kinds),
        calls=calls,
        turn_scores=scores if any(scores) else [],
        turn_states=turn_states[first:last],
        session_id=session.session_id,
        segment=index,
        branch_reason=None if seg.compaction is None else seg.compaction.reason,
        branch_point=seg.branch_point,
        **fields,
    )
