"""LangGraph (traced with OpenInference): model hooks for `create_react_agent` that put
loopwarden's hints into the next model call and end the run when loopwarden terminates
its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.langgraph import LoopwardenHooks

    guard = Guard("kafka:9092").start()
    hooks = LoopwardenHooks(guard)
    agent = create_react_agent(llm, tools, pre_model_hook=hooks.pre_model_hook,
                               post_model_hook=hooks.post_model_hook)
    with hooks.session() as session:
        agent.invoke({"messages": [("user", "fix the bug")]})

LangChain's spans carry no session id of their own (loopwarden would fall back to the
trace id), so each `session()` block gets one: every span started inside it carries it
as `session.id` (OpenInference's `using_session`), and the block's watch follows it. A
termination raises `SessionTerminated` out of the run before its next model call, and
after a model call before the tools it asked for run.
"""

from __future__ import annotations

import contextvars
import uuid
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

from openinference.instrumentation import using_session

from .exporter import using_agent
from .guard import Guard, SessionTerminated, Watch
from .hint import hint_message

_current: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "loopwarden_guard_langgraph_watch", default=None
)


class LoopwardenHooks:
    """`pre_model_hook` and `post_model_hook` for the graphs of one process."""

    def __init__(self, guard: Guard):
        self.guard = guard

    @contextmanager
    def session(self, session_id: str | None = None, agent: str | None = None) -> Iterator[Watch]:
        """A session id for the runs inside the block; yields its watch. `agent` names the
        agent of its spans (LangChain's name none; loopwarden's `agent_id`), given
        `exporter.step_attributes_processor()` on the tracer provider."""
        session_id = session_id or uuid.uuid4().hex
        watch = self.guard.watch(session_id=session_id)
        token = _current.set(watch)
        try:
            with using_session(session_id), using_agent(agent) if agent else nullcontext():
                yield watch
        finally:
            _current.reset(token)
            watch.close()

    def pre_model_hook(self, state: dict[str, Any]) -> dict[str, Any]:
        messages = list(state["messages"])
        watch = _current.get()
        if watch is None:
            return {"llm_input_messages": messages}
        watch.check()
        hint = watch.take_hint()
        if hint:
            # The model's input for this call only; the graph's state is not rewritten.
            messages.append(("user", hint_message(hint)))
        return {"llm_input_messages": messages}

    def post_model_hook(self, state: dict[str, Any]) -> dict[str, Any]:
        watch = _current.get()
        if watch is not None and watch.terminated is not None:
            raise SessionTerminated(watch.terminated)
        return {}
