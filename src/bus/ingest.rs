//! `[ingest.otlp]`: agents that only emit OpenTelemetry. Their traces arrive on topics of
//! their own (an OpenTelemetry Collector's Kafka exporter writes them there, keyed by
//! trace id or not at all), so an ingest step maps each trace export to loopwarden events
//! ([`crate::contract::otlp`]) and re-publishes them keyed by `session_id` onto an input topic — a
//! repartition, so that a session's events reach the one instance that owns it. The same
//! mapping reads OTLP JSON files for `replay` and `backtest` ([`OtlpJsonLines`]).
//!
//! Guarantees: settings are validated without I/O with every error reported at once; a
//! file line that is not a trace export is reported with its line number and skipped,
//! never dropped silently; the events of a line come out in the order their spans ended.

use std::io::{BufRead, Read, Write};

use serde::Deserialize;

use crate::bus::kafka::settings::{invalid_topic, valid_topic, KafkaSettings};
use crate::contract::event::{without_byte_order_mark, ParseLimits};
use crate::contract::otlp::{decode, Encoding, MapReport, MappedEvent, Mapper};

/// `[ingest.otlp]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlpIngest {
    topics: Option<Vec<String>>,
    encoding: Option<String>,
    to_topic: Option<String>,
    session_attribute: Option<String>,
    group_id: Option<String>,
}

/// `[ingest]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIngest {
    otlp: Option<RawOtlpIngest>,
}

/// The OTLP ingest, when it is on (`topics` not empty).
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpIngest {
    /// The topics the Collector's Kafka exporter writes traces to.
    pub topics: Vec<String>,
    pub encoding: Encoding,
    /// The input topic the mapped events are published to.
    pub to_topic: String,
    /// The ingest's own consumer group.
    pub group_id: String,
}

impl OtlpIngest {
    /// The mapping of spans to events, within the event parser's `limits`, naming sessions
    /// by `session_attribute` after the standard attributes ([`session_attribute`]: the
    /// same for the bus ingest and for OTLP JSON files).
    pub fn mapper(session_attribute: Option<&str>, limits: &ParseLimits) -> Mapper {
        Mapper::new(session_attribute.map(str::to_string), limits.max_nesting)
    }

    /// Validates `[ingest]` against the Kafka settings it publishes into (and the spans
    /// topic loopwarden itself writes, which it must not read back).
    pub fn validate(
        raw: RawIngest,
        kafka: &KafkaSettings,
        own_spans_topic: Option<&str>,
        errors: &mut Vec<(String, String)>,
    ) -> Option<OtlpIngest> {
        // Every key is checked, the ingest on or off (off, the keys are kept for later:
        // a mistake in them should not wait for the day the topics are named).
        let raw = raw.otlp?;
        let topics = raw.topics.unwrap_or_default();
        let mut err =
            |key: &str, message: String| errors.push((format!("ingest.otlp.{key}"), message));
        for (i, t) in topics.iter().enumerate() {
            let at = format!("topics[{i}]");
            if !valid_topic(t) {
                err(&at, invalid_topic(t));
            } else if topics[..i].contains(t) {
                err(&at, format!("`{t}` is listed twice"));
            } else if kafka.input_topics.contains(t) {
                err(
                    &at,
                    format!(
                        "`{t}` is an input topic: the ingest would read back what it publishes"
                    ),
                );
            } else if kafka.output_topics().contains(&t.as_str()) || *t == kafka.changelog_topic {
                err(
                    &at,
                    format!(
                        "`{t}` is a topic loopwarden writes (findings, dead letters or changelog)"
                    ),
                );
            } else if Some(t.as_str()) == own_spans_topic {
                err(
                    &at,
                    format!(
                        "`{t}` is where loopwarden publishes its own spans (telemetry.spans_topic)"
                    ),
                );
            }
        }
        let encoding = match raw.encoding.as_deref().unwrap_or("otlp_proto") {
            "otlp_proto" => Encoding::OtlpProto,
            "otlp_json" => Encoding::OtlpJson,
            other => {
                err(
                    "encoding",
                    format!("`{other}` is not an encoding: otlp_proto or otlp_json"),
                );
                Encoding::OtlpProto
            }
        };
        let to_topic = match raw.to_topic.filter(|t| !t.is_empty()) {
            Some(t) => {
                if !kafka.input_topics.contains(&t) {
                    err(
                        "to_topic",
                        format!("`{t}` is not one of kafka.input_topics ({}): nothing would read the events", kafka.input_topics.join(", ")),
                    );
                }
                t
            }
            None => kafka.input_topics.first().cloned().unwrap_or_default(),
        };
        let group_id = raw
            .group_id
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| format!("{}-otlp", kafka.group_id));
        if group_id == kafka.group_id {
            err(
                "group_id",
                "must differ from kafka.group_id (the ingest is a consumer group of its own)"
                    .into(),
            );
        }
        if topics.is_empty() {
            return None;
        }
        Some(OtlpIngest {
            topics,
            encoding,
            to_topic,
            group_id,
        })
    }

    /// The section as the effective configuration prints it (`session_attribute`: the
    /// configuration's [`session_attribute`], which serves the bus ingest and files).
    pub fn to_toml(ingest: Option<&OtlpIngest>, session_attribute: Option<&str>) -> toml::Table {
        use toml::Value as V;
        let mut otlp = toml::Table::new();
        let s = |v: &str| V::String(v.to_string());
        match ingest {
            Some(i) => {
                otlp.insert(
                    "topics".into(),
                    V::Array(i.topics.iter().map(|t| s(t)).collect()),
                );
                otlp.insert("encoding".into(), s(i.encoding.name()));
                otlp.insert("to_topic".into(), s(&i.to_topic));
                otlp.insert(
                    "session_attribute".into(),
                    s(session_attribute.unwrap_or("")),
                );
                otlp.insert("group_id".into(), s(&i.group_id));
            }
            None => {
                otlp.insert("topics".into(), V::Array(Vec::new()));
                if let Some(a) = session_attribute {
                    otlp.insert("session_attribute".into(), s(a));
                }
            }
        }
        let mut ingest_table = toml::Table::new();
        ingest_table.insert("otlp".into(), V::Table(otlp));
        ingest_table
    }
}

/// `ingest.otlp.session_attribute`, which the mapping of OTLP JSON files by `replay` and
/// `backtest` follows too, whether or not the bus ingest is on.
pub fn session_attribute(raw: &RawIngest) -> Option<String> {
    raw.otlp
        .as_ref()
        .and_then(|o| o.session_attribute.clone())
        .filter(|s| !s.is_empty())
}

/// Whether the first bytes of an input are OTLP JSON (a trace export per line, as the
/// Collector's file exporter writes) rather than loopwarden events: the first line's
/// object starts with `resourceSpans`.
pub fn looks_like_otlp_json(head: &[u8]) -> bool {
    // The first line that is not blank: blank lines are passed over everywhere else.
    let Some(line) = head
        .split(|b| *b == b'\n')
        .find(|l| !l.trim_ascii().is_empty())
    else {
        return false;
    };
    let t = without_byte_order_mark(line.trim_ascii_start()).trim_ascii_start();
    t.starts_with(b"{") && t[1..].trim_ascii_start().starts_with(b"\"resourceSpans\"")
}

/// OTLP JSON lines read as event lines: each trace export becomes the JSON lines of its
/// events (in the order its spans ended), so `replay` and `backtest` run on traces as
/// they run on events. A line that is not a trace export is reported to `errors` with
/// its line number and skipped.
pub struct OtlpJsonLines<R> {
    input: R,
    mapper: Mapper,
    errors: Box<dyn Write + Send>,
    line: Vec<u8>,
    line_number: u64,
    mapped: Vec<MappedEvent>,
    /// Event lines ready, and how much of them was read.
    out: Vec<u8>,
    read: usize,
    pub report: MapReport,
    pub bad_lines: u64,
    done: bool,
}

impl<R: BufRead> OtlpJsonLines<R> {
    pub fn new(input: R, mapper: Mapper, errors: Box<dyn Write + Send>) -> OtlpJsonLines<R> {
        OtlpJsonLines {
            input,
            mapper,
            errors,
            line: Vec::new(),
            line_number: 0,
            mapped: Vec::new(),
            out: Vec::new(),
            read: 0,
            report: MapReport::default(),
            bad_lines: 0,
            done: false,
        }
    }

    /// Maps input lines until some event text is ready or the input ends.
    fn refill(&mut self) -> std::io::Result<()> {
        if self.read == self.out.len() {
            self.out.clear();
            self.read = 0;
        }
        while self.out.is_empty() {
            self.line.clear();
            if self.done || self.input.read_until(b'\n', &mut self.line)? == 0 {
                if !self.done {
                    self.done = true;
                    writeln!(self.errors, "{}", self.summary())?;
                }
                return Ok(());
            }
            self.line_number += 1;
            let text = self.line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match decode(text, Encoding::OtlpJson) {
                Ok(request) => {
                    self.mapped.clear();
                    let report = self.mapper.map(&request, &mut self.mapped);
                    self.report.add(&report);
                    for e in &self.mapped {
                        self.out.extend_from_slice(&e.json);
                        self.out.push(b'\n');
                    }
                }
                Err(e) => {
                    self.bad_lines += 1;
                    writeln!(
                        self.errors,
                        "otlp line {}: {e} ({})",
                        self.line_number,
                        e.reason()
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl<R> OtlpJsonLines<R> {
    /// One line saying what the trace exports gave.
    pub fn summary(&self) -> String {
        let r = &self.report;
        let skipped: Vec<String> = r
            .skipped
            .iter()
            .map(|(why, n)| format!("{n} {}", why.name()))
            .collect();
        let mut line = format!(
            "otlp: {} lines ({} bad), {} spans: {} llm calls, {} tool calls, {} agents ({} runs ended); no event from {}",
            self.line_number,
            self.bad_lines,
            r.spans,
            r.llm_calls,
            r.tool_calls,
            r.agents,
            r.completions,
            if skipped.is_empty() { "no span".to_string() } else { skipped.join(", ") }
        );
        // What capture missed, and what turns it on (once per service and scope).
        for u in &r.uncaptured {
            line.push_str(&format!(
                "\notlp: {} steps of service `{}` (scope `{}`) without {}: {}",
                u.spans,
                u.service,
                u.scope,
                u.missing.name(),
                u.setting()
            ));
        }
        line
    }
}

impl<R: BufRead> Read for OtlpJsonLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.refill()?;
        let ready = &self.out[self.read..];
        let n = buf.len().min(ready.len());
        buf[..n].copy_from_slice(&ready[..n]);
        self.read += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::config::Config;

    fn config(toml: &str) -> Result<Config, Vec<String>> {
        Config::from_toml_str(toml, "t", std::iter::empty())
            .map_err(|e| e.key_errors().iter().map(|k| k.to_string()).collect())
    }

    #[test]
    fn keys_are_checked_with_the_ingest_off_and_the_session_attribute_serves_files() {
        let err = config("[ingest.otlp]\nencoding = \"protobuf\"\nto_topic = \"nope\"\n")
            .unwrap_err()
            .join("\n");
        assert!(err.contains("ingest.otlp.encoding"), "{err}");
        assert!(err.contains("ingest.otlp.to_topic"), "{err}");
        let c = config("[ingest.otlp]\nsession_attribute = \"app.session\"\n").unwrap();
        assert_eq!(c.ingest, None);
        assert_eq!(c.otlp_session_attribute.as_deref(), Some("app.session"));
        let again = config(&c.effective_toml()).unwrap();
        assert_eq!(again.otlp_session_attribute.as_deref(), Some("app.session"));
    }

    #[test]
    fn off_unless_topics_are_named_and_defaults_follow_the_kafka_section() {
        assert_eq!(config("").unwrap().ingest, None);
        assert_eq!(config("[ingest.otlp]\ntopics = []\n").unwrap().ingest, None);
        let c = config("[kafka]\ngroup_id = \"lw\"\n[ingest.otlp]\ntopics = [\"agent-traces\"]\n")
            .unwrap();
        let i = c.ingest.clone().unwrap();
        assert_eq!(i.encoding, Encoding::OtlpProto);
        assert_eq!(i.to_topic, "cost.attributed");
        assert_eq!(i.group_id, "lw-otlp");
        assert_eq!(c.otlp_session_attribute, None);
        // The effective configuration reads back to the same settings.
        let again = config(&c.effective_toml()).unwrap();
        assert_eq!(again.ingest, Some(i));
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let errors = config(
            "[telemetry]\nspans_to_kafka = true\n[ingest.otlp]\ntopics = [\"tool.called\", \"otlp_spans\", \"a b\"]\nencoding = \"zipkin\"\nto_topic = \"elsewhere\"\ngroup_id = \"loopwarden\"\nextra = 1\n",
        )
        .unwrap_err();
        // The unknown key fails the section's parse (deny_unknown_fields) on its own.
        assert!(
            errors.iter().any(|e| e.contains("unknown field `extra`")),
            "{errors:?}"
        );
        let errors = config(
            "[telemetry]\nspans_to_kafka = true\n[ingest.otlp]\ntopics = [\"tool.called\", \"otlp_spans\", \"a b\", \"loopwarden.dlq\", \"t\", \"t\", \"loopwarden.state-changelog\"]\nencoding = \"zipkin\"\nto_topic = \"elsewhere\"\ngroup_id = \"loopwarden\"\n",
        )
        .unwrap_err();
        let has = |key: &str, words: &str| {
            errors
                .iter()
                .any(|e| e.starts_with(key) && e.contains(words))
        };
        for (key, words) in [
            ("ingest.otlp.topics[0]", "is an input topic"),
            ("ingest.otlp.topics[1]", "its own spans"),
            ("ingest.otlp.topics[2]", "not a valid topic name"),
            ("ingest.otlp.topics[3]", "loopwarden writes"),
            ("ingest.otlp.topics[5]", "listed twice"),
            ("ingest.otlp.topics[6]", "loopwarden writes"),
            ("ingest.otlp.encoding", "otlp_proto or otlp_json"),
            ("ingest.otlp.to_topic", "not one of kafka.input_topics"),
            ("ingest.otlp.group_id", "must differ"),
        ] {
            assert!(has(key, words), "{key}: {words}: {errors:?}");
        }
    }

    #[test]
    fn otlp_json_is_told_from_events_by_its_first_line() {
        assert!(looks_like_otlp_json(
            b"  { \"resourceSpans\": []}\n{\"type\":1}"
        ));
        assert!(!looks_like_otlp_json(
            b"{\"type\": \"tool.called\", \"resourceSpans\": 1}"
        ));
        assert!(!looks_like_otlp_json(b""));
        // A file a Windows tool wrote as "UTF-8" starts with a byte order mark.
        assert!(looks_like_otlp_json(b"\xEF\xBB\xBF{\"resourceSpans\": []}"));
    }

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn trace_lines_read_as_event_lines_and_bad_lines_are_reported() {
        let export = |span: &str, end: &str| {
            format!(
                r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"0707070707070707070707070707070{span}","spanId":"010101010101010{span}","startTimeUnixNano":"1","endTimeUnixNano":"{end}","attributes":[{{"key":"gen_ai.operation.name","value":{{"stringValue":"execute_tool"}}}},{{"key":"gen_ai.tool.name","value":{{"stringValue":"read"}}}},{{"key":"gen_ai.conversation.id","value":{{"stringValue":"s"}}}}]}}]}}]}}]}}"#
            )
        };
        // The first line after a byte order mark, as a Windows tool writes a file.
        let input = format!(
            "\u{feff}{}\nnot json\n\n{}\n",
            export("1", "2000000"),
            export("2", "3000000")
        );
        let errors = Shared::default();
        let lines = OtlpJsonLines::new(
            BufReader::new(input.as_bytes()),
            Mapper::default(),
            Box::new(errors.clone()),
        );
        let text = std::io::read_to_string(BufReader::new(lines)).unwrap();
        let events: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["event_id"], "0101010101010101");
        assert_eq!(events[1]["timestamp"], "1970-01-01T00:00:00.003Z");
        let said = String::from_utf8(errors.0.lock().unwrap().clone()).unwrap();
        assert!(
            said.contains("otlp line 2: not an OTLP JSON ExportTraceServiceRequest"),
            "{said}"
        );
        assert!(
            said.contains("otlp: 4 lines (1 bad), 2 spans: 0 llm calls, 2 tool calls"),
            "{said}"
        );
    }
}
