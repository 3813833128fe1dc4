"""Strands with `LoopwardenHooks`, the termination landing late: its `agent.cancel()`
has not reached the loop's check after the tools (here it never does), so the hook
before the next model call is what stops the run. No model call and no tool call after
the termination all the same, and the result says `cancelled` as a cancelled run does
(Strands itself reports a model call denied by a hook as `end_turn`)."""

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
cancels = []
# The state a termination read just after the loop's cancellation check leaves: the
# watch knows, the agent's cancel signal does not.
agent.cancel = lambda **kw: cancels.append(kw)
result = agent("fix the bug")
if not cancels:
    print("FAILED: the termination's callback never ran")
check(result.stop_reason == "cancelled" and bool(cancels))
