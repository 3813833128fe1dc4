"""The OpenAI Agents SDK (traced with OpenInference): a run config and run hooks that put
loopwarden's hints into the next model call and end the run when loopwarden terminates
its session.

    from loopwarden_guard import Guard
    from loopwarden_guard.openai_agents import guarded_session

    guard = Guard("kafka:9092").start()
    with guarded_session(guard) as g:
        result = await Runner.run(agent, "fix the bug", run_config=g.run_config, hooks=g.hooks)

The SDK's spans carry no session id of their own (loopwarden would fall back to the
trace id, which the agent's code never sees), so the session gets one: every span
started inside the block carries it as `session.id` (OpenInference's `using_session`),
and the watch follows it. A termination raises `SessionTerminated` out of the run
before its next model call or tool call.
"""

from __future__ import annotations

import dataclasses
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from agents import RunConfig, RunHooks
from agents.run_config import CallModelData, ModelInputData
from openinference.instrumentation import using_session

from .guard import Guard, SessionTerminated, Watch
from .hint import hint_message


class _Hooks(RunHooks[Any]):
    def __init__(self, watch: Watch):
        self.watch = watch

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.watch.check()

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
        self.watch.check()


@dataclass
class GuardedSession:
    session_id: str
    watch: Watch
    run_config: RunConfig
    hooks: RunHooks[Any]


@contextmanager
def guarded_session(
    guard: Guard, session_id: str | None = None, run_config: RunConfig | None = None
) -> Iterator[GuardedSession]:
    """A session id for the runs inside the block, and the run config and hooks that
    act on its verdicts (`run_config`'s own input filter, if any, runs first)."""
    session_id = session_id or uuid.uuid4().hex
    watch = guard.watch(session_id=session_id)
    base = run_config or RunConfig()
    earlier = base.call_model_input_filter

    async def put_hint(data: CallModelData[Any]) -> ModelInputData:
        model_data = data.model_data
        if earlier is not None:
            model_data = earlier(dataclasses.replace(data, model_data=model_data))
            if hasattr(model_data, "__await__"):
                model_data = await model_data
        watch.check()
        hint = watch.take_hint()
        if hint:
            # This call's input only: the run's own history is not rewritten.
            model_data = ModelInputData(
                input=[*model_data.input, {"role": "user", "content": hint_message(hint)}],
                instructions=model_data.instructions,
            )
        return model_data

    config = dataclasses.replace(base, call_model_input_filter=put_hint)
    try:
        with using_session(session_id):
            yield GuardedSession(session_id, watch, config, _Hooks(watch))
    except Exception as e:
        # The SDK wraps what a tool hook raises ("Error running tool ..."): the run was
        # ended by the termination, and that is what the caller catches.
        stopped = _terminated_in(e)
        if stopped is not None and stopped is not e:
            raise stopped from e
        raise
    finally:
        watch.close()


def _terminated_in(e: BaseException) -> SessionTerminated | None:
    """The `SessionTerminated` among `e`'s causes, if any."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, SessionTerminated):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None
