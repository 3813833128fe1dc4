//! Every labelled case of the scenario corpus (copied from the shared design repo into
//! `tests/fixtures/scenarios.jsonl`) must hold under the default configuration.

use std::io::BufReader;
use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::engine::levels::Level;
use loopwarden::tools::eval::run_corpus;

#[test]
fn every_scenario_case_holds_with_the_defaults() {
    let path = format!(
        "{}/tests/fixtures/scenarios.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let file = std::fs::File::open(&path).unwrap();
    let config = Arc::new(Config::default());
    let mut failed = Vec::new();
    let totals = run_corpus(&config, &mut BufReader::new(file), |r| match r {
        Ok(c) if !c.held => failed.push(format!("{}: {}", c.id, c.failures.join("; "))),
        Ok(_) => {}
        Err((line, e)) => failed.push(format!("line {line}: {e}")),
    })
    .unwrap();
    assert!(totals.cases >= 55, "corpus shrank: {totals}");
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(totals.held, totals.cases);
}

#[test]
fn a_stricter_config_is_caught_by_eval() {
    // The corpus is a gate: a config that kills on the first repeat must fail cases.
    let path = format!(
        "{}/tests/fixtures/scenarios.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let file = std::fs::File::open(&path).unwrap();
    let config = Arc::new(
        Config::from_toml_str(
            "[detectors.repeat]\nwarn_at = 1\nterminate_at = 2\ngrace_steps = 0\n",
            "t",
            std::iter::empty(),
        )
        .unwrap(),
    );
    let totals = run_corpus(&config, &mut BufReader::new(file), |_| {}).unwrap();
    assert!(totals.false_kills > 0, "{totals}");
    assert!(totals.held < totals.cases);
}

/// `loopwarden eval` of a generated corpus (`tests/fixtures/<generator>`): the defaults kill
/// none of its healthy sessions, and exactly the cases `known` do not hold (a case that
/// comes to hold must leave the list).
fn holds_but_the_known(generator: &str, cases: usize, known: &[&str]) {
    holds_but_the_known_and_disputed(generator, cases, known, &[]);
}

/// [`holds_but_the_known`], where `disputed` are the only cases ended against their
/// labels, each by the detector named beside it: kills at the DESIGN's defaults that a
/// tester would have held back (each is in `known` too, and the reason is written beside
/// it).
fn holds_but_the_known_and_disputed(
    generator: &str,
    cases: usize,
    known: &[&str],
    disputed: &[(&str, &str)],
) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    let generated = std::process::Command::new("python3")
        .arg(format!(
            "{}/tests/fixtures/{generator}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(&corpus)
        .output()
        .expect("python3 runs the corpus's generator");
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let config = Arc::new(Config::default());
    let mut unexpected = Vec::new();
    let file = std::fs::File::open(&corpus).unwrap();
    let totals = run_corpus(&config, &mut BufReader::new(file), |r| match r {
        Ok(c) if c.held == known.contains(&c.id.as_str()) => unexpected.push(if c.held {
            format!("{}: holds now; take it off the list", c.id)
        } else {
            format!("{}: {}", c.id, c.failures.join("; "))
        }),
        Ok(c) if c.false_kill != disputed.iter().any(|(id, _)| *id == c.id) => {
            unexpected.push(format!(
                "{}: false kill {}: {}",
                c.id,
                c.false_kill,
                c.failures.join("; ")
            ))
        }
        Ok(c) if c.false_kill => {
            let by = (c.findings.iter())
                .find(|(_, _, level)| *level == Level::Terminate)
                .map(|(_, detector, _)| detector.as_str());
            let named = disputed.iter().find(|(id, _)| *id == c.id).map(|(_, d)| *d);
            if by != named {
                unexpected.push(format!("{}: ended by {by:?}, not {named:?}", c.id));
            }
        }
        Ok(_) => {}
        Err((line, e)) => unexpected.push(format!("line {line}: {e}")),
    })
    .unwrap();
    assert_eq!(totals.cases, cases, "{totals}");
    assert_eq!(totals.false_kills, disputed.len(), "{totals}");
    assert!(unexpected.is_empty(), "{}", unexpected.join("\n"));
}

/// Sessions of agents outside coding, labelled by a tester who had not seen the detectors
/// (`tests/fixtures/domains.py`, its docstring says how); the corpus states what its
/// tester wanted, not what loopwarden does.
#[test]
fn a_cold_corpus_of_other_domains_has_no_false_kill() {
    let known = [
        // Nudges the defaults give on purpose (DESIGN §3): the same action 10 times in
        // the window (`generic_repeat`, never a kill), the 10th unchanged poll
        // (`poll_no_progress`), the same words each turn while a poll waits.
        "web-council-minutes-scroll-healthy",
        "data-bigquery-job-running-poll-healthy",
        "ops-checkout-rollout-progress-poll-healthy",
        "travel-pnr-ticketing-pending-poll-healthy",
        "gui-admin-table-next-page-healthy",
        // Later than its tester wanted, or not stopped: rephrased searches whose answers
        // repeat while each call is new (warned at the third such turn, one event late),
        // polls of a finished job, a restart loop whose pod names change, two sub-agents
        // handing a task back and forth (each answer with the sub-run's own turns and
        // cost).
        "web-headphone-price-same-search-stuck",
        "web-rate-limit-two-page-oscillation-stuck",
        "ops-migration-job-completed-repoll-stuck",
        "ops-crashloop-restart-loop-stuck",
        "rag-contract-missing-amendment-stuck",
        "orch-finance-marketing-delegation-pingpong-stuck",
    ];
    holds_but_the_known("domains.py", 38, &known);
}

/// A second cold corpus (`tests/fixtures/domains2.py`), written after the first one's
/// changes and held out for them.
#[test]
fn a_second_cold_corpus_has_no_false_kill() {
    let known = [
        // Late or not stopped: a paging loop whose pages are the same first page (warned
        // in time as no new information, which never kills), a finished containment polled
        // again and two queries swung between (each answer
        // with its own `query_time`/`executionTime`, a measurement), an oscillation of a
        // match and its undoing, a reboot loop of a device that stays offline.
        "d2-ecom-page-param-ignored",
        "d2-soc-edr-poll-after-contained",
        "d2-soc-kql-broad-narrow-oscillation",
        "d2-fin-match-unmatch-oscillation",
        "d2-iot-reboot-offline-loop",
        // Nudges on honest work: a product not ready yet retried with backoff (critical,
        // no kill), repeated phrasing over moving polls, ping timeouts of offline devices
        // during a sweep, a transcode job whose `PROGRESSING` is no pending word.
        "d2-fin-plaid-product-not-ready",
        "d2-iot-firmware-rollout-waves",
        "d2-iot-offline-device-sweep",
        "d2-media-transcode-long-wait",
    ];
    holds_but_the_known("domains2.py", 27, &known);
}

/// A third cold corpus (`tests/fixtures/domains3.py`), written after every change of the
/// look that wrote the first two: held out for all of them (on the release before, it
/// held 21 of 26 cases with one false kill: an ads report waited on between `sleep`s).
#[test]
fn a_third_cold_corpus_has_no_false_kill() {
    let known = [
        // Nudges on honest work: a call's status `ringing` three times.
        "d3-voice-call-status",
        // Late or not stopped: a delivered package and an aborted run polled on between
        // waits (a check after a wait is a poll: `poll_no_progress` warns at its 10th
        // unchanged answer and ends it at its 20th, past the session's end), a redial loop
        // whose every call has a new SID.
        "d3-logistics-poll-delivered",
        "d3-lab-poll-aborted-run",
        "d3-voice-redial-no-answer",
    ];
    holds_but_the_known("domains3.py", 26, &known);
}

/// A fourth cold corpus (`tests/fixtures/domains4.py`: games, robots, HPC, calendars,
/// spreadsheets, proofs, chemistry, tax, procurement, fact-checking), written in the
/// forty-eighth look before its changes and held out for them: on the release before,
/// it held 16 of 30 cases with one false kill (a batch job queued for hours, its queue
/// line checked between 15-minute waits, ended as a swing by `ping_pong`).
#[test]
fn a_fourth_cold_corpus_has_no_false_kill() {
    let known = [
        // Nudges on honest work: throttled sheet writes retried after back-offs (their
        // same answers no news), a tax return resubmitted with the very arguments that
        // failed (the corpus says it was fixed; its arguments say not).
        "d4-sheet-quota-backoff",
        "d4-tax-mtd-vat-return",
        // Warned, not stopped: a crossword's two answers tried in turn (no news, which
        // never kills), a robot driving into a box (each frame and stamp new), a failing
        // job resubmitted (each with a new job id; words only), 1099s resubmitted into a
        // second run (a new run resets the loop detectors, DESIGN §3).
        "d4-games-crossword-ums-ahs",
        "d4-robot-amr-bumper-blocked",
        "d4-hpc-gromacs-oom-resubmit",
        "d4-tax-1099-tin-name-resubmit",
        // Late: a finished job's empty queue checked by `sleep 60 && squeue` (a check after
        // its own sleep, a poll as a check after a wait is; its job never read as working:
        // SLURM writes `R`).
        "d4-hpc-squeue-empty-misread",
        // Not seen: a screen restarted by each compaction (tool calls between them), a
        // closed RFQ polled every three hours.
        "d4-chem-compaction-restarts-screen",
        "d4-proc-waiting-on-uninvited-vendor",
        // Stopped, 2 to 14 events after their tester wanted (`ping_pong`, `cycle`,
        // `repeat` at their defaults).
        "d4-cal-two-slot-seesaw",
        "d4-cal-scheduler-roombooker-pingpong",
        "d4-sheet-pivot-refresh-stale",
        "d4-proof-lean-omega-nonlinear",
        "d4-proc-avl-vs-quote-seesaw",
    ];
    holds_but_the_known("domains4.py", 30, &known);
}

/// A fifth cold corpus (`tests/fixtures/domains5.py`: coding harnesses in the shapes of
/// Claude Code and OpenHands, notebooks, Terraform, databases, crawling, CI, Android, multi-
/// agent frameworks, long documents), written in the forty-ninth look before its changes
/// and held out for them: on the release before, it held 14 of 30 cases with one false
/// kill (an emulator's boot checked by `sleep 20; getprop`, the same empty answer eight
/// times, ended as a repeat).
#[test]
fn a_fifth_cold_corpus_has_no_false_kill() {
    let known = [
        // Nudges on honest work: a cell run once an epoch (its metrics are digits: the same
        // answer up to digits is no news; the same cell ten times in the window), a slow
        // provisioning's log read by the same command (the same words each turn), pages of
        // distinct rows through the same call (the same action ten times in the window),
        // an infinite scroll's same answer between reads of new cards (held at critical), a
        // long translation's output.
        "d5-nb-epoch-training-healthy",
        "d5-tf-rds-slow-provision-healthy",
        "d5-db-keyset-paged-export-healthy",
        "d5-web-infinite-scroll-jobs-healthy",
        "d5-doc-translate-handbook-healthy",
        // Stopped 2 to 6 events after their tester wanted (`repeat`, `cycle`,
        // `error_repeat` at their defaults; a Terraform state lock retried the same way
        // is ended at its 6th failure since the fifty-first look, one failure late).
        "d5-tf-state-lock-retry-loop",
        "d5-cc-edit-old-string-not-found-loop",
        "d5-oh-alternating-two-fixes",
        "d5-db-migration-lock-timeout-loop",
        "d5-ma-langgraph-handoff-ping-pong",
        // Late or not stopped: a verification pass restarted by each compaction (warned as
        // no news, which never kills), a refit failing the same way after a `fillna` never
        // assigned (each run's `execution_count` new; README's notebook setting warns it in
        // time and ends it two events late), pages whose answers echo their own URL, a bot
        // challenge met six times, a finished CI run polled between waits (as corpus 3's
        // aborted run), a paragraph rewritten eleven times (its check's word count moving
        // in digits, which is a change).
        "d5-cc-compaction-restarts-finished-work",
        "d5-nb-nan-fillna-refit-loop",
        "d5-web-pagination-returns-same-page",
        "d5-ci-polls-finished-run-forever",
        "d5-web-captcha-retries-then-switches",
        "d5-doc-revise-same-paragraph-loop",
    ];
    holds_but_the_known("domains5.py", 30, &known);
}

/// A sixth cold corpus (`tests/fixtures/domains6.py`: a Codex-CLI-shaped and a Cursor-shaped
/// coding harness, a smolagents code agent, customer support, research, data engineering,
/// MCP tools, security, spreadsheets, computer use), written in the fiftieth look before
/// its `no_progress` change and held out for it: on the release before, it held 23 of 30
/// cases, with one false alarm (a plan's share of steps done, reported at each model call,
/// standing still through one step's six calls) and one false kill (below).
#[test]
fn a_sixth_cold_corpus_has_only_its_disputed_kill() {
    let disputed = [
        // The same Cursor edit failing to apply five times, the same 13 lines read before
        // each: `ping_pong` ends a strict A,B tail of unchanged results at 10 calls (its
        // DESIGN default), 4 turns after its warning; the tester would have let it try a
        // sixth time (it then edits another way). Kept: two calls alternating with the
        // same answers five times over is the swing the default is set for.
        ("d6-cursor-edit-not-applied-recovers", "ping_pong"),
    ];
    let known = [
        "d6-cursor-edit-not-applied-recovers",
        // Not stopped, or late: twenty rephrased searches all finding nothing (an empty
        // answer to a new question is an answer: a verification pass looks the same), a
        // sub-agent redoing its searches after each compaction (a new note id each time
        // breaks the cycle; warned as no news), the same Slack post answered with a new
        // `ts` each time (ended by `repeat`'s window, 12 events late), a dead button whose
        // screen differs only in the taskbar clock (a success's digits are data), the same
        // SIEM search with a new `search_id` and `took_ms` (warned one event late).
        "d6-research-phantom-paper",
        "d6-research-compaction-restarts",
        "d6-mcp-slack-duplicate-announcements",
        "d6-gui-dead-submit-button",
        "d6-sec-ioc-search-wrong-index-recovers",
    ];
    holds_but_the_known_and_disputed("domains6.py", 30, &known, &disputed);
}

/// A seventh cold corpus (`tests/fixtures/domains7.py`: a Playwright-MCP browser agent,
/// a phone agent, healthcare scheduling, legal review, e-commerce operations, LangGraph
/// with interrupts and AutoGen teams reporting `progress`, game QA, ML engineering, an IT
/// helpdesk), written at the end of the fiftieth look, after its changes, and used for
/// none of them: on `63ccccf` it held 17 of 30 with four false kills (three of them
/// `no_progress` under a flat score: an approval awaited, migrations run one by one, a
/// sweep's trials); on that look's last build 18, with one (the same lookup failing five
/// times, ended by `error_repeat` at the 5th, which the fifty-first look moved to the
/// 6th). Its Playwright paging led to the fifty-first look's paging rule.
#[test]
fn a_seventh_cold_corpus_has_no_false_kill() {
    let known = [
        // Nudges on honest work: an approval awaited with the same state read six times
        // (no news, critical); migrations run one by one under a flat score (its third
        // weight warns at the ninth report; the same test command ten times).
        "d7-lgr-hitl-approval-wait",
        "d7-lgr-flat-progress-migrations",
        // Late or not stopped: a dead Submit whose short snapshot differs in a countdown
        // and a Ray ID (a new answer after each click: it may have paged, so `repeat`'s
        // window only nudges), a phone menu whose transcripts differ in timings and
        // confidences, fourteen reworded searches finding nothing, two pin-cite fixes
        // alternated (one event late), the same sync hammering a 429 (ended four events
        // late), a finished job polled (a status says what is over, not what the agent
        // waits on), compaction restarting finished audits (one event late), a build
        // relaunched that crashes at boot with a new pid each time.
        "d7-pw-dead-submit",
        "d7-ph-ivr-menu-loop",
        "d7-hc-patient-search-rephrase",
        "d7-lg-pincite-alternate",
        "d7-ec-429-hammer",
        "d7-ec-poll-finished-job",
        "d7-lgr-compaction-restart",
        "d7-gq-crash-relaunch",
    ];
    holds_but_the_known("domains7.py", 30, &known);
}

/// An eighth cold corpus (`tests/fixtures/domains8.py`: a Gemini-CLI-shaped and an
/// Aider-shaped coding agent, OpenAI Agents SDK handoffs, pydantic-ai and Strands typed
/// tools, Kubernetes incidents, desktop computer use, bioinformatics pipelines, market
/// data, mail and calendar, firmware), written in the fifty-first look after its paging
/// rule and before the rest: on `c56516b` it held 12 of 30 with three false kills (a
/// scroll through expenses with a screenshot after each, a board's serial port read until
/// it booted, an Aider edit failing five times before the agent read the file).
#[test]
fn an_eighth_cold_corpus_has_no_false_kill() {
    let known = [
        // Nudges on honest work: a rollout's queries and a market's quotes whose answers
        // change only in digits (no news up to digits, warned and critical), a scroll
        // through expenses with a screenshot after each (an image new to the run may be a
        // new page or the same one with a new clock: `repeat`'s window only nudges).
        "k8s-healthy-oom-rollout",
        "trade-healthy-momentum-research",
        "cu-healthy-scroll-expenses",
        // Not nudged: an order resent at new limit prices (each a new call), a board's
        // serial port read seven times to no answer before the agent asks for a reset (a
        // read that waits out its timeout is a poll: `poll_no_progress` warns at 10).
        "trade-critical-order-rejected",
        "fw-critical-needs-manual-reset",
        // Late or not stopped: an edit failing the same way between reads (ended six
        // events late), rephrased searches answering nothing, two fixes alternated whose
        // test output differs in its time, handoffs bounced between two agents (seven
        // events late), a validation error repeated (ended at its 6th, two events late),
        // restarts into the same crash with new pod names (it may have paged: nudged),
        // a disabled button clicked a few pixels apart, scrolls at a page's bottom whose
        // screenshots differ in a clock, a finished job polled, the same backtest with a
        // new run id, mail redone after each compaction, a board reflashed into the same
        // panic caught at new points.
        "gem-stuck-replace-nomatch",
        "gem-stuck-websearch-rephrase",
        "aider-stuck-tz-flipflop",
        "oai-stuck-handoff-pingpong",
        "pyd-stuck-identical-validation",
        "k8s-stuck-crashloop-restart",
        "cu-stuck-disabled-submit",
        "cu-stuck-scroll-bottom",
        "bio-stuck-poll-finished-job",
        "trade-stuck-same-backtest",
        "mail-stuck-compaction-restart",
        "fw-stuck-bootloop-reflash",
    ];
    holds_but_the_known("domains8.py", 30, &known);
}

/// A ninth cold corpus (`tests/fixtures/domains9.py`: a Cline-shaped coding agent, Chrome
/// DevTools MCP, a warehouse analyst, a Minecraft agent, a Windows accessibility-tree
/// agent, OCR batches, issue triage, a queue consumer, literature search, KYC), written in
/// the fifty-first look after its paging, timeout and `error_repeat` changes and held out
/// for them: on `c56516b` it held 17 of 30 with one false kill (a queue consumer's empty
/// long polls, ended as a repeat at the fourth).
#[test]
fn a_ninth_cold_corpus_has_no_false_kill() {
    let known = [
        // A nudge on honest work: an infinite scroll's reads answering the same script
        // and wait (no news up to digits, warned and critical).
        "cdt-h2-infinite-scroll",
        // Not nudged: the same bad query resubmitted as new jobs (a new job id in each
        // answer), the same duplicate notice posted with a new comment id each time,
        // reworded searches finding nothing.
        "sql-s2-resubmit-bad-column",
        "gh-s1-duplicate-comments",
        "lit-s1-rephrased-nothing",
        // Late or not stopped: two failing fixes alternated (one event late, ended five
        // late), a dead `Load more` whose snapshot renumbers every uid (so each click is a
        // new call), a finished statement polled with a new request id, an installer's
        // disabled `Next` (ended two events late), a stale cursor fetched again (nudged
        // three events late), a poison message redelivered (its receive count new each
        // time), a citation walk in a cycle of three.
        "cline-s1-date-flipflop",
        "cdt-s1-load-more-noop",
        "sql-s1-poll-finished",
        "win-s1-installer-next",
        "gh-s2-stale-cursor",
        "mq-s1-poison-redelivery",
        "lit-s2-citation-cycle",
    ];
    holds_but_the_known("domains9.py", 30, &known);
}
