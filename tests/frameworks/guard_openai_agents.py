"""The OpenAI Agents SDK (OpenInference) with `guarded_session`: every span carries the
session's id; the hint reaches the model call after the warning; the termination ends
the run before its next model call."""

from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client
from common import MODEL_URL, check, guard, provider, verdicts_as_loopwarden
from loopwarden_guard import SessionTerminated
from loopwarden_guard.openai_agents import guarded_session
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
set_default_openai_client(AsyncOpenAI(base_url=MODEL_URL, api_key="x"))
set_default_openai_api("chat_completions")
SESSION = {}


@function_tool
def run_tests(path: str) -> str:
    """Run the tests."""
    return verdicts_as_loopwarden(session_id=SESSION["id"])


agent = Agent(name="fixer", instructions="Fix the bug.", tools=[run_tests], model="scripted")
terminated = False
try:
    with guarded_session(guard) as g:
        SESSION["id"] = g.session_id
        Runner.run_sync(agent, "fix the bug", run_config=g.run_config, hooks=g.hooks, max_turns=50)
except SessionTerminated:
    terminated = True
check(terminated, session_id=SESSION["id"])
