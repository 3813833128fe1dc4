"""How a hint is put before the model, and how a stop says why."""

HINT_PREFIX = "[loopwarden]"


STOP_PREFIX = "Stopped by loopwarden"


def stop_message(finding) -> str:
    """What an agent run ended by a termination says (its detector and reason)."""
    return f"{STOP_PREFIX} ({finding.detector}): {finding.reason}"


def hint_message(hint: str) -> str:
    """The text added to the agent's next model call for a warning's hint."""
    return (
        f"{HINT_PREFIX} A monitor watching this session says: {hint} "
        "Change course now; if the loop goes on, the session will be stopped."
    )
