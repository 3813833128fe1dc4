"""Google ADK with `LoopwardenPlugin`: the hint reaches the model call after the warning,
once; the termination ends the invocation before its next model call. The session is
ADK's session id, as its spans name it (`gen_ai.conversation.id`). With `resumed`: a
session terminated while no guard ran (its agent process restarted) is stopped before
its next run's first model call, by a guard started after the termination. With
`sequence`: the agent is the first of a `SequentialAgent`, whose next agent must not start.
With `between`: a termination that arrives between two agents of a sequence, after the
last callback of the first, stops the next. With `cancelled`: a run cancelled mid-way
(no after-run callback) leaves no watch behind.

ADK's model calls go to the scripted OpenAI-compatible model through `adk_model.py`:
each request is what ADK built, the plugin's hint included."""

import asyncio
import gc
import sys
import time

import common
import model_server
from adk_model import ServedModel, run, said, stopped_by_guard
from common import BROKERS, MODEL_URL, TERMINATIONS, WARNINGS, check, guard, requests, terminate, verdicts_as_loopwarden
from loopwarden_guard import STOP_PREFIX, Guard
from google.adk.agents import BaseAgent, LlmAgent, SequentialAgent
from google.adk.events import Event
from google.genai import types
from loopwarden_guard.google_adk import LoopwardenPlugin

SESSION = f"adk-{time.time_ns()}"


def run_tests(path: str) -> str:
    """Runs the tests under path."""
    return verdicts_as_loopwarden(session_id=SESSION)


agent = LlmAgent(name="coder", model=ServedModel(model="scripted", base_url=MODEL_URL), tools=[run_tests], instruction="Fix the bug.")
reviewed = []


class Reviewer(BaseAgent):
    """The agent after the terminated one: calls no model (a model call would be answered
    by the stop message anyway), so only the run's end keeps it from starting."""

    async def _run_async_impl(self, ctx):
        reviewed.append(ctx.invocation_id)
        yield Event(author=self.name, content=types.Content(role="model", parts=[types.Part(text="Reviewed.")]))


if sys.argv[1:] == ["sequence"]:
    # The coder, then the reviewer: it must not start once the session is terminated.
    agent = SequentialAgent(name="pipeline", sub_agents=[agent, Reviewer(name="reviewer")])
elif sys.argv[1:] == ["between"]:
    # The coder ends by itself (one model call), then a step that calls no model or tool
    # while the termination arrives, then the reviewer: the run's abort must reach it,
    # though no agent's context the plugin saw is alive any more.
    model_server.SCRIPT["steps"] = [{"text": "Done."}]

    class Waiter(BaseAgent):
        async def _run_async_impl(self, ctx):
            terminate(SESSION)
            await asyncio.sleep(2.0)
            yield Event(author=self.name, content=types.Content(role="model", parts=[types.Part(text="Waited.")]))

    agent = SequentialAgent(name="pipeline", sub_agents=[agent, Waiter(name="waiter"), Reviewer(name="reviewer")])


async def main():
    return await run(agent, LoopwardenPlugin(guard), SESSION)


if sys.argv[1:] == ["cancelled"]:
    # A run cancelled (a server dropping the request's task) gets no after-run callback:
    # its watch must still go once its context does.
    plugin = LoopwardenPlugin(guard)

    async def cancelled():
        task = asyncio.create_task(run(agent, plugin, SESSION))
        while not requests:
            await asyncio.sleep(0.01)
        watched = len(plugin._watches)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return watched

    watched = asyncio.run(cancelled())
    gc.collect()

    class Quick(BaseAgent):
        async def _run_async_impl(self, ctx):
            yield Event(author=self.name, content=types.Content(role="model", parts=[types.Part(text="Done.")]))

    async def next_run():
        # The plugin's next run, of another session: the cancelled run is forgotten then.
        await run(Quick(name="quick"), plugin, SESSION + "-next", text="go")

    asyncio.run(next_run())
    left = len(plugin._watches) + len(guard._watches)
    guard.close()
    if watched != 1 or left:
        print(f"FAILED: {watched} watched during the run, {left} left after its cancellation")
        sys.exit(1)
    print("ok: a cancelled run's watch is gone")
    sys.exit(0)

if sys.argv[1:] == ["resumed"]:
    # A session terminated while no guard ran (its agent process restarted): the guard
    # started after the termination ends the resumed run before its first model call.
    guard.close()
    terminate(SESSION)
    guard = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()
    last = asyncio.run(main())
    guard.close()
    if requests or common.tool_calls or not said(last).startswith(STOP_PREFIX):
        print(f"FAILED: {len(requests)} model calls and {common.tool_calls} tool calls, expected none; said {said(last)!r}")
        sys.exit(1)
    print(f"ok: the resumed run stopped before its first model call ({said(last)!r})")
    sys.exit(0)

last = asyncio.run(main())
if reviewed:
    print("FAILED: the sequence's next agent ran after the termination")
    sys.exit(1)
if sys.argv[1:] == ["between"]:
    guard.close()
    if not stopped_by_guard(last):
        print(f"FAILED: the run was not ended: {last!r}")
        sys.exit(1)
    print("ok: the run aborted between its agents")
    sys.exit(0)
check(stopped_by_guard(last))
