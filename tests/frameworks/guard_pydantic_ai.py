"""pydantic-ai with `LoopwardenCapability`: the hint reaches the model call after the
warning, once; the termination ends the run before its next model call."""

import time

from common import MODEL_URL, check, guard, verdicts_as_loopwarden
from loopwarden_guard import SessionTerminated
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


try:
    agent.run_sync("fix the bug", conversation_id=CONVERSATION)
    terminated = False
except SessionTerminated:
    terminated = True
check(terminated)
