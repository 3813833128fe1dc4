"""pydantic-ai: a capability that puts loopwarden's hints into the next model request
and ends the run when loopwarden terminates its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.pydantic_ai import LoopwardenCapability

    guard = Guard("kafka:9092").start()
    agent = Agent(model, capabilities=[LoopwardenCapability(guard)])

The session is matched on the run's conversation id (what pydantic-ai's spans carry as
`gen_ai.conversation.id`) and on the run's trace id. A termination raises
`SessionTerminated` out of the run before its next model request or tool call.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelRequest, UserPromptPart

from ._otel import follow_current_trace
from .guard import Guard, Watch
from .hint import hint_message


class LoopwardenCapability(AbstractCapability[Any]):
    """Follows each run's session through `guard`."""

    def __init__(self, guard: Guard):
        super().__init__()
        self.guard = guard
        self._watches: dict[str, Watch] = {}

    def _watch(self, ctx: Any) -> Watch:
        key = ctx.run_id or ""
        w = self._watches.get(key)
        if w is None:
            w = self._watches[key] = self.guard.watch(session_id=ctx.conversation_id)
        follow_current_trace(w)
        return w

    async def before_run(self, ctx: Any) -> None:
        self._watch(ctx)

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        w = self._watch(ctx)
        w.check()
        hint = w.take_hint()
        if hint:
            # Request-only (a new list, not the shared one): the model sees it this
            # step, once; the stored history is not rewritten.
            request_context.messages = [
                *request_context.messages,
                ModelRequest(parts=[UserPromptPart(content=hint_message(hint))]),
            ]
        return request_context

    async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
        self._watch(ctx).check()
        return args

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        # The watch ends with the run, however it ends (a run ended by
        # `SessionTerminated` skips `after_run`).
        try:
            return await handler()
        finally:
            w = self._watches.pop(ctx.run_id or "", None)
            if w is not None:
                w.close()
