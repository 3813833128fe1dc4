"""What the framework tests share: the broker and topics (from the environment the
Rust test sets), a scripted OpenAI-compatible model whose requests are kept, an
in-memory span exporter, and the findings loopwarden would publish."""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "loopwarden-guard", "src"))

from confluent_kafka import Producer  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import model_server  # noqa: E402
from loopwarden_guard import HINT_PREFIX, Guard  # noqa: E402

BROKERS = os.environ["LOOPWARDEN_GUARD_BROKERS"]
WARNINGS = os.environ["LOOPWARDEN_GUARD_WARNING_TOPIC"]
TERMINATIONS = os.environ["LOOPWARDEN_GUARD_TERMINATED_TOPIC"]

spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)

# The stuck agent: the same failing call, turn after turn.
requests = []
_step = model_server.step_for


def _spy(messages):
    requests.append(json.dumps(messages))
    return _step(messages)


model_server.step_for = _spy
server = model_server.serve(
    {"steps": [{"text": "Running the tests again.", "tool_calls": [{"name": "run_tests", "arguments": {"path": "tests/"}}]}] * 40}
)
MODEL_URL = f"http://127.0.0.1:{server.server_address[1]}/v1"

producer = Producer({"bootstrap.servers": BROKERS})
guard = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()

WARN_AT, KILL_AT = 3, 6
KEEPS_HINT_IN_HISTORY = os.path.basename(sys.argv[0]) == "guard_strands.py"
tool_calls = 0


def publish(topic, finding):
    producer.produce(topic, json.dumps(finding).encode(), key=str(finding["session_id"]).encode())
    producer.flush(10)


def terminate(session_id):
    """Publishes, as loopwarden would, the termination of `session_id`, outside any run
    (a session terminated while its agent process was down)."""
    publish(TERMINATIONS, {"type": "session.terminated", "schema_version": 1, "event_id": f"t-{session_id}",
                           "session_id": session_id, "detector": "repeat", "level": "terminate",
                           "reason": "the same call failing the same way", "hint": "stopped", "mode": "enforce"})


def verdicts_as_loopwarden(session_id=None, trace_id=None):
    """Called by the agent's tool: at its 3rd call loopwarden warns, at its 6th it
    terminates (published as loopwarden does; given time to arrive, as a real tool's
    run would)."""
    global tool_calls
    tool_calls += 1
    stamp = f"{time.time():.6f}"
    trigger = {"topic": "in", "partition": 0, "offset": tool_calls, "event_id": f"e{tool_calls}"}
    if trace_id:
        trigger["trace_id"] = trace_id
    base = {"schema_version": 1, "session_id": session_id or trace_id, "detector": "repeat",
            "reason": "the same call failing the same way", "mode": "enforce", "trigger": trigger}
    if tool_calls == WARN_AT:
        publish(WARNINGS, {**base, "type": "session.warning", "event_id": "w" + stamp, "level": "warning",
                           "hint": "Stop re-running the tests; read the failure first."})
        time.sleep(1.0)
    if tool_calls == KILL_AT:
        publish(TERMINATIONS, {**base, "type": "session.terminated", "event_id": "t" + stamp, "level": "terminate",
                               "hint": "stopped"})
        time.sleep(1.0)
    return "FAILED tests/test_a.py::test_x - AssertionError"


def check(terminated, session_id=None):
    """The verdicts reached the agent: the hint in the model call after the warning and
    not accumulating, no model call and no tool call after the termination."""
    with_hint = [i for i, r in enumerate(requests) if HINT_PREFIX in r]
    problems = []
    if not terminated:
        problems.append("the run was not ended by the termination")
    if tool_calls != KILL_AT:
        problems.append(f"{tool_calls} tool calls, expected {KILL_AT} (none after the termination)")
    if len(requests) != KILL_AT:
        problems.append(f"{len(requests)} model calls, expected {KILL_AT} (none after the termination)")
    # Once: in the call after the warning only, except where the framework's only way in
    # is its stored conversation (Strands), where it stays in the later calls' history.
    expected = list(range(WARN_AT, len(requests))) if KEEPS_HINT_IN_HISTORY else [WARN_AT]
    if with_hint != expected:
        problems.append(f"the hint was in model calls {with_hint}, expected {expected}")
    if any(r.count(HINT_PREFIX) > 1 for r in requests):
        problems.append("the hint was put into a model call more than once")
    if session_id is not None:
        names = [s for s in spans.get_finished_spans() if (s.attributes or {}).get("session.id") == session_id]
        if len(names) != len(spans.get_finished_spans()):
            problems.append(f"{len(names)} of {len(spans.get_finished_spans())} spans carry session.id")
    guard.close()
    if problems:
        print("FAILED: " + "; ".join(problems))
        sys.exit(1)
    print(f"ok: hint in model call {with_hint[0]}, stopped after {tool_calls} tool calls and {len(requests)} model calls")
