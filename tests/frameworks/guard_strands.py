"""Strands with `LoopwardenHooks`: the hint reaches the model call after the warning;
the termination cancels the invocation (stop_reason `cancelled`) before its next model
call. The session is the invocation's trace, as Strands' spans name it.

    guard_strands.py [late]

`late`: the termination lands after the loop's last cancellation check before a model
call (its `agent.cancel()` never reaches the loop here), so the hooks alone must stop
that call before it is sent, and the result must still say `cancelled` (Strands reports
a model call denied by a hook as `end_turn`)."""

import sys

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
if sys.argv[1:] == ["late"]:
    # The state a termination read just after the loop's check leaves: the watch
    # knows, the agent's cancel signal does not.
    agent.cancel = lambda **kw: cancels.append(kw)
result = agent("fix the bug")
if sys.argv[1:] == ["late"] and not cancels:
    print("FAILED: the termination's callback never ran")
    sys.exit(1)
check(result.stop_reason == "cancelled")
