//! OpenTelemetry spans of findings and closed sessions (DESIGN §5), exported over OTLP.
//!
//! Span model: one span per published finding (`loopwarden.finding`, at the triggering
//! event's time, status error when it terminates the session) and one per closed session
//! (`loopwarden.session`, from its first to its last event, status error when it was
//! terminated, its findings per detector and level as span events). Attributes follow the
//! OpenTelemetry GenAI conventions where they exist (`gen_ai.conversation.id`,
//! `gen_ai.agent.id`, `gen_ai.usage.*`) and `loopwarden.*` otherwise. The W3C
//! `traceparent` of the triggering Kafka message is the parent, so a finding shows
//! inside the agent's own trace.
//!
//! Spans go over OTLP (gRPC or HTTP/protobuf) and, optionally, onto a Kafka topic as
//! OTLP protobuf `ExportTraceServiceRequest` messages ("spans back to the bus").
//!
//! Guarantees: spans are handed to bounded batch queues and exported on the SDK's own
//! threads; the pipeline never waits on a collector. A failed export counts its spans in
//! `loopwarden_spans_dropped_total`; nothing about spans can fail or stall a batch.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};

use crate::bus::kafka::settings::KafkaSettings;
use crate::config::TelemetrySettings;
use crate::contract::event::parse_rfc3339_ms;
use crate::contract::output::{FindingEvent, SummaryEvent};
use crate::engine::levels::Level;

/// The W3C trace-context header, read from input messages and written on outputs.
pub const TRACEPARENT: &str = "traceparent";

/// Why span export could not be set up (fatal at start: a misconfigured exporter should
/// not go unnoticed).
#[derive(Debug, thiserror::Error)]
pub enum SpanError {
    #[error("unknown OTLP protocol `{0}` (telemetry.otlp_protocol or OTEL_EXPORTER_OTLP_PROTOCOL): grpc or http/protobuf")]
    Protocol(String),
    #[error("cannot build the OTLP span exporter: {0}")]
    Exporter(String),
    #[error("cannot start the span exporter's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("OTLP endpoint {}", not_plain_http(.0))]
    Tls(String),
}

/// Whether spans can be exported to `endpoint`: an `http://` URL (any case), as neither
/// OTLP client of this build speaks TLS.
pub fn plain_http_endpoint(endpoint: &str) -> bool {
    endpoint
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

/// What is wrong with an `endpoint` that [`plain_http_endpoint`] refuses.
pub fn not_plain_http(endpoint: &str) -> String {
    format!("`{endpoint}` is not an http:// URL: spans go over plain http (the build has no TLS client), to a collector that forwards with TLS (a sidecar, the node's agent)")
}

/// Whether the standard variables (read through `var`) turn span export off:
/// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
pub fn export_disabled(var: impl Fn(&str) -> Option<String>) -> bool {
    var("OTEL_SDK_DISABLED").as_deref() == Some("true")
        || var("OTEL_TRACES_EXPORTER").as_deref() == Some("none")
}

/// The environment's OTLP endpoint when `telemetry.otlp_endpoint` is unset, and the
/// variable that named it: the first of `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` and
/// `OTEL_EXPORTER_OTLP_ENDPOINT` that `var` gives (not empty).
pub fn env_otlp_endpoint(var: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    crate::config::OTEL_ENDPOINT_ENV
        .iter()
        .find_map(|name| var(name).map(|e| (*name, e)))
}

/// Counts the spans of failed exports.
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    dropped: IntCounter,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.inner.export(batch).await;
        if result.is_err() {
            self.dropped.inc_by(n);
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Produces spans onto a Kafka topic as OTLP protobuf `ExportTraceServiceRequest`s, the
/// format an OpenTelemetry Collector's Kafka receiver reads (encoding `otlp_proto`).
struct KafkaSpans {
    producer: BaseProducer,
    topic: String,
    resource: ResourceAttributesWithSchema,
    dropped: IntCounter,
}

impl std::fmt::Debug for KafkaSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSpans")
            .field("topic", &self.topic)
            .finish()
    }
}

impl SpanExporter for KafkaSpans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        use prost::Message as _;
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let payload = request.encode_to_vec();
        let record: BaseRecord<'_, (), [u8]> = BaseRecord::to(&self.topic).payload(&payload);
        // Runs on the span processor's thread: waiting here never holds up the pipeline.
        let sent = self
            .producer
            .send(record)
            .map_err(|(e, _)| e)
            .and_then(|()| self.producer.flush(Duration::from_secs(10)));
        sent.map_err(|e| {
            self.dropped.inc_by(n);
            opentelemetry_sdk::error::OTelSdkError::InternalFailure(format!(
                "producing spans to {}: {e}",
                self.topic
            ))
        })
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = ResourceAttributesWithSchema::from(resource);
    }
}

/// The span side of telemetry: a tracer whose spans go to the OTLP exporter.
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    // gRPC (tonic) needs a Tokio reactor for its connection; the SDK exports from its
    // own thread, so the exporter is built inside this runtime, which must outlive it.
    _runtime: tokio::runtime::Runtime,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The OTLP exporter: its protocol from the file, else the standard variables, else
/// gRPC. An endpoint from the file is given to the builder; otherwise the builder reads
/// the OTEL_EXPORTER_OTLP_* variables itself (and for HTTP appends /v1/traces to the
/// generic endpoint, as the specification says).
fn otlp_exporter(
    settings: &TelemetrySettings,
    runtime: &tokio::runtime::Runtime,
) -> Result<(opentelemetry_otlp::SpanExporter, String), SpanError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let protocol = settings
        .otlp_protocol
        .clone()
        .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "grpc".to_string());
    let configured = settings.otlp_endpoint.as_deref();
    let _inside = runtime.enter();
    let exporter = match protocol.as_str() {
        "grpc" => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(e) = configured {
                b = b.with_endpoint(e);
            }
            b.build()
        }
        "http/protobuf" => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(e) = configured {
                b = b.with_endpoint(format!("{}/v1/traces", e.trim_end_matches('/')));
            }
            b.build()
        }
        other => return Err(SpanError::Protocol(other.to_string())),
    }
    .map_err(|e| SpanError::Exporter(e.to_string()))?;
    Ok((exporter, protocol))
}

impl Spans {
    /// Sets up span export: over OTLP when an endpoint is configured
    /// (`telemetry.otlp_endpoint`, or the standard `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`),
    /// onto `telemetry.spans_topic` when `telemetry.spans_to_kafka` is on. `None` when
    /// neither is, or when `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`.
    pub fn start(
        settings: &TelemetrySettings,
        kafka: &KafkaSettings,
        brokers: &str,
        dropped: IntCounter,
    ) -> Result<Option<Spans>, SpanError> {
        if export_disabled(env) {
            return Ok(None);
        }
        let endpoint =
            (settings.otlp_endpoint.clone()).or_else(|| env_otlp_endpoint(env).map(|(_, e)| e));
        if endpoint.is_none() && !settings.spans_to_kafka {
            return Ok(None);
        }
        // Refused at the start rather than every export failing unseen but in a counter
        // (the config refuses it too, when it was loaded with the environment as `run`'s
        // is; this holds for a config built without it).
        if let Some(e) = endpoint.as_deref().filter(|e| !plain_http_endpoint(e)) {
            return Err(SpanError::Tls(e.to_string()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lw-spans")
            .enable_all()
            .build()
            .map_err(SpanError::Runtime)?;
        let batch_config = || {
            BatchConfigBuilder::default()
                .with_max_queue_size(65_536)
                .with_scheduled_delay(Duration::from_millis(500))
                .build()
        };
        let mut resource = Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("loopwarden");
        }
        let mut provider = SdkTracerProvider::builder().with_resource(resource.build());
        if let Some(endpoint) = &endpoint {
            let (exporter, protocol) = otlp_exporter(settings, &runtime)?;
            provider = provider.with_span_processor(
                BatchSpanProcessor::builder(Counting {
                    inner: exporter,
                    dropped: dropped.clone(),
                })
                .with_batch_config(batch_config())
                .build(),
            );
            tracing::info!(endpoint = %endpoint, protocol = %protocol, "exporting spans over OTLP");
        }
        if settings.spans_to_kafka {
            let producer: BaseProducer = crate::bus::kafka::client_config(kafka, brokers)
                .set("linger.ms", "50")
                .set("compression.type", "lz4")
                .create()
                .map_err(|e| SpanError::Exporter(e.to_string()))?;
            provider = provider.with_span_processor(
                BatchSpanProcessor::builder(KafkaSpans {
                    producer,
                    topic: settings.spans_topic.clone(),
                    resource: ResourceAttributesWithSchema::default(),
                    dropped,
                })
                .with_batch_config(batch_config())
                .build(),
            );
            tracing::info!(topic = %settings.spans_topic, "producing spans to kafka (otlp_proto)");
        }
        let provider = provider.build();
        let tracer = provider.tracer("loopwarden");
        Ok(Some(Spans {
            provider,
            tracer,
            _runtime: runtime,
        }))
    }

    /// Records a finding's span under `parent` (a `traceparent` value); returns the
    /// span's own `traceparent`, for the finding's message headers.
    pub fn finding(&self, f: &FindingEvent, parent: Option<&TraceParent>) -> String {
        let at = time_of(&f.event_time);
        let mut attributes = common_attributes(
            &f.session_id,
            f.agent_id.as_deref(),
            f.tenant.as_deref(),
            f.run_id.as_deref(),
        );
        attributes.extend([
            KeyValue::new("loopwarden.event_id", f.event_id.clone()),
            KeyValue::new("loopwarden.detector", f.detector.name()),
            KeyValue::new("loopwarden.level", f.level.name()),
            KeyValue::new("loopwarden.mode", f.mode.name()),
            KeyValue::new("loopwarden.reason", f.reason.clone()),
            int("gen_ai.usage.input_tokens", f.stats.input_tokens),
            int("gen_ai.usage.output_tokens", f.stats.output_tokens),
        ]);
        if let Some(reason) = f.stop_reason {
            attributes.push(KeyValue::new("loopwarden.stop_reason", reason.name()));
        }
        let mut span = self
            .tracer
            .span_builder("loopwarden.finding")
            .with_kind(SpanKind::Internal)
            .with_start_time(at)
            .with_attributes(attributes)
            .start_with_context(
                &self.tracer,
                &parent_context(parent.map(TraceParent::as_str)),
            );
        if f.level == Level::Terminate {
            span.set_status(Status::error(f.reason.clone()));
        }
        let traceparent = traceparent_of(span.span_context());
        span.end_with_timestamp(at);
        traceparent
    }

    /// Records a closed session's span under `parent`; returns its `traceparent`.
    pub fn session(&self, s: &SummaryEvent, parent: Option<&TraceParent>) -> String {
        let (start, end) = (time_of(&s.started_at), time_of(&s.ended_at));
        let mut attributes = common_attributes(
            &s.session_id,
            s.agent_id.as_deref(),
            s.tenant.as_deref(),
            s.run_id.as_deref(),
        );
        attributes.extend([
            KeyValue::new("loopwarden.stop_reason", s.stop_reason.clone()),
            KeyValue::new("loopwarden.closed_by", s.closed_by.name()),
            int("loopwarden.turns", s.stats.turns),
            int("loopwarden.tool_calls", s.stats.tool_calls),
            int("gen_ai.usage.input_tokens", s.stats.input_tokens),
            int("gen_ai.usage.output_tokens", s.stats.output_tokens),
        ]);
        if let Some(cost) = s.stats.cost_usd {
            attributes.push(KeyValue::new("loopwarden.cost_usd", cost));
        }
        let mut span = self
            .tracer
            .span_builder("loopwarden.session")
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(
                &self.tracer,
                &parent_context(parent.map(TraceParent::as_str)),
            );
        for (detector, levels) in &s.findings {
            for (level, count) in levels {
                span.add_event_with_timestamp(
                    "loopwarden.finding",
                    end,
                    vec![
                        KeyValue::new("loopwarden.detector", detector.clone()),
                        KeyValue::new("loopwarden.level", level.clone()),
                        KeyValue::new("loopwarden.count", *count as i64),
                    ],
                );
            }
        }
        let terminated = !matches!(
            s.stop_reason.as_str(),
            "done" | "idle_timeout" | "end_of_input"
        );
        if terminated {
            span.set_status(Status::error(format!("terminated: {}", s.stop_reason)));
        }
        let traceparent = traceparent_of(span.span_context());
        span.end_with_timestamp(end);
        traceparent
    }

    /// Exports what is queued (bounded by the SDK's timeouts) and stops the exporter.
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "span exporter did not shut down cleanly");
        }
    }
}

fn common_attributes(
    session: &str,
    agent: Option<&str>,
    tenant: Option<&str>,
    run: Option<&str>,
) -> Vec<KeyValue> {
    let mut a = vec![KeyValue::new("gen_ai.conversation.id", session.to_string())];
    if let Some(agent) = agent {
        a.push(KeyValue::new("gen_ai.agent.id", agent.to_string()));
    }
    if let Some(tenant) = tenant {
        a.push(KeyValue::new("loopwarden.tenant", tenant.to_string()));
    }
    if let Some(run) = run {
        a.push(KeyValue::new("loopwarden.run_id", run.to_string()));
    }
    a
}

/// An OTLP integer attribute from a counter (saturating at i64::MAX).
fn int(key: &'static str, n: u64) -> KeyValue {
    KeyValue::new(key, n.min(i64::MAX as u64) as i64)
}

fn time_of(rfc3339: &str) -> SystemTime {
    parse_rfc3339_ms(rfc3339)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
        .unwrap_or_else(SystemTime::now)
}

/// The context a `traceparent` value names (a root context when absent or malformed).
/// Only its sampled flag is passed on: the SDK's propagator refuses version 00 with any
/// flag it does not know (the W3C's newer `random` bit, 02, with 01 included), where the
/// recommendation asks a receiver to ignore them; refused, our spans would start a trace
/// of their own instead of joining the agent's.
fn parent_context(traceparent: Option<&str>) -> Context {
    match traceparent {
        Some(tp) => {
            let mut tp = tp.to_string();
            if let Some(flags) = tp
                .len()
                .checked_sub(2)
                .and_then(|at| tp.get(at..))
                .and_then(|f| u8::from_str_radix(f, 16).ok())
            {
                let at = tp.len() - 2;
                tp.replace_range(at.., &format!("{:02x}", flags & 0x01));
            }
            let carrier = HashMap::from([(TRACEPARENT.to_string(), tp)]);
            TraceContextPropagator::new().extract(&carrier)
        }
        None => Context::new(),
    }
}

fn traceparent_of(cx: &opentelemetry::trace::SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}

/// A well-formed W3C `traceparent` value (version 00), kept inline: checking and carrying
/// it costs no allocation, as every input message may have one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent([u8; 55]);

impl TraceParent {
    /// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let v: [u8; 55] = value.trim_ascii().try_into().ok()?;
        let hex = |r: std::ops::Range<usize>| {
            v[r.clone()]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                && v[r].iter().any(|&b| b != b'0')
        };
        let ok = v.starts_with(b"00-")
            && v[35] == b'-'
            && v[52] == b'-'
            && hex(3..35)
            && hex(36..52)
            && v[53..]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
        ok.then_some(TraceParent(v))
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("checked ASCII in parse")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    #[test]
    fn an_https_endpoint_is_refused_at_the_start() {
        assert!(plain_http_endpoint("HTTP://collector:4317"));
        assert!(!plain_http_endpoint("https://collector:4317"));
        assert!(!plain_http_endpoint("collector:4317"));
        // A config loaded without the environment (as a test or a bench may build one),
        // its endpoint set afterwards, past the config's check.
        let mut config = crate::config::Config::from_toml_str("", "t", std::iter::empty()).unwrap();
        config.telemetry.otlp_endpoint = Some("HTTPS://collector.example:4317".into());
        let dropped = IntCounter::new("d", "d").unwrap();
        let started = Spans::start(&config.telemetry, &config.kafka, "127.0.0.1:1", dropped);
        match started {
            Err(e @ SpanError::Tls(_)) => assert!(e.to_string().contains("forwards with TLS")),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("an https endpoint was taken"),
        }
    }

    #[test]
    fn traceparents_are_checked() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(tp.as_bytes()).unwrap();
        assert_eq!(parsed.as_str(), tp);
        // The propagator reads what parse accepts, whatever the flags (03: sampled and the
        // W3C's newer random bit, which the SDK's propagator refuses as it comes).
        for flags in ["00", "01", "02", "03", "ff"] {
            let tp = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
            let parsed = TraceParent::parse(tp.as_bytes()).unwrap();
            let cx = parent_context(Some(parsed.as_str()));
            let span = cx.span();
            let read = span.span_context();
            assert!(read.is_valid(), "{tp}");
            assert_eq!(
                read.trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            assert_eq!(
                read.is_sampled(),
                flags == "01" || flags == "03" || flags == "ff"
            );
        }
        for bad in [
            "00-zz-00f067aa0ba902b7-01",
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0F",
        ] {
            assert!(TraceParent::parse(bad.as_bytes()).is_none(), "{bad}");
        }
    }
}
