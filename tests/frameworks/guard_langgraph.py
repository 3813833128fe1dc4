"""LangGraph (OpenInference) with `LoopwardenHooks`: every span carries the session's
id; the hint reaches the model call after the warning; the termination ends the run
before its next model call."""

import warnings

from common import MODEL_URL, check, guard, provider, verdicts_as_loopwarden
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from loopwarden_guard import SessionTerminated
from loopwarden_guard.langgraph import LoopwardenHooks
from openinference.instrumentation.langchain import LangChainInstrumentor

LangChainInstrumentor().instrument(tracer_provider=provider)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent
SESSION = {}


@tool
def run_tests(path: str) -> str:
    """Run the tests."""
    return verdicts_as_loopwarden(session_id=SESSION["id"])


hooks = LoopwardenHooks(guard)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    agent = create_react_agent(
        ChatOpenAI(model="scripted", base_url=MODEL_URL, api_key="x"),
        [run_tests],
        pre_model_hook=hooks.pre_model_hook,
        post_model_hook=hooks.post_model_hook,
    )
terminated = False
try:
    with hooks.session() as watch:
        SESSION["id"] = next(iter(watch.session_ids))
        agent.invoke({"messages": [("user", "fix the bug")]}, {"recursion_limit": 100})
except SessionTerminated:
    terminated = True
check(terminated, session_id=SESSION["id"])
