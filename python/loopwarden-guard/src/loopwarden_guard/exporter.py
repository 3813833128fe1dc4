"""OpenTelemetry settings that keep the time from a span's end to loopwarden's verdict
short. With the SDK's defaults the batch span processor waits up to 5 s before it
exports: most of the latency between an agent's step and its termination.

    from loopwarden_guard.exporter import low_latency_env, span_processor
    provider.add_span_processor(span_processor(OTLPSpanExporter(...)))
"""

from __future__ import annotations

from typing import Any

# Export within 200 ms of a span's end; OpenInference: leave the flattened input
# history out of LLM spans (loopwarden reads outputs), so the SDK's 128-attribute limit
# never evicts the token counts of a long conversation.
LOW_LATENCY_ENV = {
    "OTEL_BSP_SCHEDULE_DELAY": "200",
    "OPENINFERENCE_HIDE_INPUT_MESSAGES": "true",
}


def low_latency_env() -> dict[str, str]:
    """Environment variables to set before the SDK and instrumentations start."""
    return dict(LOW_LATENCY_ENV)


def span_processor(exporter: Any, schedule_delay_millis: int = 200) -> Any:
    """A batch span processor that exports every `schedule_delay_millis`."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_millis)


# What a step span inherits from its parent when it has none of its own: the agent's
# name and the session. Frameworks set them on the agent's span, which ends (and is
# exported) after its steps, so loopwarden cannot look them up from the steps alone.
INHERITED = ("gen_ai.agent.name", "agent.name", "gen_ai.conversation.id", "session.id")


def step_attributes_processor() -> Any:
    """A span processor that copies the agent name and session attributes from a span's
    parent onto it when it starts (register it before the exporting processor)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    class StepAttributes(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            parent = trace.get_current_span(parent_context)
            attrs = getattr(parent, "attributes", None) or {}
            own = span.attributes or {}
            for key in INHERITED:
                if key in attrs and key not in own:
                    span.set_attribute(key, attrs[key])

    return StepAttributes()
