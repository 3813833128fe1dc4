//! The built binary, as a user runs it: replay (file, stdin, bad lines, --strict, table),
//! eval, check-config, simulate, the demo and --help.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_loopwarden"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.env_remove("LOOPWARDEN_CONFIG");
    c
}

fn run_with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails, showing the whole of it, unless the command's standard error says `what`.
#[track_caller]
fn assert_stderr_says(out: &Output, what: &str) {
    let stderr = text(&out.stderr);
    assert!(stderr.contains(what), "stderr lacks `{what}`: {stderr}");
}

#[test]
fn replay_prints_json_lines_and_a_summary_line() {
    let out = bin()
        .args(["replay", "examples/sessions.jsonl"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let terminated: Vec<&Value> = lines
        .iter()
        .filter(|v| v["type"] == "session.terminated")
        .collect();
    let stopped: Vec<&str> = terminated
        .iter()
        .map(|v| v["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(stopped, vec!["narrating-4", "looping-2"]);
    let summaries = lines
        .iter()
        .filter(|v| v["type"] == "session.summary")
        .count();
    assert_eq!(summaries, 4, "end of input closes every session");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("replayed 42 events from 42 lines (0 bad)"),
        "{stderr}"
    );
}

#[test]
fn replay_reads_stdin_reports_bad_lines_and_derives_event_ids() {
    let good =
        r#"{"type":"tool.called","session_id":"s","tool":"read","args":{"p":1},"result":"x"}"#;
    let input = format!(
        "{good}\nnot json\n{good}\n{{\"type\":\"tool.called\",\"session_id\":\"s\"}}\n{good}\n"
    );
    let out = run_with_stdin(&["replay", "-"], &input);
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("line 2: invalid JSON"), "{stderr}");
    assert!(
        stderr.contains("line 4: missing required field `tool`"),
        "{stderr}"
    );
    assert!(stderr.contains("(2 bad)"), "{stderr}");
    // The three good lines are the same payload: the derived event_id drops the copies.
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = lines
        .iter()
        .find(|v| v["type"] == "session.summary")
        .unwrap();
    assert_eq!(summary["stats"]["duplicates_dropped"], 2);
    assert_eq!(summary["stop_reason"], "end_of_input");
}

#[test]
fn trigger_event_id_is_the_input_event_or_its_payload_hash() {
    let mut input = String::new();
    for i in 0..3 {
        input.push_str(&format!("{{\"type\":\"tool.called\",\"session_id\":\"s\",\"tool\":\"read\",\"args\":{{}},\"result\":\"x\",\"turn\":{i}}}\n"));
    }
    input.push_str("{\"type\":\"tool.called\",\"session_id\":\"s\",\"tool\":\"read\",\"args\":{},\"result\":\"x\",\"event_id\":\"mine\"}\n");
    let out = run_with_stdin(&["replay", "-"], &input);
    let findings: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] != "session.summary")
        .collect();
    assert_eq!(findings.len(), 2);
    assert!(findings[0]["trigger"]["event_id"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(findings[1]["trigger"]["event_id"], "mine");
}

#[test]
fn strict_makes_a_bad_line_fatal() {
    let out = run_with_stdin(
        &["replay", "-", "--strict"],
        "{\"type\":\"session.started\",\"session_id\":\"s\"}\n{oops\n",
    );
    assert!(!out.status.success());
    assert_stderr_says(&out, "line 2");
}

#[test]
fn table_format_has_a_header_and_rows() {
    let out = bin()
        .args(["replay", "examples/sessions.jsonl", "--format", "table"])
        .output()
        .unwrap();
    let s = text(&out.stdout);
    assert!(s.starts_with("EVENT TIME"), "{s}");
    assert!(
        s.contains("session.terminated") && s.contains("stop_reason=done"),
        "{s}"
    );
}

#[test]
fn eval_passes_the_corpus_and_fails_a_bad_config() {
    let out = bin()
        .args(["eval", "tests/fixtures/scenarios.jsonl"])
        .output()
        .unwrap();
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}");
    let cases = std::fs::read_to_string("tests/fixtures/scenarios.jsonl")
        .unwrap()
        .lines()
        .count();
    assert!(s.contains(&format!("{cases} of {cases} cases held")), "{s}");
    // An empty corpus proves nothing: not a pass.
    let empty = run_with_stdin(&["eval", "-"], "\n");
    assert_eq!(empty.status.code(), Some(1), "{}", text(&empty.stderr));
    assert_stderr_says(&empty, "holds no case");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("strict.toml");
    std::fs::write(
        &cfg,
        "[detectors.generic_repeat]\nwarn_at = 2\ncritical_at = \"off\"\nterminate_at = 3\ngrace_steps = 0\n",
    )
    .unwrap();
    let out = bin()
        .args(["eval", "tests/fixtures/scenarios.jsonl", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = text(&out.stdout);
    assert!(
        s.contains("FAILED  oc-exec-changing-output-warn-only") && s.contains("false kills: "),
        "{s}"
    );
}

#[test]
fn check_config_accepts_the_example_and_lists_every_error() {
    let out = bin()
        .args(["check-config", "loopwarden.toml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("[detectors.repeat]"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[engine]\nsession_gap_secs = 0\n[detectors.stall]\nwarn_at = \"soon\"\n[detectors.nope]\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    for key in [
        "engine.session_gap_secs",
        "detectors.stall.warn_at",
        "detectors.nope",
    ] {
        assert!(err.contains(key), "{key} missing from: {err}");
    }
}

#[test]
fn environment_overrides_apply_to_check_config() {
    let out = bin()
        .args(["check-config"])
        .env("LOOPWARDEN_DETECTORS__REPEAT__TERMINATE_AT", "7")
        .output()
        .unwrap();
    assert!(out.status.success());
    let eff: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(
        eff["detectors"]["repeat"]["terminate_at"].as_float(),
        Some(7.0)
    );
}

#[test]
fn check_config_reads_the_file_the_other_commands_read() {
    let dir = tempfile::tempdir().unwrap();
    let seven = dir.path().join("seven.toml");
    std::fs::write(&seven, "[detectors.repeat]\nterminate_at = 7\n").unwrap();
    let nine = dir.path().join("nine.toml");
    std::fs::write(&nine, "[detectors.repeat]\nterminate_at = 9\n").unwrap();
    // `repeat.terminate_at` of the effective configuration check-config prints.
    let repeat_terminate_at = |args: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]| {
        let out = bin()
            .arg("check-config")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let eff: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
        eff["detectors"]["repeat"]["terminate_at"].as_float()
    };
    let (seven, nine) = (seven.as_os_str(), nine.as_os_str());
    let by_env = repeat_terminate_at(&[], &[("LOOPWARDEN_CONFIG", seven)]);
    assert_eq!(by_env, Some(7.0));
    let by_flag = repeat_terminate_at(&["--config".as_ref(), seven], &[]);
    assert_eq!(by_flag, Some(7.0));
    let named = repeat_terminate_at(&[nine], &[("LOOPWARDEN_CONFIG", seven)]);
    assert_eq!(named, Some(9.0));
    // Set but empty, as a template leaves it: unset.
    let blank = "".as_ref();
    let env = [
        ("LOOPWARDEN_CONFIG", blank),
        ("LOOPWARDEN_THREADS", blank),
        ("LOOPWARDEN_LOG_FORMAT", blank),
    ];
    assert_eq!(repeat_terminate_at(&[nine], &env), Some(9.0));
}

#[test]
fn a_variable_that_is_not_utf8_is_named_or_passed_over() {
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = std::ffi::OsStr::from_bytes(b"w\xffrn");
    let theirs = bin()
        .args(["check-config"])
        .env("SOMEONE_ELSES", not_utf8)
        .output()
        .unwrap();
    assert!(theirs.status.success(), "{}", text(&theirs.stderr));
    let ours = bin()
        .args(["check-config"])
        .env("LOOPWARDEN_MODE", not_utf8)
        .output()
        .unwrap();
    assert_eq!(ours.status.code(), Some(2), "{}", text(&ours.stderr));
    assert_stderr_says(&ours, "LOOPWARDEN_MODE: its value is not UTF-8");
}

#[test]
fn the_example_config_documents_the_defaults() {
    let example = loopwarden::config::Config::load(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/loopwarden.toml")),
        std::iter::empty(),
    )
    .unwrap();
    let defaults = loopwarden::config::Config::default();
    assert_eq!(example.effective_toml(), defaults.effective_toml());
}

#[test]
fn help_is_there_for_every_command() {
    for cmd in [
        vec!["--help"],
        vec!["replay", "--help"],
        vec!["eval", "--help"],
        vec!["check-config", "--help"],
        vec!["run", "--help"],
        vec!["demo", "--help"],
        vec!["simulate", "--help"],
    ] {
        let out = bin().args(&cmd).output().unwrap();
        assert!(out.status.success());
        assert!(text(&out.stdout).contains("Usage"), "{cmd:?}");
    }
}

/// The README's first command, smaller: embedded broker, simulator and pipeline in one
/// process; the table at the end says what was caught.
#[test]
fn the_demo_catches_the_simulated_loops_and_stops_no_healthy_session() {
    let out = bin()
        .args([
            "demo",
            "--sessions",
            "80",
            "--rate",
            "4000",
            "--loop-share",
            "0.5",
            "--seed",
            "4",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("TERMINATED "), "{stdout}");
    assert!(stdout.contains("stop reason"), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("looping sessions:"))
        .unwrap_or_else(|| panic!("no verdict line:\n{stdout}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (caught, missed, looping, wrongly, healthy) = (nums[0], nums[1], nums[2], nums[3], nums[4]);
    assert_eq!(
        (caught + missed, looping + healthy),
        (looping, 80),
        "{line}"
    );
    assert!(
        looping > 20 && caught * 10 >= looping * 9,
        "most loops caught: {line}"
    );
    assert_eq!(wrongly, 0, "{line}");
    assert!(
        stdout.contains("80 summaries"),
        "every session summarised:\n{stdout}"
    );
}

#[test]
fn simulate_refuses_a_rate_it_cannot_pace_and_an_interrupted_run_says_so() {
    for rate in ["nan", "-1", "1e-320", "inf"] {
        let out = bin()
            .args(["simulate", "--sessions", "2", "--output", "-"])
            .arg(format!("--rate={rate}"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{rate}: {}", text(&out.stderr));
        assert_stderr_says(&out, "is not a rate");
    }
    // Interrupted at 200 events a second: no ground truth of half-written sessions, and
    // not the status of a run that finished.
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("truth.jsonl");
    let child = bin()
        .args([
            "simulate",
            "--sessions",
            "1000",
            "--rate",
            "200",
            "--output",
        ])
        .arg(dir.path().join("fleet.jsonl"))
        .arg("--truth")
        .arg(&truth)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert_stderr_says(&out, "interrupted");
    assert!(!truth.exists(), "a ground truth was written");
}

#[test]
fn simulate_writes_events_and_ground_truth_that_replay_agrees_with() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("fleet.jsonl");
    let truth = dir.path().join("truth.jsonl");
    let out = bin()
        .args([
            "simulate",
            "--sessions",
            "60",
            "--loop-share",
            "0.5",
            "--seed",
            "9",
            "--output",
        ])
        .arg(&events)
        .arg("--truth")
        .arg(&truth)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let truths: Vec<Value> = std::fs::read_to_string(&truth)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(truths.len(), 60);
    let looping: std::collections::BTreeSet<&str> = truths
        .iter()
        .filter(|t| !t["pattern"].is_null())
        .map(|t| t["session_id"].as_str().unwrap())
        .collect();
    assert!(!looping.is_empty());
    let replayed = bin().arg("replay").arg(&events).output().unwrap();
    assert!(replayed.status.success());
    let terminated: std::collections::BTreeSet<String> = text(&replayed.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "session.terminated")
        .map(|v| v["session_id"].as_str().unwrap().to_string())
        .collect();
    let expected: std::collections::BTreeSet<String> =
        looping.iter().map(|s| s.to_string()).collect();
    assert_eq!(terminated, expected);
}

#[test]
fn a_file_mapped_read_or_piped_replays_and_backtests_alike() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    // A bad line in the middle and no line break at the end.
    let mut input = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sessions.jsonl"),
    )
    .unwrap();
    let middle = input.len() / 2;
    let cut = middle + input[middle..].find('\n').unwrap() + 1;
    input.insert_str(cut, "{\"type\": 1}\n");
    let input = input.trim_end().to_string();
    std::fs::write(&path, &input).unwrap();
    for command in ["replay", "backtest"] {
        let piped = run_with_stdin(
            &[command, "-", "--threads", "1", "--format", "json"],
            &input,
        );
        assert!(piped.status.success(), "{}", text(&piped.stderr));
        assert_stderr_says(&piped, "line 22: ");
        for threads in ["1", "2"] {
            for extra in [&[][..], &["--no-mmap"][..]] {
                let out = bin()
                    .arg(command)
                    .arg(&path)
                    .args(["--threads", threads, "--format", "json"])
                    .args(extra)
                    .output()
                    .unwrap();
                let how = format!("{command} --threads {threads} {extra:?}");
                assert_eq!(text(&out.stdout), text(&piped.stdout), "{how}");
                assert_eq!(text(&out.stderr), text(&piped.stderr), "{how}");
            }
        }
    }
    // One standard input cannot hold both the events and the outcomes.
    let both = run_with_stdin(&["backtest", "-", "--outcomes", "-"], &input);
    assert_eq!(both.status.code(), Some(2));
    assert_stderr_says(&both, "cannot both be read from standard input");
    // An empty file is read (it cannot be mapped): nothing to replay.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = bin().arg("replay").arg(&empty).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    assert_stderr_says(&out, "replayed 0 events from 0 lines");
}

/// A fleet of `sessions` sessions written by `simulate` into `dir`.
fn simulated_fleet(dir: &std::path::Path, sessions: u32) -> std::path::PathBuf {
    let events = dir.join("fleet.jsonl");
    let out = bin()
        .args([
            "simulate",
            "--sessions",
            &sessions.to_string(),
            "--seed",
            "3",
            "--output",
        ])
        .arg(&events)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    events
}

#[test]
fn a_reader_that_goes_away_ends_a_command_quietly_as_a_sigpipe_would() {
    let dir = tempfile::tempdir().unwrap();
    let events = simulated_fleet(dir.path(), 600);
    let events = events.to_str().unwrap();
    // Outputs of a few hundred kilobytes or more: more than a pipe holds.
    for args in [
        vec!["replay", "--threads", "1", events],
        vec!["simulate", "--sessions", "600", "--output", "-"],
    ] {
        let mut child = bin()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 100];
        std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(!stderr.contains("error"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_gzip_input_corrupt_past_its_start_is_an_error_that_names_it() {
    use flate2::{write::GzEncoder, Compression};
    let dir = tempfile::tempdir().unwrap();
    let events = std::fs::read(simulated_fleet(dir.path(), 200)).unwrap();
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&events).unwrap();
    let mut gz = gz.finish().unwrap();
    // Past the header and the first blocks: the start reads, the middle does not.
    let middle = gz.len() / 2;
    for b in &mut gz[middle..middle + 64] {
        *b = !*b;
    }
    let path = dir.path().join("corrupt.jsonl.gz");
    std::fs::write(&path, &gz).unwrap();
    for command in ["replay", "backtest"] {
        let out = bin().arg(command).arg(&path).output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!("error: cannot read {}", path.display())),
            "{command}: {stderr}"
        );
        // How far it read, said: the lines before the corrupt block, applied.
        let lines: u64 = (stderr.split("reading input failed after ").nth(1))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{command}: no line said: {stderr}"));
        let total = events.iter().filter(|b| **b == b'\n').count() as u64;
        assert!(
            lines > 0 && lines < total,
            "{command}: {lines} of {total}: {stderr}"
        );
    }
}

#[test]
fn a_step_exported_after_its_run_ended_is_no_session_of_its_own() {
    // A run's tool span from another service, whose exporter flushed after the root
    // agent span's (the run's end, which completes the session), stamped before it.
    let kv = |k: &str, v: &str| serde_json::json!({"key": k, "value": {"stringValue": v}});
    let t0: u64 = 1_763_632_800_000_000_000;
    let span = |id: &str, parent: Option<&str>, op: &str, start_s: u64, end_s: u64| {
        let mut attributes = vec![kv("gen_ai.operation.name", op)];
        if op == "execute_tool" {
            attributes.push(kv("gen_ai.tool.name", "read"));
            attributes.push(kv(
                "gen_ai.tool.call.arguments",
                &format!("{{\"span\":\"{id}\"}}"),
            ));
            attributes.push(kv("gen_ai.tool.call.result", "fine"));
        }
        let mut s = serde_json::json!({
            "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": id, "name": op,
            "startTimeUnixNano": (t0 + start_s * 1_000_000_000).to_string(),
            "endTimeUnixNano": (t0 + end_s * 1_000_000_000).to_string(),
            "attributes": attributes,
        });
        if let Some(p) = parent {
            s["parentSpanId"] = p.into();
        }
        serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}).to_string()
    };
    let root = "b7ad6b7169203331";
    let lines = [
        span("00f067aa0ba902b7", Some(root), "execute_tool", 1, 2),
        span(root, None, "invoke_agent", 0, 10),
        span("00f067aa0ba902b8", Some(root), "execute_tool", 3, 4),
    ];
    let out = run_with_stdin(
        &["replay", "--input-format", "otlp-json", "-"],
        &(lines.join("\n") + "\n"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summaries: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|o: &serde_json::Value| o["type"] == "session.summary")
        .collect();
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(summaries[0]["closed_by"], "completed");
    assert_stderr_says(&out, "replayed 3 events");
}
