"""pydantic-ai with `LoopwardenCapability`: the hint reaches the model call after the
warning, once; the termination ends the run before its next model call. With `resumed`:
a conversation terminated while no guard ran (its agent process restarted) is stopped
before its next run's first model call, by a guard started after the termination."""

import sys
import time

from common import BROKERS, MODEL_URL, TERMINATIONS, WARNINGS, check, guard, requests, terminate, verdicts_as_loopwarden
from loopwarden_guard import Guard, SessionTerminated
from loopwarden_guard.pydantic_ai import LoopwardenCapability
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

Agent.instrument_all()
CONVERSATION = f"conv-{time.time_ns()}"
agent = Agent(
    OpenAIChatModel("scripted", provider=OpenAIProvider(base_url=MODEL_URL, api_key="x")),
    capabilities=[LoopwardenCapability(guard)],
)


@agent.tool_plain
def run_tests(path: str) -> str:
    return verdicts_as_loopwarden(session_id=CONVERSATION)


if sys.argv[1:] == ["resumed"]:
    guard.close()
    terminate(CONVERSATION)
    restarted = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()
    agent = Agent(
        OpenAIChatModel("scripted", provider=OpenAIProvider(base_url=MODEL_URL, api_key="x")),
        capabilities=[LoopwardenCapability(restarted)],
    )
    agent.tool_plain(run_tests)
    try:
        agent.run_sync("go on", conversation_id=CONVERSATION)
        print(f"FAILED: the resumed run was not stopped ({len(requests)} model calls)")
        sys.exit(1)
    except SessionTerminated:
        restarted.close()
    if requests:
        print(f"FAILED: {len(requests)} model calls before the stop, expected none")
        sys.exit(1)
    print("ok: the resumed run stopped before its first model call")
    sys.exit(0)

try:
    agent.run_sync("fix the bug", conversation_id=CONVERSATION)
    terminated = False
except SessionTerminated:
    terminated = True
check(terminated)
