"""loopwarden-guard: loopwarden's verdicts acted on inside the agent process.

`Guard` follows the warning and termination topics; each framework adapter
(`loopwarden_guard.pydantic_ai`, ...) puts a warning's hint into the agent's next model
call once and ends the run when its session is terminated. `exporter` has the
OpenTelemetry settings that keep the time from a span's end to a verdict short.
"""

from .guard import DEFAULT_TERMINATED_TOPIC, DEFAULT_WARNING_TOPIC, Finding, Guard, SessionTerminated, Watch
from .hint import HINT_PREFIX, STOP_PREFIX, hint_message, stop_message

__all__ = [
    "DEFAULT_TERMINATED_TOPIC",
    "DEFAULT_WARNING_TOPIC",
    "Finding",
    "Guard",
    "HINT_PREFIX",
    "STOP_PREFIX",
    "SessionTerminated",
    "Watch",
    "hint_message",
    "stop_message",
]
