//! `repeat`: the same action returning the same result again — in a row, or again and
//! again in the run's window.
//!
//! Content-aware: the action *and* its result must repeat, because a changed result is
//! progress (re-reading a file that changed, re-running a test that now fails
//! differently). Two failures are the same outcome when their errors differ only in
//! digits (an error's numbers are line numbers and counters; a success's are data); and
//! a tool classed `write` re-applied in a row is a loop whatever it returns (the same
//! insert, re-applied, grows the file each time). Defaults: warn at 3
//! in a row, terminate at 4 in a row or at 8 times the same outcome in the window (the
//! last 30 calls of the run), which catches a loop interleaved with other calls (add a
//! print, run the same script, same output, again and again): such an episode follows
//! its action, so the calls in between neither end it nor count toward its grace. Polls
//! (their own detector, `poll_no_progress`) and tools classed `retry_safe` are exempt,
//! and the same failure in words in a row is `error_repeat`'s (a failure that says
//! nothing, `grep` finding nothing, is an answer, and repeats here).
//!
//! A repeated action followed by nothing but the same read as before (and polls), that
//! read showing new lines, paged (a `Next page` click, then the snapshot; a scroll, then
//! the screenshot): it is not counted in the window. Where that read gave a short
//! answer or an image new to the run it may have, and the window then only nudges. A
//! write or any other call between makes it an attempt (see [`RunState::paged`]).

use serde::{Deserialize, Serialize};

use super::settings::Threshold;
use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal, ToolContext, fp_hex, recent_calls};
use crate::engine::levels::Levels;
use crate::engine::trajectory::RunState;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repeat {
    /// Terminates when the same action and result occur this many times in the window.
    pub window_terminate_at: Threshold,
}

impl Default for Repeat {
    fn default() -> Self {
        Repeat {
            window_terminate_at: Threshold(Some(8.0)),
        }
    }
}

impl Repeat {
    /// The window's count of this call's outcome less its occurrences that surely paged,
    /// and that less those that may have (see [`RunState::paged`]): the first may nudge,
    /// only the second ends the session. Paging is looked for only where the count would
    /// end it (a look back over the window for each call before it).
    fn in_window(&self, run: &RunState, t: &ToolContext) -> (u32, u32) {
        let count = t.facts.outcome_count;
        match self.window_terminate_at.get() {
            Some(at) if f64::from(count) >= at => {
                let paged = run.paged_outcomes();
                let not_surely = count - paged.surely.min(count - 1);
                (not_surely, not_surely - paged.maybe.min(not_surely - 1))
            }
            _ => (count, count),
        }
    }
}

impl Detector for Repeat {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    /// Same outcome (or the same write) in a row, counting the latest call.
    type State = u32;

    fn observe(&self, streak: &mut u32, run: &RunState, input: &Input<'_>) {
        let Some(t) = input.tool() else { return };
        // A write re-applied in a row is a loop whatever it returns (the same insert grows
        // the file with each copy).
        let Some(this) = run.latest() else { return };
        *streak = match run.before_latest(1) {
            // The same failure in words in a row is `error_repeat`'s (the window still
            // counts it here, between other calls).
            _ if t.obs.error_text => 0,
            Some(l) if l.action == this.action && (t.obs.write || l.same_outcome(&this)) => *streak + 1,
            _ => 1,
        };
    }

    fn default_levels() -> Levels {
        Levels::new(Some(3.0), None, Some(4.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        if t.obs.poll || t.obs.retry_safe {
            return None;
        }
        let (may_loop, loops) = self.in_window(st.run, t);
        let at = self.window_terminate_at.get();
        let sig = Signal::of(*st.own as f64, levels).or_window(levels, loops, at, t.obs.action, st.subject);
        // A repeat that may have paged (the page read after it too short to tell from
        // the same one with a fresh id) nudges at the count, and never ends the session.
        Some(sig.or_window_nudge(levels, may_loop, at, t.obs.action))
    }

    fn describe(
        &self,
        st: &SessionView<'_, Self::State>,
        t: &ToolContext,
        r: Reading,
        ev: &mut Evidence,
    ) -> Message {
        // The window's count that read: the nudge's (repeats that may have paged
        // counted) where that is what reached the level, else the one that ends the
        // session (they are left out).
        let (may_loop, loops) = self.in_window(st.run, t);
        let may_have_paged = may_loop != loops && r.value == f64::from(may_loop);
        let in_window = if may_have_paged { may_loop } else { loops };
        let (tool, in_a_row) = (t.tool, *st.own);
        ev.insert("in_a_row".into(), in_a_row.into());
        ev.insert("in_window".into(), in_window.into());
        ev.insert("action".into(), fp_hex(t.obs.action).into());
        ev.insert("result".into(), fp_hex(t.obs.result).into());
        ev.insert("recent".into(), recent_calls(st.run, 8));
        let times = in_a_row.max(in_window);
        let calls = st.run.window.len();
        // Led by the larger count: in a row, or (between other calls) in the window.
        let count = |nothing_new: &str| {
            if in_window > in_a_row {
                format!("{in_window} times with the same result in the last {calls} calls ({in_a_row} in a row)")
            } else {
                format!("{in_a_row} times in a row{nothing_new} ({in_window} with the same result in the last {calls} calls)")
            }
        };
        if t.obs.write {
            return Message::new(
                format!("`{tool}` applied with the same arguments {}", count("")),
                format!("you applied the same `{tool}` {times} times; look at the target as it is now before changing it again"),
            );
        }
        Message::new(
            format!(
                "`{tool}` called with the same arguments {}",
                count(" with nothing new in its result")
            ),
            if may_have_paged {
                format!("you called `{tool}` with the same arguments {times} times and got the same result; if what you read after it shows nothing new, try something different")
            } else {
                format!("you called `{tool}` with the same arguments {times} times and got the same result; try something different")
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::{self, Repeat};
    use crate::engine::levels::{Level, Mode};

    fn same(n: usize) -> Vec<Value> {
        (0..n)
            .map(|_| call("read", json!({"p": 1}), json!("x")))
            .collect()
    }

    #[test]
    fn warns_at_3_and_terminates_at_4_in_a_row() {
        assert!(of(&same(2), Repeat).is_empty());
        let f = run(&same(6));
        assert_eq!(
            only(&f, Repeat),
            vec![(2, Level::Warning), (3, Level::Terminate)]
        );
        // Tombstone: nothing after the termination.
        assert!(f.iter().all(|x| x.0 <= 3));
    }

    #[test]
    fn terminates_at_8_in_the_window_even_when_interleaved() {
        let mut evs = Vec::new();
        for i in 0..8 {
            evs.push(call("read", json!({"p": 1}), json!("x")));
            evs.push(call("other", json!({"i": i}), json!(i)));
        }
        assert!(of(&first(&evs, 14), Repeat).is_empty(), "7 in the window");
        assert_eq!(of(&evs, Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn an_interleaved_loop_terminates_once_the_grace_has_passed() {
        // Add a print, run the same script, the same output: the edits in between are
        // new each time, and neither end the window's episode nor count as its steps.
        let mut evs = Vec::new();
        for i in 0..12 {
            evs.push(turn(1, &format!("add print {i}")));
            evs.push(call("edit", json!({"line": i}), json!(format!("File updated {}", words(i)))));
            evs.push(turn(1, "run it"));
            evs.push(call("bash", json!({"command": "python repro.py"}), json!("no output")));
        }
        let grace = "[engine]\ngrace_steps = 3\n";
        let found = of_with(grace, &evs, Repeat);
        // The 8th run (event 31) is held as critical; the first run 3 steps (LLM calls)
        // later, the 10th (event 39), terminates.
        assert_eq!(found, vec![(31, Level::Critical), (39, Level::Terminate)]);
    }

    #[test]
    fn failures_that_differ_only_in_digits_are_the_same_in_the_window() {
        // A shell names the line that failed: `line 62215`, `line 62230`, …, between
        // other calls: the 8th in the window ends it. In a row, the same failure in words
        // is `error_repeat`'s.
        let javac = |i: usize| {
            let out = format!("/bin/bash: line {}: javac: command not found", 62215 + 15 * i);
            let mut e = call("bash", json!({"command": "javac A.java"}), json!(out));
            e["is_error"] = json!(true);
            e
        };
        let mut evs = Vec::new();
        for i in 0..8 {
            evs.push(javac(i));
            evs.push(call("read_file", json!({"path": format!("src/{i}.java")}), words(i)));
        }
        assert_eq!(of_alone(&evs, Repeat), vec![(14, Level::Terminate)]);
        let in_a_row: Vec<Value> = (0..6).map(javac).collect();
        assert!(of_alone(&in_a_row, Repeat).is_empty());
        assert_eq!(
            of_alone(&in_a_row, DetectorKind::ErrorRepeat),
            vec![(1, Level::Warning), (2, Level::Critical), (5, Level::Terminate)]
        );
    }

    #[test]
    fn a_success_whose_digits_change_is_progress() {
        // The digits of a result are data: a clock, a chunk number, a progress count.
        let evs: Vec<Value> = (0..8)
            .map(|i| call("read_output", json!({"session": 1}), json!(format!("chunk {i}"))))
            .collect();
        assert!(of(&evs, Repeat).is_empty());
    }

    #[test]
    fn a_write_re_applied_in_a_row_repeats_whatever_it_returns() {
        let evs: Vec<Value> = (0..4)
            .map(|i| {
                let out = format!("[File: a.java ({} lines total)] {}", 8 + 15 * i, words(i));
                call("edit", json!({"command": "edit 1:1\nimport x;"}), json!(out))
            })
            .collect();
        assert_eq!(
            of(&evs, Repeat),
            vec![(2, Level::Warning), (3, Level::Terminate)]
        );
    }

    #[test]
    fn a_changed_result_is_progress() {
        let evs: Vec<Value> = (0..12)
            .map(|i| call("read", json!({"p": 1}), words(i)))
            .collect();
        let f = run(&evs);
        assert!(only(&f, Repeat).is_empty());
        assert!(f.iter().all(|x| x.2 != Level::Terminate));
    }

    #[test]
    fn findings_are_emitted_once_per_level_per_episode() {
        // A,A,A (warn) B A,A,A (warn again: a new episode).
        let a = || call("read", json!({"p": 1}), json!("x"));
        let evs = vec![a(), a(), a(), call("b", json!(1), json!(1)), a(), a(), a()];
        let cfg = "[detectors.repeat]\nterminate_at = \"off\"\nwindow_terminate_at = \"off\"\n";
        let rep: Vec<usize> = of_with(cfg, &evs, Repeat).iter().map(|x| x.0).collect();
        assert_eq!(rep, vec![2, 6]);
    }

    #[test]
    fn warn_mode_downgrades_terminations_and_shadow_marks_them() {
        let evs = same(5);
        let rep = of_with("[detectors.repeat]\nmode = \"warn\"\n", &evs, Repeat);
        assert_eq!(rep, vec![(2, Level::Warning), (3, Level::Critical)]);
        let shadow = run_with("mode = \"shadow\"\n", &evs);
        assert!(shadow.iter().all(|x| x.3 == Mode::Shadow));
        assert!(shadow.iter().any(|x| x.2 == Level::Terminate));
    }

    #[test]
    fn tool_overrides_change_thresholds_for_that_tool_only() {
        let cfg = "[[overrides]]\ntool = \"slow_*\"\n[overrides.detectors.repeat]\nwarn_at = 5\nterminate_at = 6\n";
        let evs: Vec<Value> = (0..6)
            .map(|_| call("slow_read", json!(1), json!(1)))
            .collect();
        let rep = of_with(cfg, &evs, Repeat);
        assert_eq!(rep, vec![(4, Level::Warning), (5, Level::Terminate)]);
        assert_eq!(of_with(cfg, &same(4), Repeat).len(), 2, "other tools keep 3/4");
    }

    #[test]
    fn terminate_at_off_turns_the_window_kill_off_too() {
        // The README's example: `repeat` never stops deploys.
        let cfg = "[[overrides]]\ntool = \"deploy*\"\n[overrides.detectors.repeat]\nterminate_at = \"off\"\n";
        let evs: Vec<Value> = (0..12)
            .map(|_| call("deploy_app", json!({"env": "prod"}), json!("deployed v2")))
            .collect();
        assert_eq!(of_with(cfg, &evs, Repeat), vec![(2, Level::Warning)]);
        // Other tools keep both kills.
        let rep = of_with(cfg, &same(12), Repeat);
        assert_eq!(rep, vec![(2, Level::Warning), (3, Level::Terminate)]);
    }

    #[test]
    fn retry_safe_tools_are_exempt() {
        let evs: Vec<Value> = (0..4)
            .map(|_| fail("fetch", json!({"u": 1}), None))
            .collect();
        let f = run_with("[tools]\nretry_safe = [\"fetch\"]\n", &evs);
        assert!(
            f.iter()
                .all(|x| x.1 != DetectorKind::ErrorRepeat && x.1 != Repeat),
            "{f:?}"
        );
    }

    #[test]
    fn every_finding_has_a_hint_that_names_the_tool() {
        use crate::contract::output::Output;
        let config = std::sync::Arc::new(crate::config::Config::default());
        let mut engine = crate::engine::Engine::new(config);
        let mut out = Vec::new();
        for (i, e) in same(4).iter().enumerate() {
            let mut e = e.clone();
            e["session_id"] = json!("s");
            e["event_id"] = json!(format!("e{i}"));
            let line = e.to_string();
            let ev = crate::contract::event::parse_event(line.as_bytes(), &crate::contract::event::ParseLimits::default())
                .unwrap();
            engine.process(&ev, &crate::engine::EventMeta::default(), &mut out);
        }
        let hints: Vec<String> = out
            .iter()
            .filter_map(|o| match o {
                Output::Finding(f) => Some(f.hint.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(hints.len(), 2);
        assert!(
            hints[0].contains("`read`") && hints[0].contains("3 times"),
            "{}",
            hints[0]
        );
    }

    /// `between` and a status poll whose progress moves, in turn, 20 times each.
    fn between_moving_polls(between: Value) -> Vec<Value> {
        let mut evs = Vec::new();
        for p in 0..20 {
            evs.push(between.clone());
            let status = json!({"state": "running", "progress": format!("{}%", 4 * p)});
            evs.push(call("get_job_status", json!({"job": 1}), status));
        }
        evs
    }

    #[test]
    fn a_call_that_works_between_polls_of_a_moving_job_is_waiting() {
        let sleep = call("bash", json!({"command": "sleep 30"}), json!("slept 30s"));
        assert!(of(&between_moving_polls(sleep), Repeat).is_empty());
    }

    #[test]
    fn a_failure_repeated_between_polls_of_a_moving_job_is_still_a_loop() {
        // The job moving is no progress of the deploy that keeps failing beside it.
        let mut deploy = fail("deploy", json!({"env": "prod"}), None);
        deploy["result"] = json!("Error: permission denied for user bot");
        let found = of(&between_moving_polls(deploy), Repeat);
        assert_eq!(found.last(), Some(&(14, Level::Terminate)), "{found:?}");
    }

    #[test]
    fn a_repeated_action_whose_next_read_shows_something_new_is_paging() {
        let evs = pages(24, new_rows, None);
        assert!(of_alone(&evs, Repeat).is_empty(), "{:?}", of_alone(&evs, Repeat));
        // The same click whose page never changes is a dead button: the window's kill at
        // the 8th click (the first page read reads nothing read before: no page turned).
        let dead = pages(12, |_| new_rows(0), None);
        assert_eq!(of_alone(&dead, Repeat), vec![(14, Level::Terminate)]);
        // Nor is a page whose only change is its digits (a clock) a new one.
        let clock = pages(12, |p| json!(format!("{}\n- text: 10:{p:02}", new_rows(0).as_str().unwrap())), None);
        assert_eq!(of_alone(&clock, Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn a_short_page_that_may_be_new_nudges_and_never_ends_the_session() {
        // Three rows: too few lines to tell a new page from the same one with a fresh id
        // (its digest differs either way): the 8th click nudges, and no count ends it.
        let rows = |p: usize| json!(format!("row {} row {} Page {p}", words(p), words(p + 100)));
        assert_eq!(of_alone(&pages(24, rows, None), Repeat), vec![(14, Level::Critical)]);
        // The same short page each time (its clock aside) is a dead button.
        let same = |p: usize| json!(format!("row alpha row bravo 10:{p:02}"));
        assert_eq!(of_alone(&pages(12, same, None), Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn a_page_whose_only_change_is_a_request_id_is_no_new_page() {
        // A dead `Submit`: the same form each time (forty lines), its footer naming a new
        // request id (hex: letters too, so the answer differs beyond its digits). Its
        // lines were all seen but one: it learned nothing, so the clicks are a loop.
        let form = |p: usize| {
            let ray: String = format!("{:x}", 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(p as u64 + 1));
            let lines: Vec<String> =
                (0..40).map(|i| format!("- textbox \"Field {}\" [ref=e{i}]", words(i))).collect();
            json!(format!("{}\n- contentinfo: Ray ID {ray}", lines.join("\n")))
        };
        let evs = pages(12, form, None);
        assert_eq!(of_alone(&evs, Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn new_lines_read_by_new_questions_are_no_paging() {
        // The same type check, the same errors, another file read before each run and
        // nothing changed: the new lines are the files', asked for one by one.
        let read = |p: usize| call("read_file", json!({"path": format!("src/m{p}.py")}), new_rows(p));
        let evs = pages(12, new_rows, Some(&read));
        let checks: Vec<Value> = (evs.iter())
            .map(|e| match e["tool"].as_str() {
                Some("browser_click") => call("bash", json!({"command": "mypy src/"}), json!("src/a.py:3: error: Incompatible types")),
                _ => e.clone(),
            })
            .filter(|e| e["tool"] != "browser_snapshot")
            .collect();
        assert_eq!(of_alone(&checks, Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn paging_that_reaches_a_dead_end_is_a_loop_again() {
        // Twenty new pages, then a `Next page` that no longer moves: eight clicks in the
        // window that paged nothing end it.
        let evs = pages(28, |p| new_rows(p.min(20)), None);
        let found = of_alone(&evs, Repeat);
        assert_eq!(found, vec![(54, Level::Terminate)], "{found:?}");
    }

    #[test]
    fn a_write_between_the_same_call_and_a_new_read_is_an_attempt() {
        // Edit, run the same script to the same output, read the edited file back: what
        // the read shows is the agent's own edit, not a page the script turned.
        let edit = |p: usize| call("edit_file", json!({"line": p}), json!("ok"));
        let evs = pages(12, new_rows, Some(&edit));
        assert_eq!(of_alone(&evs, Repeat), vec![(21, Level::Terminate)]);
    }

    #[test]
    fn a_failure_pages_nothing() {
        let mut evs = pages(12, new_rows, None);
        for e in evs.iter_mut().filter(|e| e["tool"] == "browser_click") {
            e["is_error"] = json!(true);
            e["result"] = json!("Error: element not found: Next page");
        }
        assert_eq!(of_alone(&evs, Repeat), vec![(14, Level::Terminate)]);
    }

    #[test]
    fn a_read_that_blocked_for_its_whole_timeout_is_a_poll() {
        // A board that does not boot: the serial port read for 10 s, nothing arrives.
        // Waiting on a device is polling it: `poll_no_progress` gives it its room.
        let read = |ms: Option<f64>| {
            let mut e = call("serial_read", json!({"port": "/dev/ttyUSB0", "timeout_ms": 10000}), json!({"bytes": 0, "data": ""}));
            if let Some(ms) = ms {
                e["duration_ms"] = json!(ms);
            }
            e
        };
        let waited: Vec<Value> = (0..12).map(|_| read(Some(10_002.0))).collect();
        assert!(of_alone(&waited, Repeat).is_empty());
        let polled = of_alone(&waited, DetectorKind::PollNoProgress);
        assert_eq!(polled, vec![(10, Level::Warning)], "{polled:?}");
        // The same read answering at once, or of no known length, is an action again.
        let quick: Vec<Value> = (0..12).map(|_| read(Some(40.0))).collect();
        assert_eq!(of_alone(&quick, Repeat), vec![(2, Level::Warning), (3, Level::Terminate)]);
        let unknown: Vec<Value> = (0..12).map(|_| read(None)).collect();
        assert_eq!(of_alone(&unknown, Repeat), vec![(2, Level::Warning), (3, Level::Terminate)]);
    }

    #[test]
    fn an_edit_by_any_tool_between_is_an_attempt() {
        // The same script's same output, an edit by a shell command between (no tool
        // classed `write`), then the same `git diff` showing the edit: an attempt each
        // time, not a page turned.
        let mut evs = Vec::new();
        for i in 0..8 {
            evs.push(call("bash", json!({"command": "python repro.py"}), json!("Traceback: KeyError 'user'")));
            evs.push(call("bash", json!({"command": format!("sed -i '{i}a print(x)' app.py")}), json!("")));
            evs.push(call("bash", json!({"command": "git diff"}), new_rows(i)));
        }
        assert_eq!(of_alone(&evs, Repeat), vec![(21, Level::Terminate)]);
    }

    #[test]
    fn a_nudge_about_one_call_leaves_another_its_own_warning_and_grace() {
        // A short page's `Next page` nudged (it may have paged), then another call the
        // same eight times in a row: its warning is said, and its end waits its own
        // grace (3 steps after its warning), not the nudge's.
        let rows = |p: usize| json!(format!("row {} row {} Page {p}", words(p), words(p + 100)));
        let mut evs = pages(10, rows, None);
        evs.extend((0..8).map(|_| call("read", json!({"p": 1}), json!("x"))));
        let found = of_with("[engine]\ngrace_steps = 3\n", &evs, Repeat);
        assert_eq!(
            found,
            vec![(14, Level::Critical), (22, Level::Warning), (23, Level::Critical), (25, Level::Terminate)]
        );
    }

    #[test]
    fn a_page_whose_new_rows_come_after_the_sample_may_be_new() {
        // Two hundred lines of header and menus, then the page's rows: the sample stops
        // before the rows, so a new page is not seen as one. Its answer is new to the
        // run: it may have paged, and the clicks are nudged, not ended. The same long
        // page each time (its answer the same) is a dead button.
        let header: Vec<String> = (0..200).map(|i| format!("- link \"Menu {} {}\"", words(i), words(i + 300))).collect();
        let page = |p: usize| {
            let rows: Vec<String> = (0..20).map(|i| format!("- row \"{} {} issue\"", words(p + 40), words(i))).collect();
            json!(format!("{}\n{}", header.join("\n"), rows.join("\n")))
        };
        assert_eq!(of_alone(&pages(16, page, None), Repeat), vec![(14, Level::Critical)]);
        assert_eq!(of_alone(&pages(12, |_| page(0), None), Repeat), vec![(14, Level::Terminate)]);
    }
}
