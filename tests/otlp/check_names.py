"""Holds loopwarden's OTLP mapping to the conventions' own names: every attribute name
and operation value it reads (JSON on stdin, as `loopwarden::otlp::attr` lists them)
must be a constant of the published packages, so a look-alike typed by hand fails here.

- gen_ai: opentelemetry-semantic-conventions' GenAI attributes (and the values of
  gen_ai.operation.name);
- otel: its general attributes (session.id, error.type, service.name, exception.type and
  exception.message);
- openinference: openinference-semantic-conventions (span, message and tool-call
  attributes, and the values of openinference.span.kind).

Prints what it checked; exits 1 listing every name it could not find.
"""
import json
import sys

from opentelemetry.semconv._incubating.attributes import (
    error_attributes,
    gen_ai_attributes,
    session_attributes,
)
from opentelemetry.semconv.attributes import error_attributes as stable_error_attributes
from opentelemetry.semconv.attributes import exception_attributes
from opentelemetry.semconv.attributes import service_attributes

from openinference.semconv.trace import (
    MessageAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)


def constants(*holders):
    return {
        getattr(h, n)
        for h in holders
        for n in dir(h)
        if n.isupper() and isinstance(getattr(h, n), str)
    }


known = {
    "gen_ai": constants(gen_ai_attributes),
    "otel": constants(
        session_attributes,
        error_attributes,
        stable_error_attributes,
        exception_attributes,
        service_attributes,
    ),
    "openinference": constants(SpanAttributes, MessageAttributes, ToolCallAttributes),
}
values = {
    "gen_ai": {v.value for v in gen_ai_attributes.GenAiOperationNameValues},
    "openinference": {v.value for v in OpenInferenceSpanKindValues},
}

mapping = json.load(sys.stdin)
missing = []
for name, convention in mapping["attributes"]:
    if name not in known[convention]:
        missing.append(f"attribute {name!r} is not a {convention} attribute")
for value, convention in mapping["operations"]:
    if value not in values[convention]:
        missing.append(f"value {value!r} is not a {convention} operation / span kind")
print(f"checked {len(mapping['attributes'])} attribute names and {len(mapping['operations'])} values")
if missing:
    print("\n".join(missing))
    sys.exit(1)
