"""Strands with `LoopwardenHooks`: the hint reaches the model call after the warning;
the termination cancels the invocation (stop_reason `cancelled`) before its next model
call. The session is the invocation's trace, as Strands' spans name it."""

from common import MODEL_URL, check, guard, verdicts_as_loopwarden
from loopwarden_guard._otel import current_trace_id
from loopwarden_guard.strands import LoopwardenHooks
from strands import Agent, tool
from strands.models.openai import OpenAIModel


@tool
def run_tests(path: str) -> str:
    """Run the tests."""
    return verdicts_as_loopwarden(trace_id=current_trace_id())


agent = Agent(
    model=OpenAIModel(client_args={"base_url": MODEL_URL, "api_key": "x"}, model_id="scripted"),
    tools=[run_tests],
    hooks=[LoopwardenHooks(guard)],
    callback_handler=None,
)
result = agent("fix the bug")
check(result.stop_reason == "cancelled")
