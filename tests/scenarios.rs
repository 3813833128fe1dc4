//! Every labelled case of the scenario corpus (copied from the shared design repo into
//! `tests/fixtures/scenarios.jsonl`) must hold under the default configuration.

use std::io::BufReader;
use std::sync::Arc;

use loopwarden::config::Config;
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

/// Sessions of agents outside coding, labelled by a tester who had not seen the detectors
/// (`tests/fixtures/domains.py`, its docstring says how): the defaults kill none of its
/// healthy sessions, and exactly the cases listed do not hold, each with why (a case
/// that comes to hold is taken off the list); the corpus states what its tester wanted,
/// not what loopwarden does.
#[test]
fn a_cold_corpus_of_other_domains_has_no_false_kill() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("domains.jsonl");
    let generated = std::process::Command::new("python3")
        .arg(format!(
            "{}/tests/fixtures/domains.py",
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
    // Cases that do not hold, and why (none a kill of a healthy session).
    let known = [
        // Nudges the defaults give on purpose (DESIGN §3): the same action 10 times in
        // the window (`generic_repeat`, never a kill), the 10th unchanged poll
        // (`poll_no_progress`), the same words each turn while a poll waits.
        "web-council-minutes-scroll-healthy",
        "data-bigquery-job-running-poll-healthy",
        "ops-checkout-rollout-progress-poll-healthy",
        "travel-pnr-ticketing-pending-poll-healthy",
        "gui-admin-table-next-page-healthy",
        // Later than its tester wanted, or not stopped: rephrased searches or polls of a
        // finished job whose answers repeat while each call is new, a restart loop whose
        // pod names change, two sub-agents handing a task back and forth (each answer
        // with the sub-run's own turns and cost).
        "web-headphone-price-same-search-stuck",
        "web-rate-limit-two-page-oscillation-stuck",
        "ops-migration-job-completed-repoll-stuck",
        "ops-crashloop-restart-loop-stuck",
        "rag-contract-missing-amendment-stuck",
        "orch-finance-marketing-delegation-pingpong-stuck",
    ];
    let config = Arc::new(Config::default());
    let mut unexpected = Vec::new();
    let file = std::fs::File::open(&corpus).unwrap();
    let totals = run_corpus(&config, &mut BufReader::new(file), |r| match r {
        Ok(c) if c.held == known.contains(&c.id.as_str()) => unexpected.push(if c.held {
            format!("{}: holds now; take it off the list", c.id)
        } else {
            format!("{}: {}", c.id, c.failures.join("; "))
        }),
        Ok(_) => {}
        Err((line, e)) => unexpected.push(format!("line {line}: {e}")),
    })
    .unwrap();
    assert_eq!(totals.cases, 38, "{totals}");
    assert_eq!(totals.false_kills, 0, "{totals}");
    assert!(unexpected.is_empty(), "{}", unexpected.join("\n"));
}
