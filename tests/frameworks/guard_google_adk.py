"""Google ADK with `LoopwardenPlugin`: the hint reaches the model call after the warning,
once; the termination ends the invocation before its next model call. The session is
ADK's session id, as its spans name it (`gen_ai.conversation.id`). With `resumed`: a
session terminated while no guard ran (its agent process restarted) is stopped before
its next run's first model call, by a guard started after the termination.

ADK's model calls go to the scripted OpenAI-compatible model through `adk_model.py`:
each request is what ADK built, the plugin's hint included."""

import asyncio
import sys
import time

import common
from adk_model import ServedModel, said
from common import BROKERS, MODEL_URL, TERMINATIONS, WARNINGS, check, guard, publish, requests, verdicts_as_loopwarden
from loopwarden_guard import Guard
from google.adk.agents import LlmAgent
from google.adk.runners import InMemoryRunner
from google.genai import types
from loopwarden_guard.google_adk import LoopwardenPlugin

SESSION = f"adk-{time.time_ns()}"


def run_tests(path: str) -> str:
    """Runs the tests under path."""
    return verdicts_as_loopwarden(session_id=SESSION)


agent = LlmAgent(name="coder", model=ServedModel(model="scripted", base_url=MODEL_URL), tools=[run_tests], instruction="Fix the bug.")


def tool_calls():
    return common.tool_calls


async def main():
    runner = InMemoryRunner(agent=agent, app_name="app", plugins=[LoopwardenPlugin(guard)])
    await runner.session_service.create_session(app_name="app", user_id="user", session_id=SESSION)
    message = types.Content(role="user", parts=[types.Part(text="fix the bug")])
    last = None
    async for event in runner.run_async(user_id="user", session_id=SESSION, new_message=message):
        last = event
    return last


if sys.argv[1:] == ["resumed"]:
    # A session terminated while no guard ran (its agent process restarted): the guard
    # started after the termination ends the resumed run before its first model call.
    guard.close()
    publish(TERMINATIONS, {"type": "session.terminated", "schema_version": 1, "event_id": f"t-{SESSION}",
                           "session_id": SESSION, "detector": "repeat", "level": "terminate",
                           "reason": "the same call failing the same way", "hint": "stopped", "mode": "enforce"})
    guard = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()
    last = asyncio.run(main())
    guard.close()
    if requests or tool_calls() or not said(last).startswith("Stopped by loopwarden"):
        print(f"FAILED: {len(requests)} model calls and {tool_calls()} tool calls, expected none; said {said(last)!r}")
        sys.exit(1)
    print(f"ok: the resumed run stopped before its first model call ({said(last)!r})")
    sys.exit(0)

check(said(asyncio.run(main())).startswith("Stopped by loopwarden"))
