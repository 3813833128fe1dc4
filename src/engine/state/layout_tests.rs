//! The stored layout of [`SessionState`], derived from its declarations (the engine's
//! fields and every detector's [`crate::engine::detectors::Detector::State`]) by tracing
//! its serde shape, and pinned to [`crate::engine::store::STATE_FORMAT`]: a change of
//! what is written (a counter added, removed, retyped or moved) fails here until it is a
//! new state format. Names are compared too: postcard writes values in order, without
//! names, but two counters of one type swapped would read each other's values, and a
//! rename costs only a new number. A counter of nothing (`()`) writes nothing and is no
//! change.

use serde_reflection::{ContainerFormat, Format, Registry, Samples, Tracer, TracerConfig};

use super::*;
use crate::engine::store::STATE_FORMAT;

const RECORD: &str = "LOOPWARDEN_RECORD_STATE";

/// One line per value written, in order: its path and its wire type.
fn layout() -> Vec<String> {
    let mut tracer = Tracer::new(TracerConfig::default());
    tracer
        .trace_simple_type::<DetectorKind>()
        .expect("DetectorKind traces");
    let samples = Samples::new();
    tracer
        .trace_type::<SessionState>(&samples)
        .expect("SessionState traces");
    let registry = tracer.registry().expect("every traced type is complete");
    let mut lines = Vec::new();
    walk(
        &registry,
        &Format::TypeName("SessionState".into()),
        "",
        &mut lines,
    );
    lines
}

/// Appends the values `format` writes, as `path: type` lines (a container's fields as
/// lines of their own, a collection's element inline).
fn walk(registry: &Registry, format: &Format, path: &str, lines: &mut Vec<String>) {
    if let Format::TypeName(name) = format {
        if let Some(ContainerFormat::Struct(fields)) = registry.get(name) {
            for field in fields {
                let path = if path.is_empty() {
                    field.name.clone()
                } else {
                    format!("{path}.{}", field.name)
                };
                walk(registry, &field.value, &path, lines);
            }
            return;
        }
    }
    if let Some(wire) = wire(registry, format) {
        lines.push(format!("{path}: {wire}"));
    }
}

/// The wire type of a value (`None`: written as nothing).
fn wire(registry: &Registry, format: &Format) -> Option<String> {
    let inner = |f: &Format| wire(registry, f).unwrap_or_else(|| "()".into());
    Some(match format {
        Format::Unit => return None,
        Format::TypeName(name) => match registry.get(name).expect("traced") {
            ContainerFormat::UnitStruct => return None,
            ContainerFormat::NewTypeStruct(f) => return wire(registry, f),
            ContainerFormat::TupleStruct(fs) => tuple(fs.iter().map(inner)),
            ContainerFormat::Struct(fields) => format!(
                "{{{}}}",
                fields
                    .iter()
                    .filter_map(|f| wire(registry, &f.value))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            // A variant index; appending variants keeps every stored index (and
            // `stored_indices_never_move` keeps the detectors' in place).
            ContainerFormat::Enum(variants) => {
                let shaped: Vec<String> = variants
                    .iter()
                    .filter_map(|(i, v)| match &v.value {
                        serde_reflection::VariantFormat::Unit => None,
                        other => Some(format!("{i}: {other:?}")),
                    })
                    .collect();
                if shaped.is_empty() {
                    "variant".into()
                } else {
                    format!("variant {{{}}}", shaped.join(", "))
                }
            }
        },
        Format::Option(f) => format!("option<{}>", inner(f)),
        Format::Seq(f) => format!("seq<{}>", inner(f)),
        Format::Map { key, value } => format!("map<{}, {}>", inner(key), inner(value)),
        Format::Tuple(fs) => tuple(fs.iter().map(inner)),
        Format::TupleArray { content, size } => format!("[{}; {size}]", inner(content)),
        primitive => format!("{primitive:?}").to_lowercase(),
    })
}

fn tuple(parts: impl Iterator<Item = String>) -> String {
    format!("({})", parts.collect::<Vec<_>>().join(", "))
}

/// The layout as the file records it: the format's number, then one line per value.
fn recorded(format: u32, lines: &[String]) -> String {
    format!("format {format}\n{}\n", lines.join("\n"))
}

/// The recorded layout: its format's number and its lines.
fn read_recorded(path: &str) -> Option<(u32, Vec<String>)> {
    let file = std::fs::read_to_string(path).ok()?;
    let (head, body) = file.split_once('\n').unwrap_or((&file, ""));
    let format = head
        .strip_prefix("format ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{path}: the first line names the format (`format N`)"));
    Some((format, body.lines().map(str::to_string).collect()))
}

#[test]
fn the_stored_layout_is_the_state_formats() {
    let path = format!(
        "{}/tests/fixtures/state-layout.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let now = layout();
    let recorded_before = read_recorded(&path);
    let bumped = recorded_before
        .as_ref()
        .is_none_or(|(format, _)| *format != STATE_FORMAT);
    // Recording writes a new format's layout only: a changed layout under the format
    // already recorded is the mistake this test is here to catch.
    if std::env::var_os(RECORD).is_some() && bumped {
        std::fs::write(&path, recorded(STATE_FORMAT, &now)).unwrap();
    }
    let (format, was) = read_recorded(&path).unwrap_or_else(|| panic!("{path}: missing"));
    assert_eq!(
        format, STATE_FORMAT,
        "STATE_FORMAT is {STATE_FORMAT}, the recorded layout is format {format}'s: record \
         the new one: {RECORD}=1 cargo test --lib engine::state"
    );
    assert!(
        was == now,
        "the stored layout of SessionState changed but STATE_FORMAT is still {format}: \
         states written before would be misread. Bump STATE_FORMAT (src/engine/store.rs), \
         then record the layout and its state fixture: {RECORD}=1 cargo test --lib \
         engine::state. Now:\n{}",
        recorded(STATE_FORMAT, &now)
    );
}

#[test]
fn the_layout_names_every_counter_and_only_loop_detectors_keep_them() {
    let now = layout();
    for line in ["counters.repeat: u32", "counters.cycle: [u32; 10]"] {
        assert!(now.iter().any(|l| l == line), "{line} in {now:#?}");
    }
    // Counters reset with the run: a budget or ceiling that kept some would lose its
    // count when `run_id` changes.
    for kind in DetectorKind::ALL.iter().filter(|k| k.is_ceiling()) {
        let prefix = format!("counters.{kind}");
        assert!(
            !now.iter().any(|l| l.starts_with(&prefix)),
            "{kind} counts across runs: it keeps no counters of its own"
        );
    }
}
