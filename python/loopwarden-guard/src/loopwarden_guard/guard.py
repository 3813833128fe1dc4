"""Follows loopwarden's verdicts for the sessions of this process.

A `Guard` reads the warning and termination topics from their end (each partition
assigned directly: no consumer group to join, so it reads within a fetch of starting),
drops copies (at-least-once delivery publishes a finding twice at worst, with one
`event_id`), and hands each finding to the `Watch` of its session: matched on the
session id, or on the OpenTelemetry trace id the finding names (`trigger.trace_id`) when
the watch knows no session id or loopwarden's session is that trace (its spans named
none). A trace may hold several sessions (an evaluation loop under one span, agents
called within one request): a finding of a named session never reaches the watch of
another session by their trace. A warning's hint is given once (`take_hint`) in this
process, to the first watch of its session that takes it (a conversation's next run does
not get it again), and a watch says once its session is terminated (`terminated`,
`check`, `on_terminate`).

Guarantees: thread-safe; a finding for a session watched later (its id learned after
the verdict) is not lost while it is among the last `recent` findings; a termination in
`shadow` or `warn` mode stops nothing; a finding the guard cannot read (not JSON, no
session) is logged and skipped, never raised into the agent.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("loopwarden_guard")

DEFAULT_WARNING_TOPIC = "session.warning"
DEFAULT_TERMINATED_TOPIC = "session.terminated"


@dataclass(frozen=True)
class Finding:
    """One `session.warning` or `session.terminated` as loopwarden published it."""

    raw: dict[str, Any]
    #: When this process read it (seconds since the epoch).
    received_at: float = 0.0

    @property
    def event_id(self) -> str:
        return str(self.raw.get("event_id", ""))

    @property
    def session_id(self) -> str | None:
        return self.raw.get("session_id")

    @property
    def trace_id(self) -> str | None:
        trigger = self.raw.get("trigger")
        tid = trigger.get("trace_id") if isinstance(trigger, dict) else None
        return tid.lower() if isinstance(tid, str) else None

    @property
    def detector(self) -> str:
        return str(self.raw.get("detector", ""))

    @property
    def level(self) -> str:
        return str(self.raw.get("level", ""))

    @property
    def reason(self) -> str:
        return str(self.raw.get("reason", ""))

    @property
    def hint(self) -> str | None:
        return self.raw.get("hint")

    @property
    def stops(self) -> bool:
        """A termination that is enforced (not a shadow or warn-only verdict)."""
        return self.raw.get("type") == "session.terminated" and self.raw.get("mode") == "enforce"


class SessionTerminated(RuntimeError):
    """Raised into an agent's run when loopwarden has terminated its session."""

    def __init__(self, finding: Finding):
        self.finding = finding
        super().__init__(
            f"loopwarden terminated session {finding.session_id}: "
            f"{finding.detector}: {finding.reason}"
        )


@dataclass
class Watch:
    """The verdicts of one agent session (or run), as they arrive."""

    _guard: "Guard"
    session_ids: set[str] = field(default_factory=set)
    trace_ids: set[str] = field(default_factory=set)
    #: (event_id, hint) of the warnings not taken yet.
    _hints: list[tuple[str, str]] = field(default_factory=list)
    _terminated: Finding | None = None
    _callbacks: list[Callable[[Finding], None]] = field(default_factory=list)
    _delivered: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def also(self, *, session_id: str | None = None, trace_id: str | None = None) -> "Watch":
        """Matches this session under another id too (e.g. the trace id once known)."""
        self._guard._add_ids(self, session_id, trace_id)
        return self

    def take_hint(self) -> str | None:
        """The hints of the warnings since the last call, once each; None when none.

        Once each across watches too: a warning whose hint one watch took is not given
        to the next watch of its session (a conversation's next run)."""
        with self._lock:
            if not self._hints:
                return None
            hints, self._hints = self._hints, []
        fresh = self._guard._take_hints(hints)
        return "\n".join(dict.fromkeys(fresh)) or None

    @property
    def terminated(self) -> Finding | None:
        return self._terminated

    def check(self) -> None:
        """Raises `SessionTerminated` once the session is terminated."""
        if self._terminated is not None:
            raise SessionTerminated(self._terminated)

    def on_terminate(self, callback: Callable[[Finding], None]) -> None:
        """Calls `callback(finding)` once, from the guard's thread, on termination (at
        once when it already happened): where a framework offers a thread-safe cancel."""
        with self._lock:
            done = self._terminated
            if done is None:
                self._callbacks.append(callback)
        if done is not None:
            callback(done)

    def close(self) -> None:
        self._guard._forget(self)

    def _matches(self, f: Finding) -> bool:
        if f.session_id in self.session_ids:
            return True
        if f.trace_id is None or f.trace_id not in self.trace_ids:
            return False
        # By the trace only where it cannot be another session's: this watch knows no
        # session id, or loopwarden's session is the trace itself.
        return not self.session_ids or (f.session_id or "").lower() == f.trace_id

    def _deliver(self, f: Finding) -> None:
        callbacks: list[Callable[[Finding], None]] = []
        with self._lock:
            # Each finding once, however it came (live, or replayed by `also`).
            if f.event_id:
                if f.event_id in self._delivered:
                    return
                self._delivered.add(f.event_id)
            if f.stops:
                if self._terminated is None:
                    self._terminated = f
                    callbacks, self._callbacks = self._callbacks, []
            elif f.hint and self._terminated is None:
                self._hints.append((f.event_id, f.hint))
        for cb in callbacks:
            try:
                cb(f)
            except Exception:  # a framework's cancel must not kill the guard
                log.exception("loopwarden guard: on_terminate callback failed")


class Guard:
    """Follows `warning_topic` and `terminated_topic` on `brokers` for this process's
    watches. `client_config` adds librdkafka settings (security, SASL)."""

    def __init__(
        self,
        brokers: str,
        *,
        warning_topic: str = DEFAULT_WARNING_TOPIC,
        terminated_topic: str = DEFAULT_TERMINATED_TOPIC,
        client_config: dict[str, Any] | None = None,
        recent: int = 1000,
        poll_interval: float = 0.1,
    ):
        self.topics = [warning_topic, terminated_topic]
        self._config = {
            "bootstrap.servers": brokers,
            # Never committed: a group id is only what librdkafka asks for.
            "group.id": f"loopwarden-guard-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # Verdicts are latency-sensitive: a fetch does not sit for 500 ms.
            "fetch.wait.max.ms": 20,
            "isolation.level": "read_committed",
            **(client_config or {}),
        }
        self._poll_interval = poll_interval
        self._watches: list[Watch] = []
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        # The warnings whose hint a watch took (bounded as `_seen`).
        self._hinted: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._recent: collections.deque[Finding] = collections.deque(maxlen=recent)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer = None
        self.error: BaseException | None = None

    # Lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> "Guard":
        """Starts following; returns once every partition is assigned from its end."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loopwarden-guard", daemon=True)
            self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"loopwarden guard: topics {self.topics} not assigned within {timeout} s")
        if self.error is not None:
            raise self.error
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "Guard":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Watches ---------------------------------------------------------------------

    def watch(self, session_id: str | None = None, trace_id: str | None = None) -> Watch:
        """A watch for one session, by its session id and/or trace id (hex)."""
        w = Watch(self)
        with self._lock:
            self._watches.append(w)
        self._add_ids(w, session_id, trace_id)
        return w

    def _add_ids(self, w: Watch, session_id: str | None, trace_id: str | None) -> None:
        with self._lock:
            if session_id:
                w.session_ids.add(session_id)
            if trace_id:
                w.trace_ids.add(trace_id.lower())
            earlier = [f for f in self._recent if w._matches(f)]
        for f in earlier:
            w._deliver(f)

    def _take_hints(self, hints: list[tuple[str, str]]) -> list[str]:
        """The hints of `hints` no watch took before, now marked taken."""
        fresh = []
        with self._lock:
            for event_id, hint in hints:
                if event_id:
                    if event_id in self._hinted:
                        continue
                    self._hinted[event_id] = None
                    if len(self._hinted) > 10 * (self._recent.maxlen or 1000):
                        self._hinted.popitem(last=False)
                fresh.append(hint)
        return fresh

    def _forget(self, w: Watch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    # The consumer ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            from confluent_kafka import OFFSET_END, Consumer, TopicPartition

            consumer = Consumer(self._config)
            self._consumer = consumer
            parts = []
            for topic in self.topics:
                md = consumer.list_topics(topic, timeout=10)
                t = md.topics.get(topic)
                if t is None or t.error is not None or not t.partitions:
                    raise RuntimeError(
                        f"loopwarden guard: topic {topic!r} not found on {self._config['bootstrap.servers']}"
                        + (f" ({t.error})" if t is not None and t.error else "")
                    )
                for p in sorted(t.partitions):
                    # The end as it is now, a concrete offset: OFFSET_END would be
                    # looked up later, and a finding published meanwhile skipped.
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    parts.append(TopicPartition(topic, p, high if high >= 0 else OFFSET_END))
            consumer.assign(parts)
        except BaseException as e:  # reported by start()
            self.error = e
            self._ready.set()
            if self._consumer is not None:
                self._consumer.close()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self._poll_interval)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("loopwarden guard: consumer error: %s", msg.error())
                    continue
                try:
                    self.handle(msg.value(), where=f"{msg.topic()}[{msg.partition()}]@{msg.offset()}")
                except Exception:  # one bad finding must not end the guard
                    log.exception("loopwarden guard: a finding could not be handled")
        finally:
            consumer.close()

    def handle(self, payload: bytes | str | None, where: str = "") -> Finding | None:
        """Takes one published finding (what the consumer read); returns it, or None
        when it was a copy or unreadable."""
        try:
            raw = json.loads(payload or b"")
            if not isinstance(raw, dict) or not isinstance(raw.get("session_id"), str) or not raw["session_id"]:
                raise ValueError("not a finding with a session_id")
            if not isinstance(raw.get("event_id", ""), str) or not isinstance(raw.get("trigger", {}), (dict, type(None))):
                raise ValueError("event_id or trigger of the wrong type")
        except ValueError as e:
            log.warning("loopwarden guard: skipping an unreadable finding at %s: %s", where, e)
            return None
        f = Finding(raw, received_at=time.time())
        with self._lock:
            if f.event_id:
                if f.event_id in self._seen:
                    return None
                self._seen[f.event_id] = None
                if len(self._seen) > 10 * (self._recent.maxlen or 1000):
                    self._seen.popitem(last=False)
            self._recent.append(f)
            watches = [w for w in self._watches if w._matches(f)]
        for w in watches:
            w._deliver(f)
        return f

