"""The current OpenTelemetry trace, when the agent is traced (no hard dependency)."""

from __future__ import annotations


def current_trace_id() -> str | None:
    """The hex trace id of the span current in this context, or None."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x")
