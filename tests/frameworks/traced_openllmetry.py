"""LangGraph traced by OpenLLMetry (Traceloop's `opentelemetry-instrumentation-langchain`,
content on, its defaults otherwise), with no loopwarden code in the agent: a ReAct agent
on a scripted model, its spans written as OTLP JSON lines (as the Collector's file
exporter writes them) for `loopwarden replay`.

Usage: traced_openllmetry.py OUT.jsonl stuck|raising|rejected|healthy
  stuck:   12 turns, each the same `run_tests` call with the same failure
  raising: 12 turns, each the same `run_tests` call raising the same exception (the
           graph's `ToolNode` hands the error back to the model: `handle_tool_errors`)
  rejected: 9 turns, each `run_tests` on another file, each raising the same exception
           (a sandbox refusing every attempt)
  healthy: 8 turns, each `run_tests` on another file
"""

import os
import sys

os.environ["TRACELOOP_TRACE_CONTENT"] = "true"

from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import ToolNode, create_react_agent  # noqa: E402
from opentelemetry.instrumentation.langchain import LangchainInstrumentor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "otlp"))
import model_server  # noqa: E402
from otlp_json import trace_to_lines  # noqa: E402

out_path, mode = sys.argv[1], sys.argv[2]
provider = trace_to_lines(out_path)
LangchainInstrumentor().instrument()

if mode in ("stuck", "raising"):
    steps = [{"text": "Running the tests again.", "tool_calls": [{"name": "run_tests", "arguments": {"path": "tests/"}}]}] * 12
else:
    steps = [
        {"text": f"Checking part {i}.", "tool_calls": [{"name": "run_tests", "arguments": {"path": f"tests/test_{i}.py"}}]}
        for i in range(9 if mode == "rejected" else 8)
    ]
server = model_server.serve({"steps": steps + [{"text": "Done."}]})


@tool
def run_tests(path: str) -> str:
    """Runs the tests under path."""
    if mode == "raising":
        raise ValueError(f"no such directory: {path} (errno 2)")
    if mode == "rejected":
        raise PermissionError("permission denied: /workspace (errno 13)")
    return "FAILED tests/test_a.py::test_x - AssertionError" if mode == "stuck" else f"{path}: 3 passed"


llm = ChatOpenAI(model="scripted", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="x")
agent = create_react_agent(llm, ToolNode([run_tests], handle_tool_errors=True))
# A LangGraph thread, as a checkpointed conversation names it.
config = {"configurable": {"thread_id": f"thread-{mode}"}, "recursion_limit": 100}
agent.invoke({"messages": [("user", "fix the bug")]}, config=config)
provider.shutdown()
print(f"ok: {mode} agent traced")
