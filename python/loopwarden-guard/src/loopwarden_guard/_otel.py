"""The current OpenTelemetry trace, when the agent is traced (no hard dependency)."""

from __future__ import annotations


def follow_current_trace(watch) -> None:
    """Matches `watch` on the current trace too (a verdict on a session that is the
    trace), once."""
    trace_id = current_trace_id()
    if trace_id and trace_id not in watch.trace_ids:
        watch.also(trace_id=trace_id)


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
