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
