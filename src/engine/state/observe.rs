//! How an event changes the session's trajectory: an LLM call (its step, tokens, cost)
//! and a tool call (its step, the window of calls, polls, what a result showed that the
//! run had not seen), and the facts the detectors read about it ([`ToolFacts`]).
//! The detectors' own counters follow in their own `observe`.

use super::*;
use crate::engine::trajectory::{
    holds, CallRecord, Did, PollTracker, ToolFacts, ToolObservation, MAX_NAMED_TOOLS,
    MAX_TOOL_NAME, OTHER_TOOLS, POLL_TRACKERS, SEEN_PAIRS, WINDOW_CALLS,
};

impl SessionState {
    /// Applies an LLM call: its step, the tool calls it asks for, its tokens and cost,
    /// and (a turn) the turn counted.
    pub fn observe_llm(&mut self, call: LlmObservation) {
        let s = &mut self.stats;
        s.llm_calls += 1;
        s.steps += 1;
        if call.is_turn {
            s.turns += 1;
            // The calls a turn asks for are part of its step; one that does not say asks
            // for as many as this agent's turns have.
            s.most_calls_per_turn = s.most_calls_per_turn.max(s.calls_since_turn);
            s.calls_since_turn = 0;
            s.tool_calls_asked = call.tool_calls.unwrap_or(s.most_calls_per_turn.max(1));
        } else {
            // A sub-agent's or a compaction's call covers the calls it says it asks for,
            // on top of the turn's (it was a step itself), and none when it does not say.
            s.tool_calls_asked = s
                .tool_calls_asked
                .saturating_add(call.tool_calls.unwrap_or(0));
        }
        s.input_tokens = s.input_tokens.saturating_add(call.input_tokens);
        s.output_tokens = s.output_tokens.saturating_add(call.output_tokens);
        s.cache_read_tokens = s
            .cache_read_tokens
            .saturating_add(call.cache_read_tokens.unwrap_or(0));
        s.cache_write_tokens = s
            .cache_write_tokens
            .saturating_add(call.cache_write_tokens.unwrap_or(0));
        if let Some(c) = call.cost_usd {
            // Saturating, as the token counts: an infinite sum is written as JSON `null`,
            // which says the session reported no cost.
            s.cost_usd = (s.cost_usd + c).min(f64::MAX);
            s.has_cost = true;
        }
    }

    /// Applies a tool call and returns what the detectors need to know about it. In
    /// order: the step counted, the window's counts, the poll trackers, what the result
    /// showed, then the call joins the window. The call's classes may change on the way
    /// (see [`ToolObservation::after_wait`]): `obs` is left as the state took it, for the
    /// detectors.
    pub fn observe_tool(&mut self, tool: &str, obs: &mut ToolObservation) -> ToolFacts {
        self.count_tool_step();
        // The call right after a wait checks on what the agent waited for: a poll, with
        // the room polls get (a queued batch job's line, the same while it waits, between
        // `sleep`s is no swing and no repeat; `poll_no_progress` ends a wait that never
        // ends, and a finished job polled on). Not a failure (a retry after a back-off,
        // judged as any failure; a passing one is `retry_safe` already), nor a write (an
        // edit, then a wait for it to take, is an action). A command that sleeps first
        // (`sleep 60 && tail apply.log`) is judged so too: its check comes after its wait.
        let waited =
            obs.sleeps_first || (self.run.window.back()).is_some_and(|prev| prev.is_wait());
        if waited && !obs.is_error && !obs.write {
            obs.checks_after_wait = obs.poll;
            if !obs.poll {
                obs.poll = true;
                obs.after_wait = true;
            }
        }
        let obs = &*obs;
        let mut rec = CallRecord::of(obs);
        let (mut facts, outcome_seen) = self.run.window_facts(&rec, obs);
        if obs.poll {
            (facts.poll_unchanged, facts.poll_moved) = self.run.observe_poll(&rec, obs);
        } else {
            self.run.answer_of_a_polled_action(&rec);
        }
        let (content, did) = self.run.note_content(obs, facts.action_count, outcome_seen);
        let known_content = content == Some(true);
        // The very answer another call gave in the window (digits and all): a whole
        // answer again, not a part of one read before.
        let answered_elsewhere = known_content && self.run.answered_elsewhere(&rec);
        let (news, learned) = self
            .run
            .note_news(&rec, obs, known_content, answered_elsewhere);
        facts.news = news;
        facts.did = did | if learned { Did::LEARNED } else { 0 };
        // What a read showed: judged by its lines where it has enough of them to tell a
        // new page from the same one with a new clock or request id; else whether its
        // answer is new to the run (a short answer's digest differs either way). Lines
        // all seen in a sample that stopped at its most say nothing of the result's tail
        // (an infinite scroll's new items come last, after a page's header and menus):
        // such a read is judged as one too long to judge.
        let judged_seen = content == Some(true) && obs.content.read_whole();
        rec.flags |= match content {
            Some(false) => CallRecord::NEW_LINES,
            Some(true) if judged_seen => CallRecord::REREAD,
            _ if news == Some(false)
                && !(obs.is_error || obs.poll || obs.write || obs.wordless) =>
            {
                CallRecord::NEW_ANSWER
            }
            _ => 0,
        };
        facts.departed = self.run.push_call(rec);
        self.count_tool(tool, facts.pair_count > 1);
        facts
    }

    /// A tool call is a step unless an LLM call asked for it (that call was the step).
    fn count_tool_step(&mut self) {
        self.stats.tool_calls += 1;
        self.stats.calls_since_turn = self.stats.calls_since_turn.saturating_add(1);
        if self.stats.tool_calls_asked > 0 {
            self.stats.tool_calls_asked -= 1;
        } else {
            self.stats.steps += 1;
        }
    }

    fn count_tool(&mut self, tool: &str, repeated: bool) {
        let name = cut_at_char(tool, MAX_TOOL_NAME);
        let idx = match self.tools.iter().position(|t| t.tool == name) {
            Some(i) => i,
            None if self.tools.len() < MAX_NAMED_TOOLS => {
                self.tools.push(ToolCount {
                    tool: name.to_string(),
                    calls: 0,
                    repeats: 0,
                });
                self.tools.len() - 1
            }
            None => match self.tools.iter().position(|t| t.tool == OTHER_TOOLS) {
                Some(i) => i,
                None => {
                    self.tools.push(ToolCount {
                        tool: OTHER_TOOLS.to_string(),
                        calls: 0,
                        repeats: 0,
                    });
                    self.tools.len() - 1
                }
            },
        };
        let t = &mut self.tools[idx];
        t.calls += 1;
        t.repeats += u64::from(repeated);
    }
}

impl RunState {
    /// One pass over the window (newest last) for the counts the detectors share, and
    /// whether this call's outcome is in the window already.
    fn window_facts(&self, rec: &CallRecord, obs: &ToolObservation) -> (ToolFacts, bool) {
        let mut facts = ToolFacts::default();
        let (mut pair_count, mut action_count) = (1u32, u32::from(!obs.poll));
        let judged_outcome = !obs.poll && !obs.retry_safe;
        let mut outcome_count = u32::from(judged_outcome);
        let mut error_count = u32::from(obs.error_text && !obs.retry_safe);
        let mut outcome_seen = false;
        // A call that works, between polls of a job that moves (a `sleep`, a look at the
        // log), is waiting, not repeating: it counts only what came after the last move.
        // A failure repeats across the poll as it would without it.
        let repeatable = if !obs.is_error {
            self.since_poll_moved.map_or(WINDOW_CALLS, usize::from)
        } else {
            WINDOW_CALLS
        };
        for (i, prev) in self.window.iter().rev().enumerate() {
            let same_outcome = prev.same_outcome(rec);
            outcome_seen |= same_outcome;
            let counts = i < repeatable;
            if counts && prev.same_pair(rec) {
                pair_count += 1;
            }
            if counts && judged_outcome && same_outcome && !prev.has(CallRecord::RETRY_SAFE) {
                outcome_count += 1;
            }
            // (A failure's window is never cut by a poll: `counts` always holds here.)
            if error_count > 0
                && prev.has(CallRecord::ERROR_TEXT)
                && !prev.has(CallRecord::RETRY_SAFE)
                && prev.shape == rec.shape
            {
                error_count += 1;
            }
            if !obs.poll && !prev.is_poll() && prev.action == rec.action {
                action_count += 1;
            }
        }
        facts.pair_count = pair_count;
        facts.outcome_count = outcome_count;
        facts.error_count = error_count;
        facts.action_count = action_count;
        (facts, outcome_seen)
    }

    /// Whether a call of another action in the window gave this call's very answer
    /// (digits and all: fares that differ from one date to the next are news).
    fn answered_elsewhere(&self, rec: &CallRecord) -> bool {
        self.window
            .iter()
            .any(|prev| prev.result == rec.result && prev.action != rec.action)
    }

    /// A call that is no poll this time, of an action polled before (a long poll that
    /// got its messages before its timeout ran out, a job read without a pending word
    /// once it finished): a new answer is the poll's too, so its unchanged answers count
    /// again from it (the empty receives after a batch of messages are not the ones
    /// before it).
    fn answer_of_a_polled_action(&mut self, rec: &CallRecord) {
        // (A failure is no answer of the job's: its numbers are counters, and a poll's
        // change to or from one is no job moving.)
        if rec.is_error() {
            return;
        }
        if let Some(t) = self.polls.iter_mut().find(|p| p.action == rec.action) {
            if t.result != rec.result {
                t.result = rec.result;
                t.unchanged = 0;
            }
        }
    }

    /// Polls: per-action trackers so that interleaved pollers are each followed. Returns
    /// this poll action's unchanged results in a row, and whether its result moved.
    fn observe_poll(&mut self, rec: &CallRecord, obs: &ToolObservation) -> (u32, bool) {
        // A wait's answer is its own ("slept 60s"), never the job's: it stands still while
        // the job it waits on moves. Its answers in a row, and those of a call taken for a
        // poll for following a wait (the disk's free space checked beside a moving job),
        // count from the last move of a job (see `moved`) since its own last call.
        // This action's last call in the window, as calls back from its end: looked up
        // only where a wait or a changed answer asks (a poll's same answer needs none).
        let back = || (self.window.iter().rev()).position(|p| p.action == rec.action);
        let job_moved_since = (obs.wait || obs.after_wait)
            && match (back(), self.since_poll_moved) {
                (Some(back), Some(since)) => usize::from(since) <= back,
                (Some(_), None) => false,
                (None, _) => true,
            };
        // An answer this action gave before in the window, in other words than its last
        // one, with nothing but polls and waits since its last call, is no change: a pod
        // table flapping between `Running` and `CrashLoopBackOff` between sleeps. One
        // that differs from the last only in digits is (a queue's depth, a replica count,
        // moving within a range), and so is one after the agent acted (a robot `moving`
        // again after each `pick`, a deploy's status after each edit).
        let flapped_back = || {
            back().is_some_and(|back| {
                let at = self.window.len() - 1 - back;
                self.window.range(at + 1..).all(|p| p.is_poll())
                    && self.window[at].shape != rec.shape
                    && (self.window.iter())
                        .any(|p| p.action == rec.action && p.result == rec.result)
            })
        };
        let found = self.polls.iter().position(|p| p.action == rec.action);
        match found {
            Some(i) => {
                let same = self.polls[i].result == rec.result || flapped_back();
                let mut t = self.polls.remove(i);
                // A changed poll is progress for every detector: the job it waits on is
                // moving. A failing poll's change is not (an error's numbers are
                // counters: "not running (attempt 7)"), nor a wait's (`slept 42s`, its
                // own; one that reads a job still working, in a status or in words, is a
                // check too), nor that of a call taken for a poll only for following a
                // wait (new pod names after each restart and sleep are no job moving).
                let moved =
                    !same && !obs.is_error && (!obs.wait || obs.reads_pending) && !obs.after_wait;
                if moved {
                    self.since_poll_moved = Some(0);
                }
                t.unchanged = if same && !job_moved_since {
                    t.unchanged + 1
                } else {
                    0
                };
                t.result = rec.result;
                let u = t.unchanged;
                self.polls.push(t);
                (u, moved)
            }
            None => {
                // `>=`: a restored state holds whatever it was written with.
                while self.polls.len() >= POLL_TRACKERS {
                    self.polls.remove(0);
                }
                self.polls.push(PollTracker {
                    action: rec.action,
                    result: rec.result,
                    unchanged: 0,
                });
                (0, false)
            }
        }
    }

    /// What the result showed, against the lines the run has seen: `Some(true)` when it
    /// was all known content, `Some(false)` when it showed new lines, `None` when it had
    /// too few lines to judge or is not judged so (a failure, a poll, a write); and what
    /// the call did, as bits of [`Did`] (`action_count`: this
    /// action's calls in the window; `outcome_seen`: this outcome was in the window
    /// already).
    fn note_content(
        &mut self,
        obs: &ToolObservation,
        action_count: u32,
        outcome_seen: bool,
    ) -> (Option<bool>, u8) {
        // A read whose lines the run had nearly all seen (a rephrased search finding the
        // code it found before, a file viewed again through another tool or range) is
        // no news, whatever its arguments. Every result's lines count as seen from then
        // on (an edit shows the agent its new code too).
        let all_seen = obs.content.seen_then_remember(&mut self.seen_lines);
        let content = all_seen.filter(|_| !obs.is_error && !obs.poll && !obs.write);
        let known_content = content == Some(true);
        // The same call answering differently stays progress (digits count: a test run
        // whose failures go down), however alike its lines: only a call new to the
        // window (a rephrased search) is judged by what it showed.
        let stale_read = known_content && action_count == 1;
        let did = if obs.poll || !(outcome_seen || stale_read) {
            Did::PROGRESSED
        } else {
            0
        } | if obs.is_error {
            Did::FAILED
        } else if known_content {
            Did::REREAD
        } else {
            Did::SUCCEEDED
        } | if obs.poll { Did::POLLED } else { 0 };
        (content, did)
    }

    /// Information gain: whether this (action, result) is new to the run, as
    /// [`ToolFacts::news`], and whether the call learned something ([`Did::LEARNED`]).
    fn note_news(
        &mut self,
        rec: &CallRecord,
        obs: &ToolObservation,
        known_content: bool,
        answered_elsewhere: bool,
    ) -> (Option<bool>, bool) {
        // Information gain: a call is news when this action has not returned this result
        // (up to digits) before in the run (a new file written says "File updated" too).
        // Polls count neither as news nor as old news. Nor does a call repeated with an
        // answer without words (an empty output, an exit code): its answer tells nothing,
        // and re-applying a silent write (undo a fix to check the test fails, redo it) is
        // what it did. A new call is news whatever it answers, unless its answer is one
        // with content that another call in the window gave whole (a page parameter the
        // API ignores, a rephrased search finding the very same list): the agent asked
        // something new and was told what it knew.
        if obs.poll {
            return (None, false);
        }
        let pair = rec.news_key();
        let seen = holds(&self.seen_pairs, pair);
        let news = (!(seen && obs.wordless)).then_some(seen || answered_elsewhere);
        if seen {
            return (news, false);
        }
        push_bounded(&mut self.seen_pairs, pair, SEEN_PAIRS);
        self.pairs_gained.push();
        // Learned, for `similar_turns`, unless what it showed was all seen before.
        // (`no_new_information` judges answers as a whole: re-reading part of a file
        // read before, to work on it, is how work looks.)
        (news, !known_content)
    }

    /// The call joins the window, and the poll clock moves on; returns the call that
    /// left the window, if it was full.
    fn push_call(&mut self, rec: CallRecord) -> Option<CallRecord> {
        let departed = push_bounded(&mut self.window, rec, WINDOW_CALLS);
        self.window_gained.push();
        self.since_poll_moved = self
            .since_poll_moved
            .map(|n| n.saturating_add(1).min(WINDOW_CALLS as u8));
        departed
    }
}
