"""One scripted agent, end to end: its framework's spans exported over OTLP/HTTP (within
200 ms, the guard's setting) to a collector that puts them on Kafka, loopwarden judging
them, and loopwarden-guard acting on its verdicts inside this process.

    e2e.py FRAMEWORK SCENARIO

Environment: LOOPWARDEN_GUARD_BROKERS, LOOPWARDEN_GUARD_WARNING_TOPIC,
LOOPWARDEN_GUARD_TERMINATED_TOPIC, LOOPWARDEN_OTLP_HTTP (the collector), and
LOOPWARDEN_MODEL_LATENCY_S (how long the scripted model takes per call; 0.5).

Prints one JSON line: the session id loopwarden sees, whether the run was stopped, the
tool calls made, whether a hint reached the model, and when each model call started
(to count steps after loopwarden's decision).
"""

import json
import os
from datetime import datetime
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "loopwarden-guard", "src"))
warnings.simplefilter("ignore")

FRAMEWORK, SCENARIO = sys.argv[1], sys.argv[2]
# What the README tells users to set, before the SDK and instrumentations load.
os.environ.setdefault("OPENINFERENCE_HIDE_INPUT_MESSAGES", "true")
if FRAMEWORK == "google-adk":
    os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

import model_server  # noqa: E402
from loopwarden_guard import HINT_PREFIX, Guard, SessionTerminated  # noqa: E402
from loopwarden_guard.exporter import span_processor, step_attributes_processor  # noqa: E402

provider = TracerProvider(resource=Resource.create({"service.name": f"e2e-{FRAMEWORK}"}))
# Not for ADK: its own spans must do (its tool calls name no session; loopwarden's ingest
# takes it from their siblings).
if FRAMEWORK != "google-adk":
    provider.add_span_processor(step_attributes_processor())
provider.add_span_processor(
    span_processor(OTLPSpanExporter(endpoint=os.environ["LOOPWARDEN_OTLP_HTTP"] + "/v1/traces"))
)
trace.set_tracer_provider(provider)

# The scenarios: what the model asks for, turn after turn, and what the tools answer.
ASK_RUN_TESTS = {"text": "Running the tests again.", "tool_calls": [{"name": "run_tests", "arguments": {"path": "tests/"}}]}
ASK_POLL = {"text": "The job is still running; checking again.", "tool_calls": [{"name": "check_job", "arguments": {"job": "build-7"}}]}


def ask_read(i):
    return {"text": f"Reading module {i}.", "tool_calls": [{"name": "read_file", "arguments": {"path": f"src/m{i}.py"}}]}


DONE = {"text": "Done: the fix is in."}
SCRIPTS = {
    "stuck": {"steps": [ASK_RUN_TESTS] * 40},
    "healthy": {"steps": [ask_read(i) for i in range(6)] + [DONE]},
    "poll_progress": {"steps": [ASK_POLL] * 10 + [DONE]},
    "poll_stuck": {"steps": [ASK_POLL] * 60},
    "late_loop": {"steps": [ask_read(i) for i in range(12)] + [ASK_RUN_TESTS] * 40},
    "responsive": {"steps": [ASK_RUN_TESTS] * 40, "hint_marker": HINT_PREFIX, "after_hint": [DONE]},
}
script = dict(SCRIPTS[SCENARIO], latency_s=float(os.environ.get("LOOPWARDEN_MODEL_LATENCY_S", "0.5")))
calls_started = []
_step = model_server.step_for
requests = []


def _spy(messages):
    calls_started.append(time.time())
    requests.append(json.dumps(messages))
    return _step(messages)


model_server.step_for = _spy
server = model_server.serve(script)
MODEL_URL = f"http://127.0.0.1:{server.server_address[1]}/v1"
guard = Guard(
    os.environ["LOOPWARDEN_GUARD_BROKERS"],
    warning_topic=os.environ["LOOPWARDEN_GUARD_WARNING_TOPIC"],
    terminated_topic=os.environ["LOOPWARDEN_GUARD_TERMINATED_TOPIC"],
).start()
tool_calls = 0
polls = 0


def run_tests(path: str) -> str:
    """Run the tests under a path."""
    global tool_calls
    tool_calls += 1
    return "FAILED tests/test_a.py::test_x - AssertionError: expected 3, got 2"


def read_file(path: str) -> str:
    """Read a file."""
    global tool_calls
    tool_calls += 1
    return f"# {path}\ndef handler_{abs(hash(path)) % 1000}(request):\n    return respond(request, '{path}')\n"


def check_job(job: str) -> str:
    """Check a job's status."""
    global tool_calls, polls
    tool_calls += 1
    polls += 1
    if SCENARIO == "poll_stuck":
        return f"job {job}: running 40%"
    return f"job {job}: succeeded" if polls >= 10 else f"job {job}: running {10 * polls}%"


TOOLS = {"run_tests": run_tests, "read_file": read_file, "check_job": check_job}
session = None
stopped = False

if FRAMEWORK == "pydantic-ai":
    from loopwarden_guard.pydantic_ai import LoopwardenCapability
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    Agent.instrument_all()
    session = f"conv-{time.time_ns()}"
    agent = Agent(
        OpenAIChatModel("scripted", provider=OpenAIProvider(base_url=MODEL_URL, api_key="x")),
        capabilities=[LoopwardenCapability(guard)],
        name="fixer",
    )
    for fn in TOOLS.values():
        agent.tool_plain(fn)
    try:
        agent.run_sync("fix the bug", conversation_id=session)
    except SessionTerminated:
        stopped = True
elif FRAMEWORK == "strands":
    from loopwarden_guard.strands import LoopwardenHooks
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from loopwarden_guard._otel import current_trace_id

    seen_trace = {}

    def traced(fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            seen_trace.setdefault("id", current_trace_id())
            return fn(*a, **kw)
        return tool(wrapper)

    agent = Agent(
        model=OpenAIModel(client_args={"base_url": MODEL_URL, "api_key": "x"}, model_id="scripted"),
        tools=[traced(fn) for fn in TOOLS.values()],
        hooks=[LoopwardenHooks(guard)],
        callback_handler=None,
        name="fixer",
    )
    result = agent("fix the bug")
    stopped = result.stop_reason == "cancelled"
    session = seen_trace.get("id")
elif FRAMEWORK == "openai-agents":
    from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client
    from loopwarden_guard.openai_agents import guarded_session
    from openai import AsyncOpenAI
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    set_default_openai_client(AsyncOpenAI(base_url=MODEL_URL, api_key="x"))
    set_default_openai_api("chat_completions")

    agent = Agent(name="fixer", instructions="Fix the bug.", tools=[function_tool(fn) for fn in TOOLS.values()], model="scripted")
    try:
        with guarded_session(guard) as g:
            session = g.session_id
            Runner.run_sync(agent, "fix the bug", run_config=g.run_config, hooks=g.hooks, max_turns=100)
    except SessionTerminated:
        stopped = True
elif FRAMEWORK == "langgraph":
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
    from loopwarden_guard.langgraph import LoopwardenHooks
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=provider)
    tools = [StructuredTool.from_function(fn) for fn in TOOLS.values()]
    hooks = LoopwardenHooks(guard)
    agent = create_react_agent(
        ChatOpenAI(model="scripted", base_url=MODEL_URL, api_key="x"),
        tools,
        pre_model_hook=hooks.pre_model_hook,
        post_model_hook=hooks.post_model_hook,
        name="fixer",
    )
    try:
        with hooks.session(agent="fixer") as watch:
            session = next(iter(watch.session_ids))
            agent.invoke({"messages": [("user", "fix the bug")]}, {"recursion_limit": 200})
    except SessionTerminated:
        stopped = True
elif FRAMEWORK == "google-adk":
    import asyncio

    from adk_model import ServedModel, run, stopped_by_guard
    from google.adk.agents import LlmAgent
    from loopwarden_guard.google_adk import LoopwardenPlugin

    session = f"adk-{time.time_ns()}"
    agent = LlmAgent(
        name="fixer",
        model=ServedModel(model="scripted", base_url=MODEL_URL),
        tools=list(TOOLS.values()),
        instruction="Fix the bug.",
    )
    stopped = stopped_by_guard(asyncio.run(run(agent, LoopwardenPlugin(guard), session, app_name="e2e")))
else:
    sys.exit(f"unknown framework {FRAMEWORK}")

provider.force_flush()
guard.close()
# When this process could read loopwarden's termination of its session (not one the
# guard read back at its start, an earlier run's), after the span that triggered it ended
# (its event time): the whole path, exporter to guard.
readable = [
    f.received_at - datetime.fromisoformat(f.raw["event_time"].replace("Z", "+00:00")).timestamp()
    for f in guard._recent
    if f.raw.get("type") == "session.terminated" and f.session_id == session
]
print(json.dumps({
    "framework": FRAMEWORK,
    "scenario": SCENARIO,
    "session": session,
    "stopped": stopped,
    "tool_calls": tool_calls,
    "model_calls": len(calls_started),
    "hint_seen": any(HINT_PREFIX in r for r in requests),
    "calls_started": calls_started,
    "span_end_to_readable_s": readable[0] if readable else None,
    "agent_ids": sorted({str(f.raw.get("agent_id")) for f in guard._recent if f.session_id == session}),
}))
