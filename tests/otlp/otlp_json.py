"""Spans as one line of OTLP JSON, as the Collector's file exporter writes an export:
encoded by the SDK's own OTLP encoder, hex trace and span ids, integer enums, 64-bit
integers as strings. Shared by the test agents (`tests/otlp/agent.py`,
`tests/frameworks/traced_*.py`)."""

import base64
import json

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans


def hex_ids(value):
    """OTLP JSON writes trace and span ids as hex, where protobuf's JSON writes base64."""
    if isinstance(value, dict):
        return {
            k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hex_ids(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [hex_ids(v) for v in value]
    return value


def request_json(request):
    """An `ExportTraceServiceRequest` as one line of OTLP JSON."""
    doc = hex_ids(MessageToDict(request, use_integers_for_enums=True))
    return json.dumps(doc, separators=(",", ":"))


def spans_json(spans):
    """SDK spans as the one line of OTLP JSON of their export."""
    return request_json(encode_spans(spans))


def trace_to_lines(path):
    """The global tracer provider, each span exported as it ends, as one line of OTLP JSON
    appended to `path` (a long run's steps go out before its agent's span, as a batch
    processor sends them too). Shut it down to close the file."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    out = open(path, "w")

    class Lines(SpanExporter):
        def export(self, spans):
            out.write(spans_json(spans) + "\n")
            out.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self):
            out.close()

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Lines()))
    trace.set_tracer_provider(provider)
    return provider
