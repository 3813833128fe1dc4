"""Google ADK traced by its own telemetry (no loopwarden code in the agent): an agent on a
scripted model, each span exported alone as it ends (the SDK's `SimpleSpanProcessor`: a
long run's steps go out before its agent span, as a batch processor sends them too), its
spans written as OTLP JSON lines (as the Collector's file exporter writes them) for
`loopwarden replay`. Prints `session <id>` for the runner's session.

Usage: traced_adk.py OUT.jsonl MODE
  stuck:       12 turns, each the same `run_tests` call with the same failure; ADK's
               telemetry schema 2 (its default), content on spans (`SPAN_ONLY`)
  healthy:     8 turns, each `run_tests` on another file; the same settings
  schema1:     `stuck` on ADK's telemetry schema 1 (`ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1`),
               tool content in ADK's own attributes
  uncaptured:  `schema1` with ADK's content capture off: "{}" for every call's content
  delegating:  3 turns of `run_tests`, then the `helper` agent called as a tool (ADK's
               `AgentTool`: a session of its own, in the same trace) making two `lookup`
               calls, then 3 more turns of `run_tests` on other files
  delegating-first: the helper called on the first turn, then 6 turns of `run_tests`, on
               ADK's schema 1 (its model calls wrapped in `call_llm` spans that end after
               the calls they asked for: nothing named is under the caller's agent span
               when the helper's call ends)
"""

import asyncio
import os
import sys

out_path, mode = sys.argv[1], sys.argv[2]
if mode in ("schema1", "uncaptured", "delegating-first"):
    os.environ["ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN"] = "1"
if mode == "uncaptured":
    os.environ["ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS"] = "false"
else:
    # ADK 2's spans carry content only so: `true` puts it on log records.
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.adk.tools.agent_tool import AgentTool  # noqa: E402
from google.genai import types  # noqa: E402
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "otlp"))
from otlp_json import trace_to_lines  # noqa: E402

provider = trace_to_lines(out_path)


def call(name, **args):
    return {"name": name, "args": args}


class Scripted(BaseLlm):
    """A model that answers its script's steps in turn: text, and the calls to make."""

    steps: list
    turn: int = 0

    async def generate_content_async(self, llm_request, stream=False):
        step = self.steps[min(self.turn, len(self.steps) - 1)]
        self.turn += 1
        parts = [types.Part(text=step["text"])]
        for i, c in enumerate(step.get("calls", [])):
            fc = types.FunctionCall(name=c["name"], args=c["args"], id=f"{self.model}-{self.turn}-{i}")
            parts.append(types.Part(function_call=fc))
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1000 + 50 * self.turn, candidates_token_count=20, total_token_count=1020 + 50 * self.turn
        )
        # Gemini's API says why a response ended: ADK then ends the model call's span
        # before it runs the calls.
        yield LlmResponse(
            content=types.Content(role="model", parts=parts),
            usage_metadata=usage,
            finish_reason=types.FinishReason.STOP,
        )


def run_tests(path: str) -> str:
    """Runs the tests under path."""
    healthy = mode == "healthy" or mode.startswith("delegating")
    return f"{path}: 3 passed" if healthy else "FAILED tests/test_a.py::test_x - AssertionError"


def lookup(term: str) -> str:
    """Looks a term up in the docs."""
    return f"{term}: see section {len(term)}"


def turns(n, path):
    return [{"text": f"Checking part {i}.", "calls": [call("run_tests", path=path(i))]} for i in range(n)]


tools = [run_tests]
if mode.startswith("delegating"):
    helper = LlmAgent(
        name="helper",
        description="Looks things up.",
        model=Scripted(
            model="scripted-helper",
            steps=[
                {"text": "Looking up.", "calls": [call("lookup", term="fixture")]},
                {"text": "Looking up more.", "calls": [call("lookup", term="conftest")]},
                {"text": "Fixtures live in conftest.py."},
            ],
        ),
        tools=[lookup],
    )
    tools.append(AgentTool(agent=helper))
    ask = [{"text": "Asking the helper.", "calls": [call("helper", request="where are fixtures?")]}]
    if mode == "delegating":
        steps = turns(3, lambda i: f"tests/test_{i}.py") + ask + turns(3, lambda i: f"tests/test_{i + 3}.py")
    else:
        steps = ask + turns(6, lambda i: f"tests/test_{i}.py")
elif mode == "healthy":
    steps = turns(8, lambda i: f"tests/test_{i}.py")
else:
    steps = [{"text": "Running the tests again.", "calls": [call("run_tests", path="tests/")]}] * 12
agent = LlmAgent(
    name="coder",
    model=Scripted(model="scripted", steps=steps + [{"text": "Done."}]),
    tools=tools,
    instruction="Fix the bug.",
)


async def main():
    runner = InMemoryRunner(agent=agent, app_name="app")
    session = await runner.session_service.create_session(app_name="app", user_id="user")
    message = types.Content(role="user", parts=[types.Part(text="fix the bug")])
    async for _ in runner.run_async(user_id="user", session_id=session.id, new_message=message):
        pass
    return session.id


session_id = asyncio.run(main())
provider.shutdown()
print(f"session {session_id}")
print(f"ok: {mode} agent traced", file=sys.stderr)
