#!/usr/bin/env python3
"""The loop detectors loopwarden's design grew from, as their projects run them: in
process, in Python or TypeScript, over each session's own history. Written anew here in
plain Python (standard library only) as the baseline `benches/vs-seeds` times
`loopwarden replay` against, on the same JSON Lines file of events.

Per session, on every event:
- ceilings: steps (LLM calls), tokens (input + output), wall-clock time;
- the fingerprint no-progress detector: SHA-256 of the canonical (tool, args) and of the
  result; the same pair again and again in a row;
- the stall detector: turns in a row that request no tool call;
- OpenClaw's four, over the last 30 tool calls (SHA-256 of stably stringified params and
  results): generic repeat, known poll without progress, ping-pong, global circuit
  breaker;
- the Jaccard turn detector: a turn's word set against the previous five;
- the stagnation guard: a reported progress score that stops improving.

Usage: benches/seeds.py EVENTS.jsonl  (prints findings per detector on stdout, the rate
on stderr)
"""
import hashlib
import json
import sys
import time
from collections import defaultdict, deque

HISTORY = 30
WARN, CRITICAL, BREAKER = 10, 20, 30
MAX_STEPS, MAX_TOKENS, MAX_WALL_SECS = 200, 2_000_000, 4 * 3600
POLL_TOOLS = ("status", "poll", "wait", "process.log")


def stable(value):
    """Stable stringify: sorted keys, no whitespace (as OpenClaw's stableStringify)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value):
    return hashlib.sha256(stable(value).encode()).hexdigest()


def parse_time(ts):
    if not ts:
        return None
    try:
        return time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class Session:
    def __init__(self):
        self.steps = 0
        self.tokens = 0
        self.first = None
        self.last_pair = None
        self.pair_streak = 0
        self.stall = 0
        self.history = deque(maxlen=HISTORY)  # (tool, args hash, result hash)
        self.turn_words = deque(maxlen=5)
        self.similar = 0
        self.best_progress = None
        self.stagnant = 0


def is_poll(tool, args):
    name = tool.lower()
    if isinstance(args, dict) and isinstance(args.get("action"), str):
        name = name + "." + args["action"]
    return any(p in name for p in POLL_TOOLS)


def openclaw(s, tool, args_hash, result_hash, poll, found):
    history = s.history
    # generic repeat: the same call (tool + params) in the history
    same = sum(1 for t, a, _ in history if t == tool and a == args_hash)
    if same >= CRITICAL:
        found["generic_repeat/critical"] += 1
    elif same >= WARN:
        found["generic_repeat/warning"] += 1
    # no-progress streak of the same call: identical results, newest first
    streak = 0
    for t, a, r in reversed(history):
        if t != tool or a != args_hash:
            continue
        if r != result_hash:
            break
        streak += 1
    if poll and streak >= WARN:
        found["known_poll_no_progress/" + ("critical" if streak >= CRITICAL else "warning")] += 1
    if streak >= BREAKER:
        found["global_circuit_breaker/critical"] += 1
    # ping-pong: an A,B,A,B tail with stable results on both sides
    if len(history) >= 2:
        last = history[-1]
        other = next((h for h in reversed(list(history)[:-1]) if h[1] != last[1]), None)
        if other is not None and args_hash == other[1]:
            tail, results = 0, {}
            stable_results = True
            for i, h in enumerate(reversed(history)):
                expected = last[1] if i % 2 == 0 else other[1]
                if h[1] != expected:
                    break
                if results.setdefault(h[1], h[2]) != h[2]:
                    stable_results = False
                tail += 1
            if stable_results and tail + 1 >= CRITICAL:
                found["ping_pong/critical"] += 1
            elif stable_results and tail + 1 >= WARN:
                found["ping_pong/warning"] += 1
    history.append((tool, args_hash, result_hash))


def on_event(sessions, e, found):
    s = sessions[e.get("session_id")]
    t = parse_time(e.get("timestamp"))
    if t is not None:
        if s.first is None:
            s.first = t
        elif t - s.first > MAX_WALL_SECS:
            found["wall_clock/stop"] += 1
    kind = e.get("type")
    if kind == "cost.attributed":
        s.steps += 1
        s.tokens += int(e.get("input_tokens", 0)) + int(e.get("output_tokens", 0))
        if s.steps > MAX_STEPS:
            found["steps/stop"] += 1
        if s.tokens > MAX_TOKENS:
            found["tokens/stop"] += 1
        if e.get("call_kind", "turn") == "turn":
            calls = e.get("tool_calls")
            s.stall = s.stall + 1 if calls == 0 else 0
            if s.stall >= 3:
                found["stall/warning"] += 1
            text = e.get("text")
            if text:
                words = set(text.lower().split())
                similar = False
                for prev in s.turn_words:
                    union = len(words | prev)
                    if union and len(words & prev) / union >= 0.85:
                        similar = True
                        break
                s.similar = s.similar + 1 if similar else 0
                if s.similar >= 3:
                    found["jaccard_turns/warning"] += 1
                s.turn_words.append(words)
        progress = e.get("progress")
        if progress is not None:
            if s.best_progress is None or progress > s.best_progress:
                s.best_progress, s.stagnant = progress, 0
            else:
                s.stagnant += 1
                if s.stagnant >= 6:
                    found["stagnation/stop"] += 1
    elif kind == "tool.called":
        tool = e.get("tool", "")
        args = e.get("args")
        action = digest([tool, args])
        result = e.get("result_digest") or digest(e.get("result"))
        pair = (action, result)
        s.pair_streak = s.pair_streak + 1 if pair == s.last_pair else 1
        s.last_pair = pair
        if s.pair_streak >= 3:
            found["no_progress/warning"] += 1
        s.stall = 0
        openclaw(s, tool, digest(args), result, is_poll(tool, args), found)
    elif kind == "session.completed":
        sessions.pop(e.get("session_id"), None)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sessions = defaultdict(Session)
    found = defaultdict(int)
    start = time.perf_counter()
    events = 0
    with open(sys.argv[1], "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):
                on_event(sessions, e, found)
                events += 1
    secs = time.perf_counter() - start
    for k in sorted(found):
        print(f"{k}\t{found[k]}")
    print(f"seeds.py: {events} events in {secs:.3f} s = {events / secs:.0f} events/s", file=sys.stderr)


if __name__ == "__main__":
    main()
