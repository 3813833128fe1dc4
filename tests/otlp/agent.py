"""An agent instrumented only with OpenTelemetry: the official Python SDK, the GenAI
semantic conventions' attributes set as an instrumentation sets them (constants from the
opentelemetry-semantic-conventions package, none typed by hand), content capture on.

The agent reads a few files, then falls into a loop: the same test run, the same failure,
again and again. Its spans go where the arguments say:

  --otlp-http URL   the SDK's OTLP/HTTP exporter (e.g. to a collector)
  --proto DIR       each export batch as an ExportTraceServiceRequest (protobuf), one file
                    each, encoded by the SDK's own OTLP encoder
  --json FILE       each export batch as one line of OTLP JSON (as the Collector's file
                    exporter writes it: hex ids, integer enums, 64-bit ints as strings)

Usage: agent.py --conversation ID [--healthy N] [--loops N] [--style gen_ai|openinference]
                [--batch N] [--export-delay-ms MS]
"""
import argparse
import json
import os
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as G
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from openinference.semconv.trace import (
    MessageAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)

from otlp_json import request_json


class Requests(SpanExporter):
    """Encodes each export batch as the OTLP exporters do, and keeps it."""

    def __init__(self):
        self.requests = []

    def export(self, spans):
        self.requests.append(encode_spans(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def output_messages(text, call_name, call_args):
    return json.dumps([{
        "role": "assistant",
        "parts": [
            {"type": "text", "content": text},
            {"type": "tool_call", "id": "call", "name": call_name, "arguments": call_args},
        ],
        "finish_reason": "tool_call",
    }])


def run(tracer, args):
    step_ns = 200_000_000
    clock = [time.time_ns() - (args.healthy + args.loops + 2) * 2 * step_ns]

    def tick():
        clock[0] += step_ns
        return clock[0]

    oi = args.style == "openinference"
    agent = tracer.start_span("invoke_agent coder", start_time=tick(), attributes=(
        {SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
         SpanAttributes.AGENT_NAME: "coder", SpanAttributes.SESSION_ID: args.conversation}
        if oi else
        {G.GEN_AI_OPERATION_NAME: G.GenAiOperationNameValues.INVOKE_AGENT.value,
         G.GEN_AI_AGENT_NAME: "coder", G.GEN_AI_CONVERSATION_ID: args.conversation}))
    parent = set_span_in_context(agent)
    steps = [("read_file", {"path": f"src/module_{i}.rs"}, f"contents of module {i}: fn handler_{i}() {{}}")
             for i in range(args.healthy)]
    steps += [("run_tests", {"target": "unit", "path": "src/parser.rs"},
               "FAILED test_parse: expected 3, got 4\n1 failed, 41 passed")] * args.loops
    for i, (tool, tool_args, result) in enumerate(steps):
        text = f"Step {i}: I will call {tool} next to check my work."
        if oi:
            llm = {
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.LLM.value,
                SpanAttributes.SESSION_ID: args.conversation,
                SpanAttributes.LLM_MODEL_NAME: "model-x",
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 1200 + 40 * i,
                SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 60,
                f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_CONTENT}": text,
                f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.{MessageAttributes.MESSAGE_TOOL_CALLS}.0.{ToolCallAttributes.TOOL_CALL_FUNCTION_NAME}": tool,
            }
        else:
            llm = {
                G.GEN_AI_OPERATION_NAME: G.GenAiOperationNameValues.CHAT.value,
                G.GEN_AI_CONVERSATION_ID: args.conversation,
                G.GEN_AI_REQUEST_MODEL: "model-x",
                G.GEN_AI_USAGE_INPUT_TOKENS: 1200 + 40 * i,
                G.GEN_AI_USAGE_OUTPUT_TOKENS: 60,
                G.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_call"],
                G.GEN_AI_OUTPUT_MESSAGES: output_messages(text, tool, tool_args),
            }
        chat = tracer.start_span("chat model-x", context=parent, start_time=tick(), attributes=llm)
        chat.end(end_time=tick())
        if oi:
            attrs = {
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
                SpanAttributes.SESSION_ID: args.conversation,
                SpanAttributes.TOOL_NAME: tool,
                SpanAttributes.INPUT_VALUE: json.dumps(tool_args),
                SpanAttributes.OUTPUT_VALUE: result,
            }
        else:
            attrs = {
                G.GEN_AI_OPERATION_NAME: G.GenAiOperationNameValues.EXECUTE_TOOL.value,
                G.GEN_AI_CONVERSATION_ID: args.conversation,
                G.GEN_AI_TOOL_NAME: tool,
                G.GEN_AI_TOOL_CALL_ID: f"call-{i}",
                G.GEN_AI_TOOL_CALL_ARGUMENTS: json.dumps(tool_args),
                G.GEN_AI_TOOL_CALL_RESULT: result,
            }
        span = tracer.start_span(f"execute_tool {tool}", context=parent, start_time=tick(), attributes=attrs)
        if "FAILED" in result:
            span.set_status(Status(StatusCode.ERROR, "tests failed"))
        span.end(end_time=tick())
    agent.end(end_time=tick())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversation", required=True)
    p.add_argument("--healthy", type=int, default=3)
    p.add_argument("--loops", type=int, default=12)
    p.add_argument("--style", choices=["gen_ai", "openinference"], default="gen_ai")
    p.add_argument("--otlp-http")
    p.add_argument("--proto")
    p.add_argument("--json")
    p.add_argument("--batch", type=int, default=16, help="spans per export batch")
    p.add_argument("--export-delay-ms", type=int, default=50,
                   help="the span processor's schedule delay: a batch leaves at latest this long after its first span")
    args = p.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": "coder-agent"}))
    keeper = None
    if args.otlp_http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=args.otlp_http.rstrip("/") + "/v1/traces")
    else:
        exporter = keeper = Requests()
    provider.add_span_processor(BatchSpanProcessor(
        exporter, max_export_batch_size=args.batch, schedule_delay_millis=args.export_delay_ms))
    run(provider.get_tracer("loopwarden.tests.agent"), args)
    provider.force_flush()
    provider.shutdown()
    if keeper is not None:
        if args.proto:
            os.makedirs(args.proto, exist_ok=True)
            for i, r in enumerate(keeper.requests):
                with open(os.path.join(args.proto, f"{i:04}.pb"), "wb") as f:
                    f.write(r.SerializeToString())
        if args.json:
            with open(args.json, "w") as f:
                for r in keeper.requests:
                    f.write(request_json(r) + "\n")


if __name__ == "__main__":
    main()
