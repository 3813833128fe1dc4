"""Google ADK: a plugin that puts loopwarden's hints into the next model call and ends the
invocation when loopwarden terminates its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.google_adk import LoopwardenPlugin

    guard = Guard("kafka:9092").start()
    runner = Runner(agent=agent, app_name="app", session_service=sessions,
                    plugins=[LoopwardenPlugin(guard)])

The session is matched on ADK's session id, which its spans name
(`gen_ai.conversation.id`), and on the invocation's trace id. A termination ends the
invocation (ADK's `end_invocation`, checked between its steps): a model call about to be
sent is answered with the stop message instead, a tool call about to run with an error
naming it, and no step runs after. An agent called as a tool (`AgentTool`) runs in a
session of its own, which loopwarden judges apart, and is guarded where the plugin
reaches its runner.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

from ._otel import current_trace_id
from .guard import Finding, Guard, Watch
from .hint import hint_message


def _stop_message(f: Finding) -> str:
    return f"Stopped by loopwarden ({f.detector}): {f.reason}"


class LoopwardenPlugin(BasePlugin):
    """Follows each invocation's session through `guard`."""

    def __init__(self, guard: Guard, name: str = "loopwarden"):
        super().__init__(name=name)
        self.guard = guard
        # By invocation id: the watch, and the invocation whose end a termination sets
        # (from the guard's thread, as it arrives).
        self._watches: dict[str, Watch] = {}
        self._invocations: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _watch(self, invocation_id: str, session_id: Optional[str]) -> Watch:
        with self._lock:
            w = self._watches.get(invocation_id)
            if w is None:
                w = self._watches[invocation_id] = self.guard.watch(session_id=session_id)
                invocations = self._invocations
                w.on_terminate(lambda _f: _end(invocations.get(invocation_id)))
        trace_id = current_trace_id()
        if trace_id and trace_id not in w.trace_ids:
            w.also(trace_id=trace_id)
        return w

    async def before_run_callback(self, *, invocation_context: Any) -> Optional[types.Content]:
        with self._lock:
            self._invocations[invocation_context.invocation_id] = invocation_context
        w = self._watch(invocation_context.invocation_id, invocation_context.session.id)
        if w.terminated is not None:
            # Terminated before this run (a session resumed after its kill): the run
            # ends with the stop message, before any step.
            return types.Content(role="model", parts=[types.Part(text=_stop_message(w.terminated))])
        return None

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> Optional[LlmResponse]:
        w = self._watch(callback_context.invocation_id, callback_context.session.id)
        if w.terminated is not None:
            self._end(callback_context.invocation_id)
            text = types.Part(text=_stop_message(w.terminated))
            return LlmResponse(content=types.Content(role="model", parts=[text]), turn_complete=True)
        hint = w.take_hint()
        if hint:
            # Into the message the model is about to read (the last user turn: the tool
            # results), so the conversation keeps alternating roles.
            text = types.Part(text=hint_message(hint))
            contents = llm_request.contents
            if contents and contents[-1].role == "user":
                contents[-1] = contents[-1].model_copy(update={"parts": [*(contents[-1].parts or []), text]})
            else:
                contents.append(types.Content(role="user", parts=[text]))
        return None

    async def before_tool_callback(self, *, tool: Any, tool_args: dict, tool_context: Any) -> Optional[dict]:
        w = self._watch(tool_context.invocation_id, tool_context.session.id)
        if w.terminated is not None:
            self._end(tool_context.invocation_id)
            return {"error": _stop_message(w.terminated)}
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        self._forget(invocation_context.invocation_id)

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        # A run that raised has no `after_run_callback`.
        self._forget(invocation_context.invocation_id)

    def _forget(self, invocation_id: str) -> None:
        with self._lock:
            w = self._watches.pop(invocation_id, None)
            self._invocations.pop(invocation_id, None)
        if w is not None:
            w.close()

    def _end(self, invocation_id: str) -> None:
        with self._lock:
            _end(self._invocations.get(invocation_id))


def _end(invocation: Any) -> None:
    if invocation is not None:
        invocation.end_invocation = True
