//! How an event changes a session's state: an LLM call (turns, text features, what the
//! turn's results showed) and a tool call (the window of calls, streaks, cycles, polls,
//! errors, what a result showed that the run had not seen).

use super::*;

impl SessionState {
    /// Applies an LLM call: its tokens and cost, the step it is, and (a turn) what its
    /// text says against the turns before.
    pub fn observe_llm(&mut self, call: LlmObservation<'_>) {
        self.count_llm_call(&call);
        let LlmObservation {
            is_turn,
            is_compaction,
            tool_calls,
            progress,
            sketch,
            opening,
            min_similarity,
            ..
        } = call;
        let s = &mut self.stats;
        let r = &mut self.run;
        if is_compaction {
            r.compaction_streak += 1;
        }
        if let Some(p) = progress {
            match r.best_progress {
                Some(best) if p <= best => r.progress_stale += 1,
                _ => {
                    r.best_progress = Some(p);
                    r.progress_stale = 0;
                }
            }
        }
        if !is_turn {
            return;
        }
        s.turns += 1;
        match tool_calls {
            Some(0) => r.stall += 1,
            Some(_) => r.stall = 0,
            None => {}
        }
        // The turn that just ended: were all of its tool results seen before?
        if r.turn_had_results {
            if r.turn_all_seen {
                r.no_new_info_streak += 1;
            } else {
                r.no_new_info_streak = 0;
            }
        }
        r.turn_had_results = false;
        r.turn_all_seen = true;
        if let Some(sk) = sketch.filter(|s| !s.is_empty()) {
            let since = std::mem::take(&mut r.since_text);
            let learned = since & RunState::LEARNED != 0;
            let progressed = since & (RunState::LEARNED | RunState::PROGRESSED) != 0;
            // Alike as a whole, or opening as an earlier turn did while nothing got done
            // since (calls were made and each failed or showed lines the run had nearly
            // all seen, none of them a poll): the same apology or restatement before a
            // different body is still the agent saying it again.
            let nothing_done = since & (RunState::SUCCEEDED | RunState::POLLED) == 0
                && since & (RunState::FAILED | RunState::REREAD) != 0;
            let opens_alike = opening.is_some_and(|o| nothing_done && r.openings.contains(&o));
            let similar = opens_alike
                || r.sketches
                    .iter()
                    .any(|prev| prev.similarity(sk) >= min_similarity);
            // The words repeat: the first such turn opens the streak whatever it learned,
            // the next ones count while they learn nothing new (a turn that opens as
            // before with nothing done learned nothing from its failures). Repeated words
            // may nudge; they end the session only while the results stand still too.
            r.similar_streak = match (similar, learned && !opens_alike) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => r.similar_streak + 1,
            };
            r.similar_stale = if similar && (!progressed || opens_alike) {
                r.similar_stale + 1
            } else {
                0
            };
            push_bounded(&mut r.sketches, sk.clone(), TURN_SKETCHES);
            push_bounded(&mut r.openings, opening.unwrap_or(0), TURN_SKETCHES);
        }
    }

    /// An LLM call's step, the tool calls it asks for, its tokens and its cost.
    fn count_llm_call(&mut self, call: &LlmObservation<'_>) {
        let s = &mut self.stats;
        s.llm_calls += 1;
        s.steps += 1;
        if call.is_turn {
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
            s.cost_usd += c;
            s.has_cost = true;
        }
    }

    /// Applies a tool call and returns what the detectors need to know about the window.
    /// In order: the step counted, the window's counts, the streaks against the calls
    /// before, the poll trackers, what the result showed, then the call joins the window.
    pub fn observe_tool(
        &mut self,
        tool: &str,
        obs: ToolObservation,
        last_calls: usize,
    ) -> ToolFacts {
        self.count_tool_step();
        let subject = self.episodes[DetectorKind::GenericRepeat.index()].subject;
        let rec = CallRecord::of(&obs);
        let (mut facts, outcome_seen) = self.run.window_facts(&rec, &obs, subject, last_calls);
        let repeated = facts.pair_count > 1;
        self.run.advance_streaks(&rec, &obs, repeated);
        if obs.poll {
            facts.poll_unchanged = self.run.observe_poll(&rec, obs.is_error);
        }
        let known_content = self
            .run
            .note_content(&obs, facts.action_count, outcome_seen);
        self.run.note_news(&rec, &obs, known_content);
        self.run.push_call(rec);

        facts.cycle = self.longest_cycle();
        self.count_tool(tool, repeated);
        // generic_repeat follows the action that is repeating, not every call.
        let generic_repeat = &mut self.episodes[DetectorKind::GenericRepeat.index()];
        if facts.action_count >= 2 && generic_repeat.subject == 0 {
            generic_repeat.subject = obs.action;
        }
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

    /// The cycle at the window's tail that covers the most calls, as (length k, calls
    /// covered), once its block came back whole at least once and if the block is not
    /// itself a shorter repetition (that is `repeat` or `ping_pong`'s business).
    fn longest_cycle(&self) -> Option<(usize, u32)> {
        let w = &self.run.window;
        let mut best: Option<(usize, u32)> = None;
        for (slot, k) in CYCLE_LENGTHS.iter().enumerate() {
            let m = self.run.cycle_match[slot] as usize;
            if m < *k {
                continue;
            }
            // The block is w[n-k..]; it is reducible when it repeats with a period d | k.
            let n = w.len();
            let reducible = (1..*k)
                .filter(|d| k % d == 0)
                .any(|d| (d..*k).all(|i| w[n - k + i].same_outcome(&w[n - k + i - d])));
            if reducible {
                continue;
            }
            let covered = (m + k) as u32;
            if best.is_none_or(|(_, c)| covered > c) {
                best = Some((*k, covered));
            }
        }
        best
    }

    fn count_tool(&mut self, tool: &str, repeated: bool) {
        let name = if tool.len() > MAX_TOOL_NAME {
            let mut end = MAX_TOOL_NAME;
            while !tool.is_char_boundary(end) {
                end -= 1;
            }
            &tool[..end]
        } else {
            tool
        };
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

/// How many distinct pairs `pairs` holds. The window is short (`low_novelty` looks at 8
/// calls by default): comparing each pair with the ones before it costs less than sorting
/// a copy, up to the window's 30.
pub(super) fn distinct_pairs(pairs: &[(u64, u64)]) -> u32 {
    let mut distinct = 0;
    for (i, p) in pairs.iter().enumerate() {
        distinct += u32::from(!pairs[..i].contains(p));
    }
    distinct
}

impl CallRecord {
    /// A tool call as the window keeps it.
    fn of(obs: &ToolObservation) -> CallRecord {
        CallRecord {
            action: obs.action,
            result: obs.result,
            shape: obs.shape,
            flags: (if obs.is_error { CallRecord::ERROR } else { 0 })
                | (if obs.poll { CallRecord::POLL } else { 0 })
                | (if obs.retry_safe {
                    CallRecord::RETRY_SAFE
                } else {
                    0
                })
                | (if obs.error_text {
                    CallRecord::ERROR_TEXT
                } else {
                    0
                }),
        }
    }
}

impl RunState {
    /// One pass over the window (newest last) for every count the detectors need, and
    /// whether this call's outcome is in the window already.
    fn window_facts(
        &self,
        rec: &CallRecord,
        obs: &ToolObservation,
        subject: u64,
        last_calls: usize,
    ) -> (ToolFacts, bool) {
        let mut facts = ToolFacts::default();
        let mut recent: [(u64, u64); WINDOW_CALLS] = [(0, 0); WINDOW_CALLS];
        let want_recent = last_calls.min(WINDOW_CALLS);
        let mut recent_len = 0usize;
        if !obs.poll && want_recent > 0 {
            recent[0] = (rec.action, rec.result);
            recent_len = 1;
        }
        let (mut pair_count, mut action_count, mut subject_count) =
            (1u32, u32::from(!obs.poll), 0u32);
        if !obs.poll && subject == rec.action {
            subject_count = 1;
        }
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
            if !prev.is_poll() {
                if !obs.poll && prev.action == rec.action {
                    action_count += 1;
                }
                if subject != 0 && prev.action == subject {
                    subject_count += 1;
                }
                if recent_len < want_recent {
                    recent[recent_len] = (prev.action, prev.result);
                    recent_len += 1;
                }
            }
        }
        facts.pair_count = pair_count;
        facts.outcome_count = outcome_count;
        facts.error_count = error_count;
        facts.action_count = action_count;
        facts.subject_count = subject_count;
        facts.recent_len = recent_len as u32;
        facts.recent_distinct = distinct_pairs(&recent[..recent_len]);
        (facts, outcome_seen)
    }

    /// The streaks against the calls before this one (`repeated`: its pair is in the
    /// window already).
    fn advance_streaks(&mut self, rec: &CallRecord, obs: &ToolObservation, repeated: bool) {
        let last = self.window.back().copied();
        // A write re-applied in a row is a loop whatever it returns (the same insert grows
        // the file with each copy).
        self.repeat_streak = match last {
            Some(l) if l.action == rec.action && (obs.write || l.same_outcome(rec)) => {
                self.repeat_streak + 1
            }
            _ => 1,
        };
        // A failure that says nothing (an exit code, an empty output: `grep` finding
        // nothing) is an answer, not an error to retry: `repeat` follows it.
        self.error_repeat_streak = if !obs.error_text {
            0
        } else {
            match last {
                Some(l) if l.has(CallRecord::ERROR_TEXT) && l.action == rec.action => {
                    self.error_repeat_streak + 1
                }
                _ => 1,
            }
        };
        // The same error in words as the previous failure, whatever the attempt.
        self.same_error_streak = match last {
            Some(l) if obs.error_text && l.is_error() && l.shape == rec.shape => {
                self.same_error_streak + 1
            }
            _ if obs.error_text => 1,
            _ => 0,
        };
        self.error_streak = if obs.is_error {
            self.error_streak + 1
        } else {
            0
        };
        self.unknown_tool_streak = if obs.unknown_tool {
            self.unknown_tool_streak + 1
        } else {
            0
        };
        self.no_progress_bits = (self.no_progress_bits << 1) | u64::from(repeated);
        self.alternation = {
            let n = self.window.len();
            let prev1 = last;
            let prev2 = if n >= 2 {
                self.window.get(n - 2).copied()
            } else {
                None
            };
            match (prev1, prev2) {
                (Some(p1), _) if p1.action == rec.action => 1,
                (Some(_), Some(p2)) if p2.same_outcome(rec) && self.alternation >= 2 => {
                    self.alternation + 1
                }
                (Some(_), _) => 2,
                (None, _) => 1,
            }
        };
        for (slot, k) in CYCLE_LENGTHS.iter().enumerate() {
            let n = self.window.len();
            self.cycle_match[slot] = if n >= *k && self.window[n - k].same_outcome(rec) {
                self.cycle_match[slot] + 1
            } else {
                0
            };
        }
    }

    /// Polls: per-action trackers so that interleaved pollers are each followed. Returns
    /// this poll action's unchanged results in a row.
    fn observe_poll(&mut self, rec: &CallRecord, is_error: bool) -> u32 {
        let found = self.polls.iter().position(|p| p.action == rec.action);
        match found {
            Some(i) => {
                let mut t = self.polls.remove(i);
                if t.result != rec.result && !is_error {
                    // A changed poll is progress for every detector: the job it
                    // waits on is moving. A failing poll's change is not (an error's
                    // numbers are counters: "not running (attempt 7)").
                    self.error_repeat_streak = 0;
                    self.same_error_streak = 0;
                    self.error_streak = 0;
                    self.since_poll_moved = Some(0);
                }
                t.unchanged = if t.result == rec.result {
                    t.unchanged + 1
                } else {
                    0
                };
                t.result = rec.result;
                let u = t.unchanged;
                self.polls.push(t);
                u
            }
            None => {
                if self.polls.len() == POLL_TRACKERS {
                    self.polls.remove(0);
                }
                self.polls.push(PollTracker {
                    action: rec.action,
                    result: rec.result,
                    unchanged: 0,
                });
                0
            }
        }
    }

    /// What the result showed, against the lines the run has seen: whether it was all
    /// known content, and the turn's flags for it (`action_count`: this action's calls in
    /// the window; `outcome_seen`: this outcome was in the window already).
    fn note_content(
        &mut self,
        obs: &ToolObservation,
        action_count: u32,
        outcome_seen: bool,
    ) -> bool {
        // A read whose lines the run had nearly all seen (a rephrased search finding the
        // code it found before, a file viewed again through another tool or range) is
        // no news, whatever its arguments. Every result's lines count as seen from then
        // on (an edit shows the agent its new code too).
        let known_content = !obs.is_error
            && !obs.poll
            && !obs.write
            && obs.content.all_seen_in(&self.seen_lines) == Some(true);
        obs.content.remember_in(&mut self.seen_lines);
        // The same call answering differently stays progress (digits count: a test run
        // whose failures go down), however alike its lines: only a call new to the
        // window (a rephrased search) is judged by what it showed.
        let stale_read = known_content && action_count == 1;
        self.since_text |= if obs.poll || !(outcome_seen || stale_read) {
            RunState::PROGRESSED
        } else {
            0
        } | if obs.is_error {
            RunState::FAILED
        } else if known_content {
            RunState::REREAD
        } else {
            RunState::SUCCEEDED
        } | if obs.poll { RunState::POLLED } else { 0 };
        known_content
    }

    /// Information gain: whether this (action, result) is new to the run.
    fn note_news(&mut self, rec: &CallRecord, obs: &ToolObservation, known_content: bool) {
        // Information gain: a call is news when this action has not returned this result
        // (up to digits) before in the run (a new file written says "File updated" too).
        // Polls count neither as news nor as old news. Nor does a call repeated with an
        // answer without words (an empty output, an exit code): its answer tells nothing,
        // and re-applying a silent write (undo a fix to check the test fails, redo it) is
        // what it did; a new call is news whatever it answers.
        if !obs.poll {
            let pair = rec.news_key();
            let seen = self.seen_pairs.contains(&pair);
            if !(seen && obs.wordless) {
                self.turn_had_results = true;
                self.turn_all_seen &= seen;
            }
            if !seen {
                push_bounded(&mut self.seen_pairs, pair, SEEN_PAIRS);
                // Learned, for `similar_turns`, unless what it showed was all seen
                // before. (`no_new_information` judges answers as a whole: re-reading
                // part of a file read before, to work on it, is how work looks.)
                if !known_content {
                    self.since_text |= RunState::LEARNED;
                }
            }
        }
    }

    /// The call joins the window: nothing stalls, and the poll clock moves on.
    fn push_call(&mut self, rec: CallRecord) {
        self.stall = 0;
        self.compaction_streak = 0;
        push_bounded(&mut self.window, rec, WINDOW_CALLS);
        self.since_poll_moved = self
            .since_poll_moved
            .map(|n| n.saturating_add(1).min(WINDOW_CALLS as u8));
    }
}
