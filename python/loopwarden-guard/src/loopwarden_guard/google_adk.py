"""Google ADK: a plugin that puts loopwarden's hints into the next model call and ends the
invocation when loopwarden terminates its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.google_adk import LoopwardenPlugin

    guard = Guard("kafka:9092").start()
    runner = Runner(agent=agent, app_name="app", session_service=sessions,
                    plugins=[LoopwardenPlugin(guard)])

The session is matched on ADK's session id, which its spans name
(`gen_ai.conversation.id`), and on the invocation's trace id. A termination aborts the
invocation as it arrives (ADK's `InvocationContext.abort()`, shared by every agent of the
run: a sequence's next agent does not start; an ADK without it gets `end_invocation` on
the running agent's context, read between steps: untested, the pinned ADK has `abort()`);
a model call or tool call that would still start after it is answered with the stop
message, or an error naming it, instead; a session terminated before the run (resumed
after its kill) ends the run at once with the stop message. An agent called as a tool
(`AgentTool`) runs in a session of its own, which loopwarden judges apart (its own run
under the plugin is not tested here).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any, Optional

from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

from ._otel import follow_current_trace
from .guard import Finding, Guard, Watch
from .hint import hint_message, stop_message


def _stop_content(f: Finding) -> types.Content:
    return types.Content(role="model", parts=[types.Part(text=stop_message(f))])


class LoopwardenPlugin(BasePlugin):
    """Follows each invocation's session through `guard`."""

    def __init__(self, guard: Guard, name: str = "loopwarden"):
        super().__init__(name=name)
        self.guard = guard
        # By invocation id: its watch; the run's own context with a token of this run
        # (`abort()` on it reaches every agent's copy); the copy last seen in a callback
        # (for an ADK without `abort()`). Contexts weakly: a run cancelled without its
        # after-run callback is forgotten once its context is collected.
        self._watches: dict[str, Watch] = {}
        self._runs: dict[str, tuple[weakref.ref, object]] = {}
        self._live: dict[str, weakref.ref] = {}
        self._lock = threading.Lock()
        # Runs whose context was collected, forgotten at the plugin's next callback: the
        # collector runs a finalizer on whatever thread allocates, inside whatever lock
        # it holds, so the finalizer only appends here (atomic, no lock).
        self._gone: deque[tuple[str, object]] = deque()

    def _watch(self, context: Any) -> Watch:
        """The watch of the invocation `context` (an invocation context, or a callback's
        or tool's context holding one) belongs to."""
        self._forget_gone()
        invocation = getattr(context, "_invocation_context", context)
        invocation_id = invocation.invocation_id
        with self._lock:
            self._live[invocation_id] = weakref.ref(invocation)
            w = self._watches.get(invocation_id)
            if w is None:
                w = self._watches[invocation_id] = self.guard.watch(session_id=invocation.session.id)
        follow_current_trace(w)
        return w

    async def before_run_callback(self, *, invocation_context: Any) -> Optional[types.Content]:
        w = self._watch(invocation_context)
        invocation_id = invocation_context.invocation_id
        token = object()
        with self._lock:
            self._runs[invocation_id] = (weakref.ref(invocation_context), token)
        weakref.finalize(invocation_context, self._gone.append, (invocation_id, token))
        w.on_terminate(lambda _f: self._stop(invocation_id))
        terminated = w.terminated
        if terminated is not None:
            # Terminated before this run (a session resumed after its kill): the run
            # ends with the stop message, before any step.
            return _stop_content(terminated)
        return None

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> Optional[LlmResponse]:
        w = self._watch(callback_context)
        terminated = w.terminated
        if terminated is not None:
            self._stop(callback_context.invocation_id)
            return LlmResponse(content=_stop_content(terminated), turn_complete=True)
        hint = w.take_hint()
        if hint:
            # Into the message the model is about to read (the last user turn: the tool
            # results), so the conversation keeps alternating roles; on a copy, so the
            # stored session does not keep it.
            text = types.Part(text=hint_message(hint))
            contents = llm_request.contents
            if contents and contents[-1].role == "user":
                contents[-1] = contents[-1].model_copy(update={"parts": [*(contents[-1].parts or []), text]})
            else:
                contents.append(types.Content(role="user", parts=[text]))
        return None

    async def before_tool_callback(self, *, tool: Any, tool_args: dict, tool_context: Any) -> Optional[dict]:
        w = self._watch(tool_context)
        terminated = w.terminated
        if terminated is not None:
            self._stop(tool_context.invocation_id)
            return {"error": stop_message(terminated)}
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        self._forget(invocation_context.invocation_id)
        self._forget_gone()

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        # A run that raised has no after-run callback.
        self._forget(invocation_context.invocation_id)

    def _stop(self, invocation_id: str) -> None:
        """Ends the invocation: from any thread, as the termination arrives."""
        with self._lock:
            run = self._runs.get(invocation_id)
            live = self._live.get(invocation_id)
        root = run[0]() if run is not None else None
        abort = getattr(root, "abort", None)
        if callable(abort):
            abort()
            return
        copy = live() if live is not None else None
        if copy is not None:
            copy.end_invocation = True

    def _forget(self, invocation_id: str, token: object = None) -> None:
        """Forgets a run (only the run of `token`, where given: a context collected late
        must not take a later run's watch of the same invocation id)."""
        with self._lock:
            run = self._runs.get(invocation_id)
            if token is not None and (run is None or run[1] is not token):
                return
            w = self._watches.pop(invocation_id, None)
            self._runs.pop(invocation_id, None)
            self._live.pop(invocation_id, None)
        if w is not None:
            w.close()

    def _forget_gone(self) -> None:
        while True:
            try:
                invocation_id, token = self._gone.popleft()
            except IndexError:
                return
            self._forget(invocation_id, token)
