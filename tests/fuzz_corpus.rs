//! The fuzzers' corpus and every input that ever crashed one, replayed through the same
//! entry points (`loopwarden::tools::fuzz`) on every test run: what coverage-guided fuzzing
//! found stays found. `fuzz/corpus/<target>/` holds the minimised corpus
//! (`scripts/fuzz` grows and minimises it), `fuzz/regressions/<target>/` the crashes,
//! kept after their fix.

use std::path::Path;

/// A fuzz target's name and its entry point.
type Target = (&'static str, fn(&[u8]));

const TARGETS: [Target; 5] = [
    ("event_json", loopwarden::tools::fuzz::event_json),
    ("otlp_proto", loopwarden::tools::fuzz::otlp_proto),
    ("otlp_json", loopwarden::tools::fuzz::otlp_json),
    ("config", loopwarden::tools::fuzz::config),
    ("changelog", loopwarden::tools::fuzz::changelog),
];

/// The files under `fuzz/<kind>/<target>/`, sorted (none when the folder is missing).
fn inputs(kind: &str, target: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"));
    files.sort();
    files
}

fn replay(kind: &str) -> usize {
    let mut replayed = 0;
    for (target, run) in TARGETS {
        for file in inputs(kind, target) {
            let data = std::fs::read(&file).unwrap();
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("fuzz target {target} fails on {}", file.display());
            }
            replayed += 1;
        }
    }
    replayed
}

#[test]
fn the_fuzz_corpus_of_every_target_passes() {
    for (target, _) in TARGETS {
        assert!(
            inputs("corpus", target).len() >= 10,
            "fuzz/corpus/{target} holds its corpus (scripts/fuzz)"
        );
    }
    let n = replay("corpus");
    eprintln!("{n} corpus inputs replayed");
}

#[test]
fn every_input_that_crashed_a_fuzzer_passes() {
    let n = replay("regressions");
    eprintln!("{n} crash regressions replayed");
}

/// Corpus inputs with random edits (bytes overwritten, inserted, cut), through every
/// entry point: the short run CI does on every change without building the fuzzers
/// (`scripts/fuzz` runs them coverage-guided for millions of inputs).
mod mutated {
    use proptest::prelude::*;

    use super::{inputs, TARGETS};

    /// One edit of an input: overwrite, insert or cut at a position (taken modulo the
    /// input's length).
    #[derive(Debug, Clone)]
    enum Edit {
        Set(usize, u8),
        Insert(usize, u8),
        Cut(usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Set(at, b)),
            (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Insert(at, b)),
            any::<usize>().prop_map(Edit::Cut),
        ]
    }

    fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for e in edits {
            let len = data.len().max(1);
            match *e {
                Edit::Set(at, b) if !data.is_empty() => data[at % len] = b,
                Edit::Insert(at, b) => data.insert(at % (data.len() + 1), b),
                Edit::Cut(at) if !data.is_empty() => data.truncate(at % len),
                _ => {}
            }
        }
        data
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn edited_corpus_inputs_are_accepted_or_refused_never_a_panic(
            target in 0..TARGETS.len(),
            pick in any::<usize>(),
            edits in proptest::collection::vec(edit(), 1..8),
        ) {
            let (name, run) = TARGETS[target];
            let corpus = inputs("corpus", name);
            prop_assume!(!corpus.is_empty());
            let data = apply(std::fs::read(&corpus[pick % corpus.len()]).unwrap(), &edits);
            run(&data);
        }
    }
}
