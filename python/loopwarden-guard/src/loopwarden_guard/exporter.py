"""OpenTelemetry settings that keep the time from a span's end to loopwarden's verdict
short. With the SDK's defaults the batch span processor waits up to 5 s before it
exports: most of the latency between an agent's step and its termination.

    from loopwarden_guard.exporter import low_latency_env, span_processor
    provider.add_span_processor(span_processor(OTLPSpanExporter(...)))
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Iterator

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
SESSION_KEYS = ("gen_ai.conversation.id", "session.id")
AGENT_NAMES = ("gen_ai.agent.name", "agent.name")
OPENINFERENCE_KIND = "openinference.span.kind"

_agent_name: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "loopwarden_guard_agent_name", default=None
)


@contextmanager
def using_agent(name: str) -> Iterator[None]:
    """Names the agent of every span started inside the block that names none (for
    frameworks whose spans name no agent, LangGraph's); needs `step_attributes_processor`."""
    token = _agent_name.set(name)
    try:
        yield
    finally:
        _agent_name.reset(token)


def step_attributes_processor() -> Any:
    """A span processor that copies the agent name and session attributes from a span's
    parent onto it when it starts (register it before the exporting processor).

    A span's agent is, in order: its own agent name; an OpenInference `AGENT` span's own
    name (the OpenAI Agents SDK's instrumentation names the span after the agent when it
    starts, and sets `agent.name` only when it ends); its parent's agent name, or its
    parent's name if that is an OpenInference `AGENT` span; the name given to
    `using_agent`."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    class StepAttributes(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            parent = trace.get_current_span(parent_context)
            attrs = getattr(parent, "attributes", None) or {}
            own = span.attributes or {}
            for key in SESSION_KEYS:
                if key in attrs and key not in own:
                    span.set_attribute(key, attrs[key])
            if any(key in own for key in AGENT_NAMES):
                return
            if own.get(OPENINFERENCE_KIND) == "AGENT" and span.name:
                span.set_attribute("gen_ai.agent.name", span.name)
            elif any(key in attrs for key in AGENT_NAMES):
                for key in AGENT_NAMES:
                    if key in attrs:
                        span.set_attribute(key, attrs[key])
            elif attrs.get(OPENINFERENCE_KIND) == "AGENT" and getattr(parent, "name", None):
                span.set_attribute("gen_ai.agent.name", parent.name)
            elif _agent_name.get():
                span.set_attribute("gen_ai.agent.name", _agent_name.get())

    return StepAttributes()
