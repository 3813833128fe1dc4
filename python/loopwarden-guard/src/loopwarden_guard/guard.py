"""Follows loopwarden's verdicts for the sessions of this process.

A `Guard` reads the warning topic from its end and the termination topic from
`remember_terminations_secs` back (each partition assigned directly: no consumer group
to join, so it reads within a fetch of starting), drops copies (at-least-once delivery
publishes a finding twice at worst, with one `event_id`), and hands each finding to the `Watch` of its session: matched on the
session id, or on the OpenTelemetry trace id the finding names (`trigger.trace_id`) when
the watch knows no session id or loopwarden's session is that trace (its spans named
none). A trace may hold several sessions (an evaluation loop under one span, agents
called within one request): a finding of a named session never reaches the watch of
another session by their trace. A warning's hint is given once (`take_hint`) in this
process, to the first watch of its session that takes it (a conversation's next run does
not get it again), and a watch says once its session is terminated (`terminated`,
`check`, `on_terminate`).

Guarantees: thread-safe; a finding for a session watched later (its id learned after
the verdict) is not lost while it is among the last `recent` findings, and an enforced
termination not while it is younger than `remember_terminations_secs` (by its record's
timestamp; at most `max_terminations` of them), in this process or in one started later,
which has read them by the time `start` returns where the broker can look up times (an
agent process restarted by a deploy or a crash resumes its sessions, and loopwarden does
not publish a termination again: it drops a terminated session's events); a termination
in `shadow` or `warn` mode stops nothing; a process forked from one whose guard runs
(a pre-forking server, a worker pool) has a guard of its own, started again at its
first use there (fork copies only the forking thread, not the guard's); a finding the guard cannot read (not JSON, no session) is logged and skipped,
never raised into the agent.
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import math
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("loopwarden_guard")

# The guards started in this process, for the hook that starts them again in a forked
# child.
_started: "weakref.WeakSet[Guard]" = weakref.WeakSet()
#: How long a forked child waits before it tries again to start a guard that failed to.
RESTART_AFTER_SECS = 30.0


def _never_free(handle: Any) -> None:
    """Keeps a parent's librdkafka handle alive in a forked child for good: destroying it
    waits for threads the child does not have (it hangs, or asserts), and a reference
    held by a module is dropped when the interpreter exits (a worker's `sys.exit`)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


def _after_fork_in_child() -> None:
    for guard in list(_started):
        guard._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

DEFAULT_WARNING_TOPIC = "session.warning"
DEFAULT_TERMINATED_TOPIC = "session.terminated"
#: loopwarden's default `engine.session_gap_secs`, the least time loopwarden holds a
#: terminated session (longer while its events keep coming): a run resumed within it
#: of its termination is stopped.
DEFAULT_REMEMBER_TERMINATIONS_SECS = 1800.0
DEFAULT_MAX_TERMINATIONS = 10_000


@dataclass(frozen=True)
class Finding:
    """One `session.warning` or `session.terminated` as loopwarden published it."""

    raw: dict[str, Any]
    #: When this process read it (seconds since the epoch).
    received_at: float = 0.0
    #: When it was published: its record's timestamp, else `received_at`.
    published_at: float = 0.0

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
        self._guard._ensure_running()
        with self._lock:
            if not self._hints:
                return None
            hints, self._hints = self._hints, []
        fresh = self._guard._take_hints(hints)
        return "\n".join(dict.fromkeys(fresh)) or None

    @property
    def terminated(self) -> Finding | None:
        self._guard._ensure_running()
        return self._terminated

    def check(self) -> None:
        """Raises `SessionTerminated` once the session is terminated."""
        self._guard._ensure_running()
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
    watches. `client_config` adds librdkafka settings (security, SASL).

    `remember_terminations_secs`: how long after its publication an enforced termination
    is given to a later watch of its session, and how far back `start` reads them: at
    least loopwarden's `engine.session_gap_secs`, more where agents resume sessions
    later. 0 reads from the end and gives a termination to later watches only while it
    is among the last `recent` findings."""

    def __init__(
        self,
        brokers: str,
        *,
        warning_topic: str = DEFAULT_WARNING_TOPIC,
        terminated_topic: str = DEFAULT_TERMINATED_TOPIC,
        client_config: dict[str, Any] | None = None,
        recent: int = 1000,
        poll_interval: float = 0.1,
        remember_terminations_secs: float = DEFAULT_REMEMBER_TERMINATIONS_SECS,
        max_terminations: int = DEFAULT_MAX_TERMINATIONS,
    ):
        def count(n: Any) -> bool:
            return isinstance(n, int) and not isinstance(n, bool)

        def seconds(n: Any) -> bool:
            return isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) and n >= 0

        wrong = [
            f"{name} must be {rule}, got {value!r}"
            for name, value, rule, ok in [
                ("recent", recent, "a count >= 0", count(recent) and recent >= 0),
                ("remember_terminations_secs", remember_terminations_secs, "a finite number of seconds >= 0",
                 seconds(remember_terminations_secs)),
                ("max_terminations", max_terminations, "a count >= 1", count(max_terminations) and max_terminations >= 1),
            ]
            if not ok
        ]
        if wrong:
            raise ValueError("loopwarden guard: " + "; ".join(wrong))
        self.topics = [warning_topic, terminated_topic]
        self._config = {
            "bootstrap.servers": brokers,
            # Never committed: a group id is only what librdkafka asks for.
            "group.id": f"loopwarden-guard-{uuid.uuid4()}",
            "enable.auto.commit": False,
            # Verdicts are latency-sensitive: a fetch does not sit for 500 ms.
            "fetch.wait.max.ms": 20,
            "isolation.level": "read_committed",
            **(client_config or {}),
            # How the guard knows it has read the terminations published before it
            # started (read_committed: the end of what is committed).
            "enable.partition.eof": True,
        }
        self._clock: Callable[[], float] = time.time
        self._remember_secs = float(remember_terminations_secs)
        self._max_terminations = max_terminations
        # The remembered terminations by session id (in arrival order), and the
        # session ids of their trace ids (a trace may hold several sessions).
        self._terminations: collections.OrderedDict[str, Finding] = collections.OrderedDict()
        self._termination_traces: dict[str, dict[str, None]] = {}
        # (topic, partition) -> the end offset when the guard started, for the
        # termination partitions read from before it.
        self._backlog: dict[tuple[str, int], int] = {}
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
        self._start_timeout = 10.0
        # Set in a forked child whose parent's guard ran: it starts again at first use
        # (not before `_restart_at`, after a start that failed).
        self._forked = False
        self._restart_at = 0.0
        self._restart_lock = threading.Lock()

    # Lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> "Guard":
        """Starts following; returns once every partition is assigned and the
        terminations of the last `remember_terminations_secs` are read."""
        _started.add(self)
        self._start_timeout = timeout
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="loopwarden-guard", daemon=True)
            self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(
                f"loopwarden guard: topics {self.topics} not assigned, or the terminations of the last "
                f"{self._remember_secs:g} s not read, within {timeout} s"
            )
        if self.error is not None:
            raise self.error
        return self

    def close(self) -> None:
        self._stop.set()
        self._forked = False
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _after_fork(self) -> None:
        """In a forked child (the one thread there): the parent's consumer thread did not
        come along, so the guard starts again at its first use here. What a parent thread
        may have held or been half-way through at the fork is made anew: the locks, the
        stop event, the ids seen (a finding seen but not yet remembered would be taken
        for a copy when read back)."""
        stopped = self._stop.is_set()
        self._stop = threading.Event()
        if stopped:
            self._stop.set()
        self._lock = threading.Lock()
        self._restart_lock = threading.Lock()
        for w in self._watches:
            w._lock = threading.Lock()
        if self._thread is None or stopped:
            return  # not started, or closed
        if self._consumer is not None:
            _never_free(self._consumer)
        self._seen = collections.OrderedDict()
        self._reset_consumer()
        self._forked = True

    def _reset_consumer(self) -> None:
        self._thread = None
        self._consumer = None
        self._ready = threading.Event()
        self._backlog = {}
        self.error = None

    def _ensure_running(self) -> None:
        """Starts the guard again in a forked child, at its first use there (a pool's
        worker that never watches a session never connects); other threads wait for it.
        Never raises into the agent: a start that fails is logged, its sessions go
        unguarded, and it is tried again at a use `RESTART_AFTER_SECS` later."""
        if not self._forked or self._clock() < self._restart_at:
            return
        with self._restart_lock:
            if not self._forked or self._clock() < self._restart_at:
                return
            try:
                self.start(self._start_timeout)
                log.info("loopwarden guard: started again in forked process %d", os.getpid())
            except TimeoutError as e:
                # Its thread goes on, and is ready when it is.
                log.warning("loopwarden guard: forked process %d: %s", os.getpid(), e)
            except Exception as e:
                log.error(
                    "loopwarden guard: not started again in forked process %d (%s); its sessions are unguarded "
                    "until a try %g s from now",
                    os.getpid(),
                    e,
                    RESTART_AFTER_SECS,
                )
                self._reset_consumer()
                self._restart_at = self._clock() + RESTART_AFTER_SECS
                return
            self._forked = False

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
        self._ensure_running()
        with self._lock:
            if session_id:
                w.session_ids.add(session_id)
            if trace_id:
                w.trace_ids.add(trace_id.lower())
            earlier = [f for f in self._recent if w._matches(f)]
            earlier += [f for f in self._remembered(session_id, trace_id) if w._matches(f)]
        for f in earlier:
            w._deliver(f)

    def _remembered(self, session_id: str | None, trace_id: str | None) -> list[Finding]:
        """The remembered terminations younger than the window of `session_id`, and of
        the sessions of `trace_id`, under the lock."""
        cutoff = self._clock() - self._remember_secs
        self._forget_terminations_before(cutoff)
        keys = [session_id]
        if trace_id:
            keys += self._termination_traces.get(trace_id.lower(), ())
        found = (self._terminations.get(k) for k in dict.fromkeys(keys) if k is not None)
        # Arrival order is publication order only within a partition: each its own age.
        return [f for f in found if f is not None and f.published_at >= cutoff]

    def _remember(self, f: Finding) -> None:
        """Keeps an enforced termination for later watches (under the lock)."""
        if self._remember_secs <= 0 or f.published_at < self._clock() - self._remember_secs:
            return
        key = f.session_id or ""
        earlier = self._terminations.pop(key, None)
        if earlier is not None:
            self._forget_trace_of(key, earlier)
        self._terminations[key] = f
        if f.trace_id:
            self._termination_traces.setdefault(f.trace_id, {})[key] = None
        while len(self._terminations) > self._max_terminations:
            self._forget_trace_of(*self._terminations.popitem(last=False))

    def _forget_terminations_before(self, cutoff: float) -> None:
        # From the oldest arrival on, up to the first young one: the rest go at a later
        # call (`_remembered` checks each one's age).
        while self._terminations:
            key, f = next(iter(self._terminations.items()))
            if f.published_at >= cutoff:
                return
            self._terminations.popitem(last=False)
            self._forget_trace_of(key, f)

    def _forget_trace_of(self, key: str, f: Finding) -> None:
        sessions = self._termination_traces.get(f.trace_id or "")
        if sessions is not None:
            sessions.pop(key, None)
            if not sessions:
                del self._termination_traces[f.trace_id or ""]

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
            from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

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
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    parts.append(TopicPartition(topic, p, high if high >= 0 else OFFSET_END))
                    if topic == self.topics[1] and self._remember_secs > 0 and 0 <= low < high:
                        self._backlog[(topic, p)] = high
            self._read_back_from(consumer, parts)
            consumer.assign(parts)
        except BaseException as e:  # reported by start()
            self.error = e
            self._ready.set()
            if self._consumer is not None:
                self._consumer.close()
            return
        read_back = 0
        if not self._backlog:
            self._ready.set()
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self._poll_interval)
                if msg is None:
                    continue
                at = (msg.topic(), msg.partition())
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("loopwarden guard: consumer error: %s", msg.error())
                    elif self._backlog.pop(at, None) is not None and not self._backlog:
                        log.info("loopwarden guard: read %d terminations published before it started", read_back)
                        self._ready.set()
                    continue
                end = self._backlog.get(at)
                before_start = end is not None and msg.offset() < end
                kind, stamp = msg.timestamp()
                # None where the record has no time (an old message format).
                published_at = stamp / 1000 if kind != 0 and stamp > 0 else None
                try:
                    found = self._take(
                        msg.value(),
                        f"{msg.topic()}[{msg.partition()}]@{msg.offset()}",
                        published_at,
                        before_start,
                    )
                    read_back += before_start and found is not None
                except Exception:  # one bad finding must not end the guard
                    log.exception("loopwarden guard: a finding could not be handled")
        finally:
            consumer.close()

    def _read_back_from(self, consumer: Any, parts: list[Any]) -> None:
        """Moves the start of each termination partition in `_backlog` (non-empty, `parts`
        at its end) back to its first record of the last `remember_terminations_secs`, as
        the broker finds it; a partition it finds none in (or cannot say) stays at its end."""
        from confluent_kafka import TopicPartition

        since_ms = int((self._clock() - self._remember_secs) * 1000)
        asked = [TopicPartition(topic, p, since_ms) for topic, p in self._backlog]
        try:
            found = consumer.offsets_for_times(asked, timeout=10) if asked else []
        except Exception as e:  # a broker that cannot look up times: from the end
            log.warning("loopwarden guard: no terminations read back from before it started: %s", e)
            found = []
        for f in found:
            if f.error is not None:
                log.warning("loopwarden guard: no terminations read back on %s[%d]: %s", f.topic, f.partition, f.error)
        starts = {(f.topic, f.partition): f.offset for f in found if f.error is None and f.offset >= 0}
        for part in parts:
            at = (part.topic, part.partition)
            if at not in self._backlog:
                continue
            start = starts.get(at)
            if start is None or start >= part.offset:
                del self._backlog[at]
            else:
                part.offset = start

    def handle(self, payload: bytes | str | None, where: str = "") -> Finding | None:
        """Takes one published finding (what the consumer read); returns it, or None
        when it was a copy or unreadable."""
        return self._take(payload, where, None, False)

    def _take(
        self, payload: bytes | str | None, where: str, published_at: float | None, before_start: bool
    ) -> Finding | None:
        try:
            raw = json.loads(payload or b"")
            if not isinstance(raw, dict) or not isinstance(raw.get("session_id"), str) or not raw["session_id"]:
                raise ValueError("not a finding with a session_id")
            if not isinstance(raw.get("event_id", ""), str) or not isinstance(raw.get("trigger", {}), (dict, type(None))):
                raise ValueError("event_id or trigger of the wrong type")
        except ValueError as e:
            log.warning("loopwarden guard: skipping an unreadable finding at %s: %s", where, e)
            return None
        now = self._clock()
        f = Finding(raw, received_at=now, published_at=published_at or now)
        if before_start and (not f.stops or published_at is None or published_at < now - self._remember_secs):
            # Read back for the sessions it stopped, and no further than asked: a
            # broker's look-up may be coarse (from the first record, or one produced
            # late), and a record without a time may be of any age (a stale one would
            # stop a later run of a reused session id).
            return None
        with self._lock:
            if f.event_id:
                if f.event_id in self._seen:
                    return None
                self._seen[f.event_id] = None
                if len(self._seen) > 10 * (self._recent.maxlen or 1000):
                    self._seen.popitem(last=False)
            self._recent.append(f)
            if f.stops:
                self._remember(f)
            watches = [w for w in self._watches if w._matches(f)]
        for w in watches:
            w._deliver(f)
        return f

