//! `poll_no_progress`: a polling call that keeps returning an unchanged result.
//!
//! Waiting on a job is not a loop until it has waited too long, so polls get more room
//! than `repeat` (which they replace): warn after 10 unchanged results, terminate after
//! 20. A changed status (`35% complete` → `60% complete`) resets the count; an answer the
//! poll gave before in the window, in other words than its last, does not (a flapping
//! status). A call is a poll by its tool class (`[tools] poll` globs), because its result
//! reads as pending, or because it is a wait or comes right after one (`[tools] wait`).
//! A wait beside checks is not judged itself: the check it waits on is.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Message, Reading, SessionView, Signal, ToolContext, fp_hex};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollNoProgress {}

impl Detector for PollNoProgress {
    const CLASS: Class = Class::ToolLoop;
    type On<'a> = &'a ToolContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(10.0), None, Some(20.0))
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, t: &ToolContext) -> Option<Signal> {
        // A wait between checks is not judged: its answer is its own, and its reading would
        // end the episode of the check it waits on at each call (warned again and again,
        // never ended). Sleeps with no check beside them in the window are, and so is a
        // wait that reads a job still working (a check itself).
        let beside_a_check = || {
            (st.run.window.iter()).any(|c| c.is_poll() && !c.is_wait())
        };
        let bare_wait = t.obs.wait && !t.obs.reads_pending;
        if !t.obs.poll || (bare_wait && beside_a_check()) {
            return None;
        }
        // Nor does a call taken for a poll only for following a wait end another poll's
        // episode when it changes: its change is no job moving (new pod names beside a
        // deployment that stays at 0/1).
        let signal = Signal::of(t.facts.poll_unchanged as f64, levels);
        (!(t.obs.after_wait && signal.reset)).then_some(signal)
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, t: &ToolContext, r: Reading, ev: &mut Evidence) -> Message {
        let (tool, n) = (t.tool, r.count());
        ev.insert("action".into(), fp_hex(t.obs.action).into());
        ev.insert("result".into(), fp_hex(t.obs.result).into());
        Message::new(
            format!("polling `{tool}` returned the same result {n} more times"),
            format!("`{tool}` has returned the same status {n} times; stop polling and check whether the job is stuck or already finished"),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::{self, PollNoProgress, Repeat};
    use crate::engine::levels::Level;

    #[test]
    fn polls_get_more_room_but_not_forever() {
        let evs: Vec<Value> = (0..22)
            .map(|_| call("job_status", json!({"id": 1}), json!({"status": "running"})))
            .collect();
        assert!(of(&first(&evs, 10), PollNoProgress).is_empty());
        let f = run(&evs);
        assert!(only(&f, Repeat).is_empty());
        assert_eq!(
            only(&f, PollNoProgress),
            vec![(10, Level::Warning), (20, Level::Terminate)]
        );
    }

    #[test]
    fn a_pending_result_makes_any_tool_a_poll() {
        let evs: Vec<Value> = (0..5)
            .map(|_| {
                call(
                    "curl",
                    json!({"u": "/jobs/1"}),
                    json!("{\"state\": \"queued\"}"),
                )
            })
            .collect();
        assert!(run(&evs).is_empty());
    }

    #[test]
    fn a_write_that_reads_a_job_still_working_is_a_poll() {
        // Codex CLI polls a running process by writing nothing to its stdin: a write by
        // its name, whose answer says the process is still running. Its new output each
        // time is the job moving; re-applied in a row, it is no repeat of a write.
        let evs: Vec<Value> = (0..8)
            .map(|i| {
                call(
                    "write_stdin",
                    json!({"session_id": 3, "chars": ""}),
                    json!(format!("Process running with session ID 3\nOutput:\n   Compiling crate{i} v0.1.0")),
                )
            })
            .collect();
        assert!(run(&evs).is_empty());
    }

    /// `n` rounds of `wait`, then `check(round)`.
    fn rounds(n: usize, wait: &Value, check: impl Fn(usize) -> Value) -> Vec<Value> {
        (0..n).flat_map(|i| [wait.clone(), check(i)]).collect()
    }

    /// A shell's bare `sleep 30`.
    fn sleep_30() -> Value {
        call("bash", json!({"command": "sleep 30"}), json!(""))
    }

    /// `check` after each of `n` waits, and what the whole session's detectors find.
    fn checked_between_waits(n: usize, wait: Value, check: Value) -> Vec<(usize, DetectorKind, Level)> {
        run(&rounds(n, &wait, |_| check.clone()))
    }

    #[test]
    fn a_check_after_each_wait_is_a_poll() {
        // A batch job's queue line, the same while it waits for nodes (no pending word:
        // SLURM writes `PD`), checked after each 15-minute wait: polls, with the room
        // polls get; neither a swing nor a repeat.
        let queue = call(
            "ssh_exec",
            json!({"command": "squeue -j 48213377"}),
            json!("JOBID PARTITION NAME ST TIME NODES NODELIST(REASON)\n48213377 gpu md_run PD 0:00 4 (Priority)\n"),
        );
        let wait = call("wait", json!({"seconds": 900}), json!("Waited 900 seconds."));
        assert!(checked_between_waits(10, wait.clone(), queue.clone()).is_empty());
        // A wait that never ends is still ended: the check's 20th unchanged answer, warned
        // at its 10th and not again (the waits between, each for its own time, neither end
        // nor advance its episode); nothing else finds anything (`circuit_breaker` leaves
        // polls alone).
        let evs: Vec<Value> = (0..22)
            .flat_map(|i| {
                let wait = call("wait", json!({"seconds": 600 + 60 * (i % 5)}), json!("Waited."));
                [wait, queue.clone()]
            })
            .collect();
        assert_eq!(
            run(&evs),
            vec![(21, PollNoProgress, Level::Warning), (41, PollNoProgress, Level::Terminate)]
        );
        // A shell's `sleep` is a wait as well, unless waits are off.
        let sleep = call("bash", json!({"command": "sleep 900"}), json!(""));
        assert!(checked_between_waits(10, sleep.clone(), queue.clone()).is_empty());
        let evs = rounds(10, &sleep, |_| queue.clone());
        let off: Vec<_> = run_with("[tools]\nwait = []\n", &evs).into_iter().map(|f| (f.0, f.1, f.2)).collect();
        assert!(off.contains(&(9, DetectorKind::PingPong, Level::Terminate)), "{off:?}");
        // Between calls that are no wait, the same check swings with them, ended sooner.
        let note = call("note", json!({"text": "checking again"}), json!("noted"));
        let found = checked_between_waits(10, note, queue);
        assert!(found.contains(&(9, DetectorKind::PingPong, Level::Terminate)), "{found:?}");
    }

    #[test]
    fn a_wait_on_a_moving_job_is_no_poll_without_progress() {
        // 25 minutes of `sleep 60`, the job's progress moving at each check: the sleep's
        // same answer says nothing of the job. Sleeps alone, 22 of them, are ended.
        let sleep = call("sleep", json!({"seconds": 60}), json!("slept 60s"));
        let evs = rounds(25, &sleep, |i| {
            call("get_job", json!({"id": 1}), json!({"state": "running", "progress": i * 4}))
        });
        assert!(run(&evs).is_empty(), "{:?}", run(&evs));
        let sleeps = vec![call("sleep", json!({"seconds": 60}), json!("slept 60s")); 22];
        assert_eq!(
            of(&sleeps, PollNoProgress),
            vec![(10, Level::Warning), (20, Level::Terminate)]
        );
    }

    #[test]
    fn what_comes_after_a_wait_moves_no_job() {
        // A restart, a sleep, the pods, over and over. The sleep's answer differing each
        // time (`slept 20.14s`) is its own; the pods' differing (new names after each
        // restart) is no job moving either, for a call taken for a poll only for following
        // a wait: the restart repeats, and is ended as a repeat.
        let restart = call("bash", json!({"command": "kubectl rollout restart deploy/api"}), json!("deployment.apps/api restarted"));
        let pods = |i: usize| {
            call("bash", json!({"command": "kubectl get pods"}), json!(format!("api-{}   0/1   CrashLoopBackOff", words(i))))
        };
        let repeats = |evs: &[Value]| run(evs).iter().any(|(_, d, l)| matches!(d, Repeat) && *l == Level::Terminate);
        let slept: Vec<Value> = (0..8)
            .flat_map(|i| [restart.clone(), call("sleep", json!({"seconds": 20}), json!(format!("slept {}", 20.0 + i as f64 / 7.0))), pods(0)])
            .collect();
        assert!(repeats(&slept), "{:?}", run(&slept));
        let renamed: Vec<Value> = (0..8)
            .flat_map(|i| [restart.clone(), call("bash", json!({"command": "sleep 20"}), json!("")), pods(i)])
            .collect();
        assert!(repeats(&renamed), "{:?}", run(&renamed));
    }

    #[test]
    fn a_poll_left_behind_leaves_the_next_one_judged() {
        // Job A polled unchanged past a warning, then left for job B, unchanged too.
        let poll = |job: &str| call("job_status", json!({"id": job}), json!({"status": "queued"}));
        let evs: Vec<Value> = std::iter::repeat_n(poll("a"), 12)
            .chain(std::iter::repeat_n(poll("b"), 25))
            .collect();
        assert!(of(&evs, PollNoProgress).contains(&(32, Level::Terminate)), "{:?}", of(&evs, PollNoProgress));
    }

    #[test]
    fn a_check_flapping_between_two_answers_after_waits_is_ended() {
        // A pod table between `Running` and `CrashLoopBackOff`, read after each sleep: an
        // answer the check gave before is no change, of the check nor of the wait.
        let evs = rounds(30, &sleep_30(), |i| {
            let table = if i % 2 == 0 { "api-1 1/1 Running" } else { "api-1 0/1 CrashLoopBackOff" };
            call("bash", json!({"command": "kubectl get pods"}), json!(table))
        });
        let found = run(&evs);
        assert!(found.iter().any(|(_, d, l)| matches!(d, PollNoProgress) && *l == Level::Terminate), "{found:?}");
    }

    #[test]
    fn a_check_beside_a_job_that_moves_waits_with_it() {
        // A long-poll whose answer is the job's state (an epoch more each time, as a status
        // or in words), then the disk's free space, the same each time: the job moves,
        // nothing is ended.
        let df = call("bash", json!({"command": "df -h /ckpt"}), json!("/dev/sdb 2.0T 1.1T 0.9T 55% /ckpt"));
        let beside = |answer: &dyn Fn(usize) -> Value| -> Vec<Value> {
            (0..40)
                .flat_map(|i| [call("wait_for_job", json!({"id": "train-7"}), answer(i)), df.clone()])
                .collect()
        };
        for evs in [
            beside(&|i| json!({"status": "running", "epoch": i})),
            beside(&|i| json!(format!("job train-7 still running, step {}", 100 * i))),
        ] {
            assert!(of(&evs, PollNoProgress).is_empty(), "{:?}", of(&evs, PollNoProgress));
            assert!(run(&evs).iter().all(|(_, _, l)| *l != Level::Terminate), "{:?}", run(&evs));
        }
    }

    #[test]
    fn a_status_moving_within_a_range_is_progress() {
        // A queue's depth going up and down (answers it gave before, in digits only) is no
        // flapping: each change is progress, as before.
        let evs: Vec<Value> = (0..40)
            .map(|i| call("get_queue_status", json!({}), json!({"status": "processing", "depth": i % 4})))
            .collect();
        assert!(of(&evs, PollNoProgress).is_empty(), "{:?}", of(&evs, PollNoProgress));
    }

    #[test]
    fn a_changing_check_after_a_wait_leaves_a_stalled_one_judged() {
        // After each sleep, the deployment (0/1, the same) and after another, the pods
        // (new names after each restart): the pods' change is no job moving.
        let evs = rounds(60, &sleep_30(), |i| match i % 2 {
            0 => call("bash", json!({"command": "kubectl get deploy api"}), json!("api 0/1 1 0")),
            _ => call("bash", json!({"command": "kubectl get pods"}), json!(format!("api-{} 0/1 Error", words(i / 2)))),
        });
        assert!(of(&evs, PollNoProgress).contains(&(81, Level::Terminate)), "{:?}", of(&evs, PollNoProgress));
    }

    #[test]
    fn a_status_back_after_the_agent_acted_is_news() {
        // A robot `moving`, `moving`, then `idle` at each bin, a `pick` between: the
        // status comes back after each action, as it should.
        let evs: Vec<Value> = (0..15)
            .flat_map(|i| {
                let status = |s: &str| call("get_robot_status", json!({}), json!({"state": s}));
                [
                    call("move_to", json!({"bin": i}), json!("ok")),
                    status("moving"),
                    status("moving"),
                    status("idle"),
                    call("pick", json!({"bin": i}), json!(format!("picked {}", words(i)))),
                ]
            })
            .collect();
        assert!(of(&evs, PollNoProgress).is_empty(), "{:?}", of(&evs, PollNoProgress));
    }

    #[test]
    fn a_wait_that_reads_its_job_is_a_check() {
        // Three jobs waited on in turn, each long-poll answering in words that its job
        // is still running: checks on jobs, no sleeps alone (ten rounds, then done).
        let evs: Vec<Value> = (0..10)
            .flat_map(|_| {
                ["a", "b", "c"].map(|job| {
                    call("wait_for_job", json!({"id": job, "timeout_s": 300}), json!(format!("Job {job} still running after 300s")))
                })
            })
            .collect();
        assert!(run(&evs).is_empty(), "{:?}", run(&evs));
        // One that never moves is judged, whatever jitters beside it.
        let hung = call("wait_for_job", json!({"id": "a"}), json!({"status": "running", "step": 4100}));
        let evs = rounds(25, &hung, |i| {
            call("bash", json!({"command": "free -m"}), json!(format!("Mem: 64000 {} free", 1000 + i)))
        });
        assert!(of(&evs, PollNoProgress).contains(&(40, Level::Terminate)), "{:?}", of(&evs, PollNoProgress));
    }

    #[test]
    fn a_command_that_sleeps_then_checks_is_a_poll() {
        // An emulator booting: `sleep 20; getprop sys.boot_completed`, the same empty
        // answer eight times, then `1`. A check after its own sleep, judged as the check
        // after a wait: no repeat, no swing; `poll_no_progress` warns at its 10th
        // unchanged answer (the 11th check) and ends it at its 20th. A sleep followed by
        // steps that check on nothing (`sleep 60 || true`) is a wait, and the check after
        // it is a check after a wait.
        let check = |done: &str| {
            call("shell", json!({"cmd": "sleep 20; adb shell getprop sys.boot_completed"}), json!({"exit_code": 0, "stdout": done}))
        };
        let mut evs = vec![check(""); 8];
        evs.push(check("1\n"));
        assert!(run(&evs).is_empty(), "{:?}", run(&evs));
        let never = vec![check(""); 22];
        assert_eq!(
            run(&never),
            vec![(10, PollNoProgress, Level::Warning), (20, PollNoProgress, Level::Terminate)]
        );
        // Without the sleep, the same check again and again is a repeat.
        let bare = vec![call("shell", json!({"cmd": "adb shell getprop sys.boot_completed"}), json!({"exit_code": 0, "stdout": ""})); 4];
        assert!(run(&bare).iter().any(|(_, d, l)| matches!(d, Repeat) && *l == Level::Terminate), "{:?}", run(&bare));
        // Nor with the wait class off (`tools.wait = []`).
        let off = "[tools]\nwait = []\n";
        assert!(of_with(off, &never[..4], Repeat).contains(&(3, Level::Terminate)), "{:?}", of_with(off, &never[..4], Repeat));
        let pd = call("ssh_exec", json!({"command": "squeue -j 7"}), json!("7 gpu md PD 0:00 4 (Priority)"));
        let noisy = call("bash", json!({"command": "sleep 60 || true"}), json!(""));
        let evs = rounds(12, &noisy, |_| pd.clone());
        assert!(run(&evs).iter().all(|f| f.2 != Level::Terminate), "{:?}", run(&evs));
    }

    #[test]
    fn sleeps_alone_are_a_cycle() {
        // Five sleeps of their own lengths, over and over: waiting on nothing.
        let evs: Vec<Value> = (0..30)
            .map(|i| call("bash", json!({"command": format!("sleep {}", 5 * (i % 5 + 1))}), json!("")))
            .collect();
        assert!(
            run(&evs).iter().any(|(_, d, l)| matches!(d, DetectorKind::Cycle) && *l == Level::Terminate),
            "{:?}",
            run(&evs)
        );
    }

    #[test]
    fn a_failure_after_each_wait_is_judged_as_any_failure() {
        // A retry after a back-off that fails the same way each time is no check on a
        // job: it swings with its waits as before.
        let denied = fail("submit_return", json!({"period": "25A3"}), Some("http_401"));
        let wait = call("sleep", json!({"seconds": 8}), json!({"slept": 8}));
        let found = checked_between_waits(6, wait, denied);
        assert!(found.contains(&(9, DetectorKind::PingPong, Level::Terminate)), "{found:?}");
    }

    #[test]
    fn a_changed_status_is_progress() {
        let evs: Vec<Value> = (0..30)
            .map(|i| call("job_status", json!({"id": 1}), json!({"done": i / 5})))
            .collect();
        assert!(of(&evs, PollNoProgress).is_empty());
    }

    #[test]
    fn a_long_poll_that_got_its_messages_counts_its_empty_answers_again() {
        // A queue's 20 s long poll: empty answers take the whole wait (a poll), a batch
        // comes before it (no poll by its length). The empty answers after each batch
        // are not the ones before it: eight a stretch, never twenty in a row.
        let receive = |messages: bool| {
            let (result, ms) = if messages {
                (json!({"Messages": [{"MessageId": "m", "Body": "order shipped"}]}), 7_700.0)
            } else {
                (json!({"Messages": []}), 20_010.0)
            };
            let mut e = call("receive_messages", json!({"queue_url": "q", "wait_time_seconds": 20}), result);
            e["duration_ms"] = json!(ms);
            e
        };
        let mut evs = Vec::new();
        for _ in 0..6 {
            evs.extend((0..8).map(|_| receive(false)));
            evs.push(receive(true));
            evs.push(call("handle_order_event", json!({"order": evs.len()}), json!({"ok": true})));
        }
        assert!(of_alone(&evs, PollNoProgress).is_empty());
        // A failure between is no answer of the queue's: the count goes on.
        let mut failing = receive(false);
        failing["is_error"] = json!(true);
        failing["result"] = json!("ConnectionResetError: peer closed");
        failing["duration_ms"] = json!(40.0);
        let mut across: Vec<Value> = (0..8).map(|_| receive(false)).collect();
        across.push(failing);
        across.extend((0..13).map(|_| receive(false)));
        assert_eq!(of_alone(&across, PollNoProgress).last(), Some(&(21, Level::Terminate)));
        // Twenty empty answers in a row are ended, as any poll's.
        let idle: Vec<Value> = (0..21).map(|_| receive(false)).collect();
        assert_eq!(of_alone(&idle, PollNoProgress), vec![(10, Level::Warning), (20, Level::Terminate)]);
    }
}
