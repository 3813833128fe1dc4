//! Entry points for the fuzzers (`fuzz/`, coverage-guided, `scripts/fuzz`) and for the
//! test that replays their corpus (`tests/fuzz_corpus.rs`): one per parser of outside
//! input, each taking raw bytes as that parser gets them.
//!
//! Guarantees: an entry point panics only on a bug. Every input is either accepted or
//! refused with an error that says what and where (all the parsers return `Result`; a
//! panic anywhere below is the bug the fuzzer reports), and the invariants each one
//! checks on top hold: the event parser's two paths agree; an OTLP export's events are
//! valid contract events; a configuration that loads prints (`--print-config`) as one
//! that loads the same; what a restore stores loads back.

use crate::bus::pipeline::{assemble_changelog, ChangelogRecordParts};
use crate::config::Config;
use crate::contract::event::{parse_event, ParseLimits};
use crate::contract::otlp::{self, Encoding, Mapper};
use crate::engine::store::{MemoryStore, StateStore};

/// An input event (a Kafka value or a JSON Lines line), read with the default limits and
/// with tight ones; both parse paths must agree.
pub fn event_json(data: &[u8]) {
    let tight = ParseLimits {
        max_event_bytes: 4096,
        max_nesting: 3,
    };
    for limits in [ParseLimits::default(), tight] {
        let parsed = parse_event(data, &limits);
        if let Err(e) = &parsed {
            // Every refusal has a reason (the dead letter's header) and a message.
            assert!(!e.reason().is_empty() && !e.to_string().is_empty());
        }
        if let Some(disagreement) = crate::contract::event::parse_paths_disagree(data, &limits) {
            panic!("the event parser's paths disagree: {disagreement}");
        }
    }
}

/// An OTLP trace export in protobuf (a Kafka message of the OTLP Kafka exporter).
pub fn otlp_proto(data: &[u8]) {
    otlp_export(data, Encoding::OtlpProto);
}

/// An OTLP trace export in JSON (an export object or its bare array of resource spans).
pub fn otlp_json(data: &[u8]) {
    otlp_export(data, Encoding::OtlpJson);
}

fn otlp_export(data: &[u8], encoding: Encoding) {
    let Ok(request) = otlp::decode(data, encoding) else {
        return;
    };
    let mut events = Vec::new();
    Mapper::default().map(&request, &mut events);
    for event in &events {
        // The mapper dead-letters what the engine would refuse: what it maps is valid.
        if let Err(e) = parse_event(&event.json, &ParseLimits::default()) {
            panic!(
                "a mapped span is not a valid event ({e}): {}",
                String::from_utf8_lossy(&event.json)
            );
        }
    }
}

/// A configuration file and `LOOPWARDEN_` variables: the file's text, then (after the
/// first NUL byte) one `NAME=value` variable per line.
pub fn config(data: &[u8]) {
    let (text, env) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    // `Config::load` reads the file as UTF-8 and refuses it otherwise; variables that
    // are not UTF-8 never reach it (`std::env::vars` skips them).
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let Ok(config) = Config::from_toml_str(text, "fuzz.toml", env.into_iter()) else {
        return;
    };
    let printed = config.effective_toml();
    match Config::from_toml_str(&printed, "printed", std::iter::empty()) {
        Ok(again) => assert_eq!(
            again.effective_toml(),
            printed,
            "the printed configuration loads as another one"
        ),
        Err(e) => panic!("the printed configuration does not load ({e}):\n{printed}"),
    }
}

/// Changelog records, framed as [`changelog_records`] reads them, restored into a store,
/// from which an engine is then loaded.
pub fn changelog(data: &[u8]) {
    let records = changelog_records(data);
    let mut store = MemoryStore::new();
    let _ = assemble_changelog(&records, &mut store);
    // Whatever was stored loads as an engine loads it (a state it cannot read is
    // skipped with a warning, or refused with the session it belongs to).
    let _ = store.load_sessions();
    let _ = store.offset("in/0");
}

/// Reads changelog records out of fuzzer bytes: each is a kind byte (0 `commit`,
/// 1 `session`, 2 no kind header, else that byte as the kind) and four fields (the
/// batch header, the state format header, the key, the payload), each a presence byte
/// (0: absent) then, when present, a little-endian `u16` length and that many bytes.
pub fn changelog_records(data: &[u8]) -> Vec<ChangelogRecordParts<'_>> {
    let mut rest = data;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let mut records = Vec::new();
    const KINDS: [&[u8]; 2] = [b"commit", b"session"];
    while let Some(kind) = take(1) {
        let kind = match kind[0] {
            k @ (0 | 1) => Some(KINDS[usize::from(k)]),
            2 => None,
            _ => Some(kind),
        };
        let mut field = || -> Option<Option<&[u8]>> {
            if take(1)?[0] == 0 {
                return Some(None);
            }
            let len = take(2)?;
            let len = u16::from_le_bytes([len[0], len[1]]);
            take(usize::from(len)).map(Some)
        };
        let (Some(batch), Some(format), Some(key), Some(payload)) =
            (field(), field(), field(), field())
        else {
            break;
        };
        records.push(ChangelogRecordParts {
            kind,
            batch,
            format,
            key,
            payload,
        });
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changelog_records_are_read_back_as_framed() {
        let mut data = vec![1, 1, 2, 0];
        data.extend(b"42");
        data.extend([0, 1, 1, 0, b'a', 1, 1, 0, b'S']);
        data.extend([0, 0, 0, 0, 1, 3, 0, b'{', b'}']);
        let records = changelog_records(&data);
        // The second's payload is cut short: it is left out, not read past the end.
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].kind, Some(&b"session"[..]));
        assert_eq!(records[0].batch, Some(&b"42"[..]));
        assert_eq!(records[0].format, None);
        assert_eq!(records[0].key, Some(&b"a"[..]));
        assert_eq!(records[0].payload, Some(&b"S"[..]));
    }

    #[test]
    fn each_entry_point_takes_an_empty_and_a_valid_input() {
        for f in [event_json, otlp_proto, otlp_json, config, changelog] {
            f(b"");
        }
        event_json(br#"{"type":"tool.called","session_id":"s","tool":"t","args":{"a":1}}"#);
        config(b"[engine]\nsession_gap_secs = 60\n\0LOOPWARDEN_KAFKA__WORKERS=2\n");
    }
}
