"""The guard against a real broker: findings produced onto the topics as loopwarden
publishes them reach the watch of their session, once each.

Run by `cargo test --test guard` (which starts the broker, makes the topics and sets
LOOPWARDEN_GUARD_BROKERS, LOOPWARDEN_GUARD_WARNING_TOPIC, LOOPWARDEN_GUARD_TERMINATED_TOPIC).
"""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from confluent_kafka import Producer  # noqa: E402

from loopwarden_guard import Guard, SessionTerminated  # noqa: E402
from loopwarden_guard.guard import RESTART_AFTER_SECS  # noqa: E402

BROKERS = os.environ["LOOPWARDEN_GUARD_BROKERS"]
WARNINGS = os.environ["LOOPWARDEN_GUARD_WARNING_TOPIC"]
TERMINATIONS = os.environ["LOOPWARDEN_GUARD_TERMINATED_TOPIC"]


def finding(kind, session, event_id, *, hint="Stop repeating run_tests.", mode="enforce", trace_id=None):
    trigger = {"topic": "in", "partition": 0, "offset": 1, "event_id": "e1"}
    if trace_id:
        trigger["trace_id"] = trace_id
    return {
        "type": f"session.{kind}",
        "schema_version": 1,
        "event_id": event_id,
        "session_id": session,
        "detector": "repeat",
        "level": "terminate" if kind == "terminated" else "warning",
        "reason": "the same call 4 times",
        "hint": hint,
        "mode": mode,
        "trigger": trigger,
    }


def read_ids(guard):
    """The event ids among `guard`'s recent findings, as its thread has them now."""
    with guard._lock:
        return {f.event_id for f in guard._recent}


def exit_code(pid, timeout):
    """The exit code of child `pid`, killed when it has not exited within `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "killed: did not exit in time"


def eventually(check, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("not within the time")


class GuardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.producer = Producer({"bootstrap.servers": BROKERS})
        cls.guard = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()

    @classmethod
    def tearDownClass(cls):
        cls.guard.close()

    def publish(self, topic, value, raw=None, timestamp=0):
        payload = raw if raw is not None else json.dumps(value).encode()
        key = value["session_id"].encode() if value else None
        # `timestamp` (ms since the epoch): the record's CreateTime; 0 is now.
        self.producer.produce(topic, payload, key=key, timestamp=timestamp)
        self.producer.flush(10)

    def test_each_hint_once_and_copies_dropped(self):
        w = self.guard.watch(session_id="s-hint")
        self.publish(WARNINGS, finding("warning", "s-hint", "w1", hint="Try another approach."))
        self.assertEqual(eventually(w.take_hint), "Try another approach.")
        # The same finding again (an at-least-once copy): no second hint.
        self.publish(WARNINGS, finding("warning", "s-hint", "w1", hint="Try another approach."))
        # Another session's warning: not this watch's.
        self.publish(WARNINGS, finding("warning", "s-other", "w2", hint="Not yours."))
        marker = finding("warning", "s-hint", "w3", hint="Second warning.")
        self.publish(WARNINGS, marker)
        self.assertEqual(eventually(w.take_hint), "Second warning.")
        self.assertIsNone(w.take_hint())
        self.assertIsNone(w.terminated)

    def test_a_termination_matched_by_trace_stops_and_calls_back(self):
        trace = "0af7651916cd43dd8448eb211c80319c"
        # The agent knows its trace, not the session id loopwarden used.
        w = self.guard.watch(trace_id=trace.upper())
        called = threading.Event()
        w.on_terminate(lambda f: called.set())
        self.publish(TERMINATIONS, finding("terminated", "trace-session", "t1", trace_id=trace))
        eventually(lambda: w.terminated)
        self.assertTrue(called.wait(5))
        with self.assertRaises(SessionTerminated) as raised:
            w.check()
        self.assertIn("repeat", str(raised.exception))
        # A hint after the termination is no use: none is given.
        self.publish(WARNINGS, finding("warning", "trace-session", "w9", trace_id=trace))
        eventually(lambda: "w9" in read_ids(self.guard))
        self.assertIsNone(w.take_hint())

    def test_a_session_in_a_shared_trace_gets_only_its_own_verdicts(self):
        # Two conversations run under one trace (an evaluation loop under one span).
        trace = "1f" * 16
        a = self.guard.watch(session_id="conv-a", trace_id=trace)
        b = self.guard.watch(session_id="conv-b", trace_id=trace)
        self.publish(TERMINATIONS, finding("terminated", "conv-a", "t10", trace_id=trace))
        eventually(lambda: a.terminated)
        # A later finding of b's, handed on after t10 by the guard's one thread: by the
        # time it is b's, t10 went wherever it was going.
        self.publish(WARNINGS, finding("warning", "conv-b", "w13", hint="b's own"))
        self.assertEqual(eventually(b.take_hint), "b's own")
        self.assertIsNone(b.terminated)
        b.check()
        # A later conversation in that trace does not inherit it either.
        c = self.guard.watch(session_id="conv-c", trace_id=trace)
        self.assertIsNone(c.terminated)
        # Where loopwarden's session is the trace itself (the spans named none), the
        # finding is the trace's, and reaches its watches.
        self.publish(WARNINGS, finding("warning", trace, "w10", hint="trace-wide", trace_id=trace.upper()))
        self.assertEqual(eventually(b.take_hint), "trace-wide")
        for w in (a, b, c):
            w.close()

    def test_a_hint_taken_is_not_given_to_the_sessions_next_watch(self):
        # A conversation's runs, one watch each: the second run does not get the hint
        # the first one already put into a model call.
        first = self.guard.watch(session_id="conv-turns")
        self.publish(WARNINGS, finding("warning", "conv-turns", "w11", hint="once per warning"))
        self.assertEqual(eventually(first.take_hint), "once per warning")
        first.close()
        second = self.guard.watch(session_id="conv-turns")
        self.assertIsNone(second.take_hint())
        # A warning after it is the second run's.
        self.publish(WARNINGS, finding("warning", "conv-turns", "w12", hint="the next one"))
        self.assertEqual(eventually(second.take_hint), "the next one")
        second.close()

    def test_shadow_and_warn_mode_terminations_stop_nothing(self):
        w = self.guard.watch(session_id="s-shadow")
        self.publish(TERMINATIONS, finding("terminated", "s-shadow", "t2", mode="shadow"))
        self.publish(TERMINATIONS, finding("terminated", "s-shadow", "t3", mode="warn"))
        eventually(lambda: {"t2", "t3"} <= read_ids(self.guard))
        self.assertIsNone(w.terminated)
        w.check()

    def test_a_verdict_before_the_id_was_known_is_not_lost(self):
        self.publish(TERMINATIONS, finding("terminated", "s-late", "t4"))
        eventually(lambda: "t4" in read_ids(self.guard))
        w = self.guard.watch()
        self.assertIsNone(w.terminated)
        w.also(session_id="s-late")
        self.assertIsNotNone(w.terminated)

    def test_a_hint_replayed_by_also_is_not_given_twice(self):
        w = self.guard.watch(session_id="s-twice")
        self.publish(WARNINGS, finding("warning", "s-twice", "w6", hint="once", trace_id="ab" * 16))
        self.assertEqual(eventually(w.take_hint), "once")
        # Learning the trace id replays the recent findings of it: not this one again.
        w.also(trace_id="ab" * 16)
        self.assertIsNone(w.take_hint())

    def test_unreadable_findings_are_skipped(self):
        w = self.guard.watch(session_id="s-bad")
        self.publish(WARNINGS, None, raw=b"not json")
        self.publish(WARNINGS, None, raw=b'{"no": "session"}')
        self.publish(WARNINGS, None, raw=b'{"session_id": ["s-bad"], "event_id": "x1"}')
        self.publish(WARNINGS, None, raw=b'{"session_id": "s-bad", "event_id": "x2", "trigger": "oops"}')
        self.publish(WARNINGS, finding("warning", "s-bad", "w5", hint="after garbage"))
        self.assertEqual(eventually(w.take_hint), "after garbage")

    def test_a_termination_published_while_no_guard_ran_stops_the_resumed_session(self):
        # An agent process restarted (a deploy, a crash) resumes the sessions it ran:
        # a termination published while it was down is theirs, and loopwarden does not
        # say it again (it drops a terminated session's events).
        self.publish(TERMINATIONS, finding("terminated", "s-resumed", "t20"))
        an_hour_ago = int((time.time() - 3600) * 1000)
        self.publish(TERMINATIONS, finding("terminated", "s-long-ago", "t21"), timestamp=an_hour_ago)
        self.publish(WARNINGS, finding("warning", "s-resumed", "w20", hint="given before the restart"))
        restarted = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()
        try:
            # Read by the time `start` returned: the resumed run's first check stops it.
            resumed = restarted.watch(session_id="s-resumed")
            with self.assertRaises(SessionTerminated):
                resumed.check()
            # Hints are for the next model call of the run that looped, not the resumed one.
            self.assertIsNone(resumed.take_hint())
            # Older than the terminations it remembers (30 minutes by default): not this run's.
            self.assertIsNone(restarted.watch(session_id="s-long-ago").terminated)
        finally:
            restarted.close()
        shorter = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS, remember_terminations_secs=0)
        with shorter:
            self.assertIsNone(shorter.watch(session_id="s-resumed").terminated)

    def test_a_termination_is_remembered_past_the_recent_findings(self):
        # A busy fleet's warnings push a termination out of the last `recent` findings
        # before the session's next run is watched: the termination still reaches it.
        with Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS, recent=3) as guard:
            self.publish(TERMINATIONS, finding("terminated", "s-busy", "t22"))
            # Read before the warnings (the two topics are read in no fixed order).
            eventually(lambda: "t22" in read_ids(guard))
            for i in range(5):
                self.publish(WARNINGS, finding("warning", f"s-other-{i}", f"w3{i}"))
            # All read, in whatever order their partitions gave them.
            eventually(lambda: {f"w3{i}" for i in range(5)} <= guard._seen.keys())
            self.assertNotIn("t22", read_ids(guard))
            self.assertIsNotNone(guard.watch(session_id="s-busy").terminated)
            # By trace as well, where loopwarden's session is the trace.
            trace = "2e" * 16
            self.publish(TERMINATIONS, finding("terminated", trace, "t23", trace_id=trace))
            eventually(lambda: "t23" in read_ids(guard))
            for i in range(5):
                self.publish(WARNINGS, finding("warning", f"s-more-{i}", f"w4{i}"))
            eventually(lambda: {f"w4{i}" for i in range(5)} <= guard._seen.keys())
            self.assertNotIn("t23", read_ids(guard))
            self.assertIsNotNone(guard.watch(trace_id=trace).terminated)

    def test_remembered_terminations_are_bounded_in_number_and_age(self):
        # Not started: findings handed in as the consumer hands them, on a clock the
        # test moves.
        guard = Guard(BROKERS, recent=1, max_terminations=2, remember_terminations_secs=60)
        clock = [1_000_000.0]
        guard._clock = lambda: clock[0]
        for session in ("s-a", "s-b", "s-c"):
            guard.handle(json.dumps(finding("terminated", session, f"t-{session}")))
        guard.handle(json.dumps(finding("warning", "s-d", "w-d")))
        self.assertIsNone(guard.watch(session_id="s-a").terminated)
        self.assertIsNotNone(guard.watch(session_id="s-b").terminated)
        clock[0] += 59
        self.assertIsNotNone(guard.watch(session_id="s-c").terminated)
        clock[0] += 2
        self.assertIsNone(guard.watch(session_id="s-c").terminated)
        self.assertEqual((len(guard._terminations), len(guard._termination_traces)), (0, 0))

    def test_remembered_terminations_of_a_trace_follow_their_sessions(self):
        guard = Guard(BROKERS, recent=0)
        t, u = "3a" * 16, "4b" * 16
        # The trace as loopwarden's session (its spans named none), and a named session
        # in it: a watch of another named session in that trace gets the first only.
        guard.handle(json.dumps(finding("terminated", t, "t-trace", trace_id=t)))
        guard.handle(json.dumps(finding("terminated", "conv-x", "t-x", trace_id=t)))
        by_trace = guard.watch(session_id="conv-y", trace_id=t.upper())
        self.assertEqual(by_trace.terminated.event_id, "t-trace")
        # A watch knowing the trace alone: either is its session's.
        self.assertIsNotNone(guard.watch(trace_id=t).terminated)
        # conv-x terminated again under another trace: the first trace no longer names it.
        guard.handle(json.dumps(finding("terminated", "conv-x", "t-x2", trace_id=u)))
        self.assertEqual(guard._termination_traces, {t: {t: None}, u: {"conv-x": None}})
        self.assertEqual(guard.watch(trace_id=u).terminated.event_id, "t-x2")

    @unittest.skipUnless(hasattr(os, "fork"), "fork is POSIX's")
    def test_a_forked_process_follows_the_verdicts_of_its_own_sessions(self):
        # A pre-forking server or a worker pool forks after the guard started: fork
        # copies only the forking thread, so the child's guard must start again.
        ready, told = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its exit status says what it saw
            try:
                os.close(ready)
                watch = self.guard.watch(session_id="s-forked")
                os.write(told, b"watching")
                stopped = eventually(lambda: watch.terminated, timeout=10)
                os._exit(0 if stopped.event_id == "t30" else 2)
            except BaseException:
                os._exit(1)
        os.close(told)  # a child that dies before it writes: the read below ends
        try:
            self.assertTrue(select.select([ready], [], [], 30)[0], "the child never watched")
            self.assertEqual(os.read(ready, 8), b"watching")
        finally:
            os.close(ready)
        self.publish(TERMINATIONS, finding("terminated", "s-forked", "t30"))
        self.assertEqual(exit_code(pid, 30), 0, "the child's watch was not stopped")
        # The parent's guard goes on as it was.
        eventually(lambda: "t30" in read_ids(self.guard))

    @unittest.skipUnless(hasattr(os, "fork"), "fork is POSIX's")
    def test_a_forked_child_exits_as_a_worker_does(self):
        # A pre-forked server's worker ends with `sys.exit`: the interpreter's exit must
        # not wait on the parent's consumer, whose threads the child does not have.
        src = os.path.join(os.path.dirname(__file__), "..", "src")
        script = textwrap.dedent(
            f"""
            import os, sys
            sys.path.insert(0, {src!r})
            from loopwarden_guard import Guard
            guard = Guard({BROKERS!r}, warning_topic={WARNINGS!r}, terminated_topic={TERMINATIONS!r})
            guard.start()
            pid = os.fork()
            if pid == 0:
                guard.watch(session_id="s-exiting").check()
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            guard.close()
            sys.exit(os.waitstatus_to_exitcode(status))
            """
        )
        done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])

    @unittest.skipUnless(hasattr(os, "fork"), "fork is POSIX's")
    def test_a_forked_childs_failed_start_is_tried_again_later_and_a_closed_one_never(self):
        guard = Guard(BROKERS, warning_topic=WARNINGS, terminated_topic=TERMINATIONS).start()
        clock = [time.time()]
        guard._clock = lambda: clock[0]

        def in_child(steps):
            pid = os.fork()
            if pid == 0:
                try:
                    os._exit(0 if steps() else 2)
                except BaseException:
                    os._exit(1)
            return exit_code(pid, 60)

        def failed_then_retried():
            guard.topics[1] = "no-such-topic-xyz"  # the child's first start fails
            w = guard.watch(session_id="s-retry")  # logged, not raised
            failed = guard._forked and guard._thread is None
            guard.topics[1] = TERMINATIONS
            w.check()  # too soon: not tried
            waited = guard._thread is None
            clock[0] += RESTART_AFTER_SECS
            w.check()
            return failed and waited and not guard._forked and guard._ready.is_set()

        def closed_before_use():
            guard.close()
            guard.watch(session_id="s-closed").check()
            return guard._thread is None

        self.assertEqual(in_child(failed_then_retried), 0)
        self.assertEqual(in_child(closed_before_use), 0)
        guard.close()

    def test_settings_out_of_range_are_refused_together(self):
        with self.assertRaises(ValueError) as raised:
            Guard(BROKERS, recent=-1, remember_terminations_secs=float("inf"), max_terminations=True)
        said = str(raised.exception)
        self.assertIn("recent must be a count >= 0, got -1", said)
        self.assertIn("remember_terminations_secs must be a finite number of seconds >= 0, got inf", said)
        self.assertIn("max_terminations must be a count >= 1, got True", said)

    def test_a_missing_topic_is_a_clear_error(self):
        g = Guard(BROKERS, warning_topic="no-such-topic-xyz", terminated_topic=TERMINATIONS)
        with self.assertRaises(RuntimeError) as raised:
            g.start()
        self.assertIn("no-such-topic-xyz", str(raised.exception))


class StepAttributesTest(unittest.TestCase):
    """`exporter.step_attributes_processor`: the agent and session a step span inherits
    when it starts, with the OpenTelemetry SDK."""

    def spans(self, build):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from loopwarden_guard.exporter import step_attributes_processor

        provider = TracerProvider()
        exported = InMemorySpanExporter()
        provider.add_span_processor(step_attributes_processor())
        provider.add_span_processor(SimpleSpanProcessor(exported))
        build(provider.get_tracer("test"))
        return {s.name: dict(s.attributes) for s in exported.get_finished_spans()}

    def test_an_openinference_agent_span_names_its_steps(self):
        def build(tracer):
            # As OpenInference's OpenAI Agents instrumentation: the trace's root and the
            # agent are AGENT spans named at start, `agent.name` set only at their end.
            kind = {"openinference.span.kind": "AGENT"}
            with tracer.start_as_current_span("Agent workflow", attributes=kind):
                with tracer.start_as_current_span("fixer", attributes=kind) as agent:
                    with tracer.start_as_current_span("response"):
                        with tracer.start_as_current_span("nested"):
                            pass
                    agent.set_attribute("agent.name", "fixer")

        got = self.spans(build)
        self.assertEqual(got["response"]["gen_ai.agent.name"], "fixer")
        self.assertEqual(got["nested"]["gen_ai.agent.name"], "fixer")
        self.assertEqual(got["fixer"]["gen_ai.agent.name"], "fixer")

    def test_own_names_win_and_sessions_are_inherited(self):
        from loopwarden_guard.exporter import using_agent

        def build(tracer):
            with using_agent("coder"):
                with tracer.start_as_current_span("graph", attributes={"session.id": "s-1"}):
                    with tracer.start_as_current_span("llm"):
                        pass
                    with tracer.start_as_current_span("sub", attributes={"gen_ai.agent.name": "reviewer"}):
                        with tracer.start_as_current_span("tool"):
                            pass
            with tracer.start_as_current_span("outside"):
                pass

        got = self.spans(build)
        self.assertEqual(got["llm"]["gen_ai.agent.name"], "coder")
        self.assertEqual(got["llm"]["session.id"], "s-1")
        self.assertEqual(got["sub"]["gen_ai.agent.name"], "reviewer")
        self.assertEqual(got["tool"]["gen_ai.agent.name"], "reviewer")
        self.assertEqual(got["tool"]["session.id"], "s-1")
        self.assertNotIn("gen_ai.agent.name", got["outside"])


if __name__ == "__main__":
    unittest.main()
