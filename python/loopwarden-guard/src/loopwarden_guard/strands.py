"""Strands Agents: hooks that put loopwarden's hints into the next model call and cancel
the invocation when loopwarden terminates its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.strands import LoopwardenHooks

    guard = Guard("kafka:9092").start()
    agent = Agent(model=model, tools=tools, hooks=[LoopwardenHooks(guard)])

The session is matched on the invocation's trace id (Strands' spans fall back to it for
the session) and on `session.id` when the agent's `trace_attributes` set one. A
termination cancels the invocation the way `Agent.cancel()` does (its result's
`stop_reason` is `cancelled`): at the next cancellation-safe point, and no tool the
model asked for afterwards runs. A termination that lands after the loop's last
cancellation check before a model call stops that call before it is sent: through the
model-call middleware where Strands has one (`Agent.add_middleware`), as
a cancellation; on older Strands by denying the call from the hook, which Strands
reports as `end_turn` with the stop message as the final message.
"""

from __future__ import annotations

import weakref
from typing import Any, AsyncIterator

from strands.hooks import (
    AfterInvocationEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookProvider,
    HookRegistry,
)

from ._otel import follow_current_trace
from .guard import Guard, Watch
from .hint import hint_message, stop_message


class LoopwardenHooks(HookProvider):
    """Follows each invocation's session through `guard`."""

    def __init__(self, guard: Guard):
        self.guard = guard
        self._watches: dict[int, Watch] = {}
        # The agents this adapter's model-call middleware is registered on (once each).
        self._guarded_calls: weakref.WeakSet[Any] = weakref.WeakSet()

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._begin)
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterInvocationEvent, self._end)

    def _watch(self, agent: Any) -> Watch:
        w = self._watches.get(id(agent))
        if w is None:
            session = (getattr(agent, "trace_attributes", None) or {}).get("session.id")
            w = self._watches[id(agent)] = self.guard.watch(session_id=session)
            w.on_terminate(lambda f: agent.cancel(message=stop_message(f)))
        follow_current_trace(w)
        return w

    def _begin(self, event: BeforeInvocationEvent) -> None:
        self._watch(event.agent)
        self._guard_model_calls(event.agent)

    def _guard_model_calls(self, agent: Any) -> None:
        """Registers, once per agent, the model-call middleware that answers a call of a
        terminated session with a cancellation instead of sending it: the termination's
        `agent.cancel()` reaches the loop only at its checks, and one that lands after
        the last check before a model call would otherwise let the call go out (it is
        cancelled only at its first streamed chunk)."""
        add_middleware = getattr(agent, "add_middleware", None)
        if add_middleware is None or agent in self._guarded_calls:
            return
        from strands.middleware import InvokeModelStage, ModelStopReason

        watches = self._watches

        async def stop_terminated(context: Any, next_fn: Any) -> AsyncIterator[Any]:
            w = watches.get(id(context.agent))
            if w is not None and w.terminated is not None:
                message = {"role": "assistant", "content": [{"text": stop_message(w.terminated)}]}
                no_usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
                yield ModelStopReason(
                    stop_reason="cancelled", message=message, usage=no_usage, metrics={"latencyMs": 0}
                )
                return
            async for event in next_fn(context):
                yield event

        add_middleware(InvokeModelStage, stop_terminated)
        self._guarded_calls.add(agent)

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        w = self._watch(event.agent)
        if w.terminated is not None:
            # Where the middleware is registered it cancels the call; on older Strands
            # the hook denies it (no call all the same, reported as `end_turn`).
            if event.agent not in self._guarded_calls:
                event.cancel = stop_message(w.terminated)
            return
        hint = w.take_hint()
        if hint:
            # Into the message the model is about to read (the last user turn: the tool
            # results), so the conversation keeps alternating roles.
            messages = event.agent.messages
            text = {"text": hint_message(hint)}
            if messages and messages[-1].get("role") == "user":
                messages[-1]["content"].append(text)
            else:
                messages.append({"role": "user", "content": [text]})

    def _before_tool(self, event: BeforeToolCallEvent) -> None:
        w = self._watch(event.agent)
        if w.terminated is not None:
            event.cancel_tool = stop_message(w.terminated)

    def _end(self, event: AfterInvocationEvent) -> None:
        w = self._watches.pop(id(event.agent), None)
        if w is not None:
            w.close()
