"""How a hint is put before the model."""

HINT_PREFIX = "[loopwarden]"


def hint_message(hint: str) -> str:
    """The text added to the agent's next model call for a warning's hint."""
    return (
        f"{HINT_PREFIX} A monitor watching this session says: {hint} "
        "Change course now; if the loop goes on, the session will be stopped."
    )
