//! What `loopwarden run` shows of itself, against a real broker (Tansu): `/healthz`,
//! `/readyz` that flips only once partitions are assigned (and `loopwarden healthcheck`
//! agreeing), `/metrics` whose counts match what `replay` finds in the same events, in an
//! exposition `promtool` accepts, naming every metric the shipped Grafana dashboard
//! queries.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use loopwarden::config::Config;
use rdkafka::Message as _;

/// The address the HTTP endpoint logged, once it did.
fn http_address(run: &Running) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = run.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("serving /metrics")) {
            let addr = line
                .split("addr=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or_else(|| panic!("no addr= in {line}"));
            return addr.to_string();
        }
        assert!(Instant::now() < deadline, "no HTTP endpoint logged:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (status, body) of `GET http://addr/path`.
fn get(addr: &str, path: &str) -> (u16, String) {
    match ureq::get(&format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(5))
        .call()
    {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

/// The body of `GET http://addr/path` once it answers `status`, within `within`
/// (the test fails with `what` and the run's log otherwise).
fn await_status(
    run: &Running,
    addr: &str,
    path: &str,
    status: u16,
    within: Duration,
    what: &str,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (answered, body) = get(addr, path);
        if answered == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", run.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sample values of `name` keyed by their label set as written (`{a="x",b="y"}`).
fn samples(exposition: &str, name: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?;
            if !(labels.is_empty() || labels.starts_with('{')) {
                return None;
            }
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn total(exposition: &str, name: &str) -> f64 {
    samples(exposition, name).values().sum()
}

fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels
        .split(&format!("{key}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
}

/// What `replay` finds in the same events: findings (warnings and terminations), the
/// number of terminations, and of sessions that completed.
struct Replayed {
    findings: Vec<serde_json::Value>,
    terminations: usize,
    completed: usize,
    out: Vec<serde_json::Value>,
}

fn replayed(config: Arc<Config>, events: &[Vec<u8>]) -> Replayed {
    let out = replay(config, events);
    let findings: Vec<serde_json::Value> = out
        .iter()
        .filter(|v| v["type"] != "session.summary")
        .cloned()
        .collect();
    Replayed {
        terminations: findings
            .iter()
            .filter(|v| v["type"] == "session.terminated")
            .count(),
        completed: out
            .iter()
            .filter(|v| v["type"] == "session.summary" && v["closed_by"] == "completed")
            .count(),
        findings,
        out,
    }
}

/// A state store write that does not end makes `/healthz` fail once it has lasted
/// `state.write_stall_secs`, so that the orchestrator's liveness probe restarts the
/// instance; `/metrics` shows how long it has lasted, and `/healthz` is 200 again once
/// the write ends. (The write is held by a failpoint: sleeping 10 s in the store
/// writer's first write, against a bound of 1 s.)
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoint that holds a write: cargo test --features failpoints"
)]
fn healthz_fails_while_a_store_write_lasts_longer_than_its_bound() {
    let brokers = broker();
    let topics = Topics::named();
    create_topics(&brokers, &topics.layout(1));
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &brokers, &topics, "");
    let run = spawn_run_with_env(
        &cfg,
        &dir.path().join("run.log"),
        &[
            ("LOOPWARDEN_STATE__WRITE_STALL_SECS", "1"),
            ("FAILPOINTS", "store-write=1*sleep(10000)"),
        ],
    );
    let addr = http_address(&run);
    let secs = Duration::from_secs;
    await_status(&run, &addr, "/readyz", 200, secs(60), "never ready");
    assert_eq!(get(&addr, "/healthz").0, 200, "live before any write");
    let (events, _) = fleet(5, 0.0, 7);
    produce(&brokers, &topics.input, &events, &[]);

    let failed = "/healthz never failed while the write slept";
    let body = await_status(&run, &addr, "/healthz", 503, secs(30), failed);
    assert!(
        body.contains("state store write") && body.contains("state.write_stall_secs (1 s)"),
        "{body}"
    );
    let in_progress = || {
        let metrics = get(&addr, "/metrics").1;
        total(&metrics, "loopwarden_store_write_in_progress_seconds")
    };
    let lasted = in_progress();
    assert!(lasted >= 1.0, "the write in progress, s: {lasted}");
    assert_eq!(healthcheck(&format!("http://{addr}/healthz")), Some(1));

    let still = "/healthz still failing after the write ended";
    await_status(&run, &addr, "/healthz", 200, secs(30), still);
    assert_eq!(in_progress(), 0.0, "no write stuck any more");
    assert!(
        run.log_text().contains("state store write stuck"),
        "{}",
        run.log_text()
    );
}

#[test]
fn metrics_count_what_replay_finds_and_readyz_waits_for_the_assignment() {
    let brokers = broker();
    // The topics do not exist yet: the process is alive but cannot be assigned anything.
    let topics = Topics::named();
    let dir = tempfile::tempdir().unwrap();
    // One detector in shadow mode, so its (unpublished) findings show in the metrics.
    let cfg = write_config(
        dir.path(),
        &brokers,
        &topics,
        "[detectors.low_novelty]\nmode = \"shadow\"\n",
    );
    let config = Arc::new(Config::load(&cfg, std::iter::empty()).unwrap());
    let run = spawn_run(&cfg, &dir.path().join("run.log"));
    let addr = http_address(&run);
    assert_eq!(get(&addr, "/healthz").0, 200);
    assert_eq!(healthcheck(&format!("http://{addr}/healthz")), Some(0));
    for _ in 0..3 {
        let (status, body) = get(&addr, "/readyz");
        assert_eq!(status, 503, "ready before any assignment: {body}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(healthcheck(&format!("http://{addr}/readyz")), Some(1));

    create_topics(&brokers, &topics.layout(2));
    let (mut events, _) = fleet(80, 0.4, 71);
    let mut input = events.clone();
    input.push(b"{not json".to_vec());
    produce(&brokers, &topics.input, &input, &[]);
    // Two events not keyed by their session: one without a key, one keyed otherwise.
    let producer = producer(&brokers);
    for (session, key) in [("unkeyed", None), ("miskeyed", Some("another-session"))] {
        let event = format!(r#"{{"type": "session.started", "session_id": "{session}"}}"#);
        let mut record = rdkafka::producer::BaseRecord::<str, str>::to(&topics.input)
            .payload(&event)
            .partition(0);
        if let Some(key) = key {
            record = record.key(key);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
        events.push(event.into_bytes());
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    await_status(
        &run,
        &addr,
        "/readyz",
        200,
        Duration::from_secs(60),
        "never ready",
    );
    assert_eq!(healthcheck(&format!("http://{addr}/readyz")), Some(0));

    // Replay's view of the same events.
    let Replayed {
        findings,
        completed,
        out,
        ..
    } = replayed(config, &events);
    let findings_list = findings;
    let findings = findings_list.len();
    let mut stop_reasons: BTreeMap<String, f64> = BTreeMap::new();
    for v in out.iter().filter(|v| v["type"] == "session.terminated") {
        *stop_reasons
            .entry(v["stop_reason"].as_str().unwrap().to_string())
            .or_default() += 1.0;
    }
    let mut by_type: BTreeMap<String, f64> = BTreeMap::new();
    for e in &events {
        let v: serde_json::Value = serde_json::from_slice(e).unwrap();
        *by_type
            .entry(v["type"].as_str().unwrap().to_string())
            .or_default() += 1.0;
    }
    let _ = read_at_least(&brokers, &topics.summary, completed);
    // Every event applied and every batch finished before the scrape. A message's latency
    // is recorded when its batch is stored, which (at least once) is at the end of the
    // batch after it: wait for that too, not only for the events' counters.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (status, body) = get(&addr, "/metrics");
        assert_eq!(status, 200);
        if total(&body, "loopwarden_events_consumed_total") >= events.len() as f64
            && total(&body, "loopwarden_sessions_closed_total") >= completed as f64
            && total(&body, "loopwarden_processing_latency_seconds_count")
                >= events.len() as f64 + 1.0
            && total(&body, "loopwarden_bad_events_total") >= 1.0
            || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    let consumed: BTreeMap<String, f64> = samples(&metrics, "loopwarden_events_consumed_total")
        .into_iter()
        .map(|(l, v)| (label(&l, "type").to_string(), v))
        .collect();
    assert_eq!(consumed, by_type, "events consumed by type");
    assert_eq!(
        samples(&metrics, "loopwarden_bad_events_total"),
        BTreeMap::from([("{reason=\"invalid_json\"}".to_string(), 1.0)])
    );
    assert_eq!(
        samples(&metrics, "loopwarden_events_miskeyed_total"),
        BTreeMap::from([
            ("{key=\"missing\"}".to_string(), 1.0),
            ("{key=\"other\"}".to_string(), 1.0)
        ])
    );
    assert!(
        run.log_text()
            .contains("input message not keyed by its session_id"),
        "{}",
        run.log_text()
    );
    let terminations: BTreeMap<String, f64> = samples(&metrics, "loopwarden_terminations_total")
        .into_iter()
        .map(|(l, v)| (label(&l, "stop_reason").to_string(), v))
        .collect();
    assert_eq!(terminations, stop_reasons, "terminations by stop reason");
    assert_eq!(
        total(&metrics, "loopwarden_findings_total"),
        findings as f64,
        "findings"
    );
    let completed_metric: f64 = samples(&metrics, "loopwarden_sessions_closed_total")
        .iter()
        .filter(|(l, _)| label(l, "closed_by") == "completed")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(completed_metric, completed as f64, "sessions completed");
    assert_eq!(total(&metrics, "loopwarden_partitions_assigned"), 2.0);
    assert!(total(&metrics, "loopwarden_batches_total") >= 1.0);
    // Each stage of an at_least_once batch is timed; `close` (the batch's end on the
    // thread that polls) once for every batch ended, stored or not yet. Read from a
    // scrape after the one the batches were counted in: a scrape reads its metrics one
    // after another, and a batch is closed before it is counted.
    let stages: BTreeMap<String, f64> = samples(
        &get(&addr, "/metrics").1,
        "loopwarden_batch_stage_seconds_count",
    )
    .into_iter()
    .map(|(l, v)| (label(&l, "stage").to_string(), v))
    .collect();
    for stage in ["wait", "apply", "close", "deliver", "store", "commit"] {
        assert!(
            stages.get(stage).is_some_and(|&n| n >= 1.0),
            "stage {stage} timed: {stages:?}"
        );
    }
    assert!(
        stages["close"] >= total(&metrics, "loopwarden_batches_total"),
        "every finished batch closed: {stages:?}"
    );
    // At most one state per event (a batch writes a session it changed once), and some:
    // the sessions still open at a batch's end are written.
    let written = total(&metrics, "loopwarden_states_written_total");
    assert!(
        written >= 1.0 && written <= events.len() as f64,
        "states written: {written} for {} events",
        events.len()
    );
    // Their bytes as stored: a state is tens of bytes at least (its clocks, counters and
    // rings' lengths) and at most a few KiB (DESIGN §4 bounds it).
    let bytes = total(&metrics, "loopwarden_states_written_bytes_total");
    assert!(
        bytes >= 20.0 * written && bytes <= 4096.0 * written,
        "states written: {written}, their bytes: {bytes}"
    );
    // The store wrote records of them (whole or as deltas) and the batches' offsets: some
    // bytes, and, with no session long enough to fold, no more than the states' whole
    // bytes and a record's framing and an offset or two per state.
    let stored = total(&metrics, "loopwarden_state_store_written_bytes_total");
    assert!(
        stored >= 1.0 && stored <= bytes + 128.0 * written,
        "states' bytes: {bytes}, the store wrote: {stored}"
    );
    assert_eq!(
        total(&metrics, "loopwarden_processing_latency_seconds_count"),
        events.len() as f64 + 1.0,
        "every polled message timed"
    );
    // Caught up and idle: the lag gauge says so at once (refreshed while the input is
    // idle, not only when a batch ends).
    let deadline = Instant::now() + Duration::from_secs(5);
    let lag = loop {
        let lag = samples(
            &get(&addr, "/metrics").1,
            "loopwarden_consumer_lag_messages",
        );
        if lag.values().all(|&v| v == 0.0) || Instant::now() > deadline {
            break lag;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !lag.is_empty() && lag.values().all(|&v| v == 0.0),
        "consumer lag of a caught-up, idle consumer: {lag:?}"
    );
    assert!(total(&metrics, "loopwarden_state_store_bytes") > 0.0);
    assert!(!metrics.contains("session_id"), "no session ids in labels");

    // Findings by owner: the same findings, per (tenant, agent) as replay attributes them.
    let mut by_owner: BTreeMap<(String, String), f64> = BTreeMap::new();
    for f in &findings_list {
        let owner = |key: &str| f[key].as_str().unwrap_or("(none)").to_string();
        *by_owner
            .entry((owner("tenant"), owner("agent_id")))
            .or_default() += 1.0;
    }
    let mut by_owner_metric: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (l, v) in samples(&metrics, "loopwarden_findings_by_owner_total") {
        *by_owner_metric
            .entry((
                label(&l, "tenant").to_string(),
                label(&l, "agent").to_string(),
            ))
            .or_default() += v;
    }
    assert!(by_owner.len() > 1, "the fleet has several owners");
    assert_eq!(by_owner_metric, by_owner, "findings by owner");
    assert!(
        total(&metrics, "loopwarden_shadow_findings_total") > 0.0,
        "the shadow detector's findings are counted"
    );

    dashboard_queries_only_exported_metrics(&metrics);

    promtool_accepts(&metrics, dir.path());
    run.stop_gracefully();
}

/// The exit code of `loopwarden healthcheck --url <url>`.
fn healthcheck(url: &str) -> Option<i32> {
    std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["healthcheck", "--url", url])
        .output()
        .unwrap()
        .status
        .code()
}

/// Every `loopwarden_*` series the Grafana dashboard (shipped in the Helm chart and
/// mounted by docker-compose) queries is one this process exports.
fn dashboard_queries_only_exported_metrics(exposition: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard's queries: {exprs:?}");
    let exported: std::collections::BTreeSet<&str> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let named = regex::Regex::new(r"\bloopwarden_[a-z_]+").unwrap();
    let mut queried = std::collections::BTreeSet::new();
    for expr in &exprs {
        for m in named.find_iter(expr) {
            queried.insert(m.as_str().to_string());
        }
    }
    assert!(
        queried.len() >= 8,
        "metrics the dashboard queries: {queried:?}"
    );
    let missing: Vec<&String> = queried
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not have: {missing:?}"
    );
}

const DASHBOARD: &str = "helm/loopwarden/dashboards/loopwarden.json";

/// Every `expr` of every panel target, at any depth.
fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Stops `run` with SIGTERM (which flushes the span queue) and returns every span the
/// receiver got.
fn stop_and_collect(
    run: Running,
    receiver: &otlp::Receiver,
) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    run.stop_gracefully();
    let spans = receiver.spans.lock().unwrap().clone();
    spans
}

/// `promtool check metrics` (Prometheus's own linter) on an exposition.
fn promtool_accepts(exposition: &str, dir: &Path) {
    let file = dir.join("metrics.txt");
    std::fs::write(&file, exposition).unwrap();
    // The pinned promtool, installed on first use (scripts/promtool): nothing to set up.
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/promtool"))
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap_or_else(|e| panic!("scripts/promtool: {e}"));
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

mod otlp {
    //! An OTLP/gRPC receiver (the collector's protocol, via opentelemetry-proto's tonic
    //! service) that keeps every span it is sent.
    use std::sync::{Arc, Mutex};

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::trace::v1::Span;

    #[derive(Clone, Default)]
    pub struct Receiver {
        pub spans: Arc<Mutex<Vec<Span>>>,
        pub service_names: Arc<Mutex<Vec<String>>>,
    }

    #[tonic::async_trait]
    impl TraceService for Receiver {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            for rs in request.into_inner().resource_spans {
                for kv in rs.resource.iter().flat_map(|r| &r.attributes) {
                    if kv.key == "service.name" {
                        self.service_names
                            .lock()
                            .unwrap()
                            .push(format!("{:?}", kv.value));
                    }
                }
                for ss in rs.scope_spans {
                    self.spans.lock().unwrap().extend(ss.spans);
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// Starts the receiver on a free port of 127.0.0.1 (its own thread and runtime).
    pub fn start() -> (String, Receiver) {
        let receiver = Receiver::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let service = receiver.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(service))
                        .serve_with_incoming(
                            tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(
                                listener,
                            ),
                        )
                        .await
                        .unwrap();
                });
        });
        (format!("http://{addr}"), receiver)
    }

    /// An OTLP/HTTP (protobuf) receiver on a free port: `POST /v1/traces`.
    pub fn start_http() -> (String, Receiver) {
        use axum::body::Bytes;
        use prost::Message as _;
        let receiver = Receiver::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = receiver.spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let spans = spans.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    for rs in request.resource_spans {
                        for ss in rs.scope_spans {
                            spans.lock().unwrap().extend(ss.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    axum::serve(listener, app).await.unwrap();
                });
        });
        (format!("http://{addr}"), receiver)
    }

    pub fn attr(span: &Span, key: &str) -> Option<String> {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                Value::BoolValue(b) => b.to_string(),
                other => format!("{other:?}"),
            })
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Spans of a scenario run reach an OTLP/gRPC receiver: one per finding and one per
/// closed session, with GenAI and loopwarden attributes, parented on the `traceparent`
/// the input messages carried; the output messages carry their span's `traceparent`.
#[test]
fn spans_reach_an_otlp_collector_inside_the_agents_trace() {
    let (endpoint, receiver) = otlp::start();
    let Fixture {
        brokers,
        topics,
        dir,
        cfg,
    } = fixture(2, "");
    let config = Arc::new(Config::load(&cfg, std::iter::empty()).unwrap());
    let spans_topic = format!("{}.spans", topics.input);
    create_topics(&brokers, &[(&spans_topic, 1)]);
    let (events, _) = fleet(60, 0.5, 81);
    let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01");
    produce(
        &brokers,
        &topics.input,
        &events,
        &[("traceparent", &traceparent)],
    );
    let run = spawn_run_with_env(
        &cfg,
        &dir.path().join("run.log"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("LOOPWARDEN_TELEMETRY__SPANS_TO_KAFKA", "true"),
            ("LOOPWARDEN_TELEMETRY__SPANS_TOPIC", &spans_topic),
        ],
    );
    let Replayed {
        findings,
        terminations,
        completed,
        ..
    } = replayed(config, &events);
    let terminated = read_at_least(&brokers, &topics.terminated, terminations);
    let _ = read_at_least(&brokers, &topics.summary, completed);
    let spans = stop_and_collect(run, &receiver);
    let finding_spans: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "loopwarden.finding")
        .collect();
    let session_spans: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "loopwarden.session")
        .collect();
    assert_eq!(finding_spans.len(), findings.len(), "one span per finding");
    assert!(
        session_spans
            .iter()
            .filter(|s| otlp::attr(s, "loopwarden.closed_by").as_deref() == Some("completed"))
            .count()
            == completed,
        "one span per completed session"
    );
    let service_names = receiver.service_names.lock().unwrap().clone();
    assert!(
        !service_names.is_empty() && service_names.iter().all(|n| n.contains("loopwarden")),
        "service.name is loopwarden: {service_names:?}"
    );
    for s in finding_spans.iter().chain(session_spans.iter()) {
        assert_eq!(hex(&s.trace_id), TRACE_ID, "in the agent's trace");
        assert_eq!(
            hex(&s.parent_span_id),
            PARENT_SPAN_ID,
            "child of the input's span"
        );
        assert!(otlp::attr(s, "gen_ai.conversation.id").is_some());
    }
    let mut by_event: BTreeMap<String, &opentelemetry_proto::tonic::trace::v1::Span> =
        BTreeMap::new();
    for s in &finding_spans {
        let level = otlp::attr(s, "loopwarden.level").unwrap();
        let is_error = s.status.as_ref().map(|st| st.code) == Some(2);
        assert_eq!(is_error, level == "terminate", "status error iff terminate");
        assert!(otlp::attr(s, "loopwarden.detector").is_some());
        by_event.insert(otlp::attr(s, "loopwarden.event_id").unwrap(), s);
    }
    for f in &findings {
        let s = by_event
            .get(f["event_id"].as_str().unwrap())
            .unwrap_or_else(|| panic!("no span for finding {}", f["event_id"]));
        assert_eq!(
            otlp::attr(s, "gen_ai.conversation.id").as_deref(),
            f["session_id"].as_str()
        );
        assert_eq!(
            otlp::attr(s, "loopwarden.detector").as_deref(),
            f["detector"].as_str()
        );
    }
    // The same spans on the bus, as OTLP protobuf export requests.
    let on_bus: Vec<opentelemetry_proto::tonic::trace::v1::Span> = read_topic(
        &brokers,
        &spans_topic,
        1,
        Duration::from_secs(10),
        Duration::from_secs(1),
    )
    .iter()
    .flat_map(|m| {
        use prost::Message as _;
        let request =
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
                m.payload().unwrap(),
            )
            .expect("an ExportTraceServiceRequest");
        request
            .resource_spans
            .into_iter()
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
    })
    .collect();
    let mut via_grpc = spans.clone();
    let mut via_kafka = on_bus;
    via_grpc.sort_by(|a, b| a.span_id.cmp(&b.span_id));
    via_kafka.sort_by(|a, b| a.span_id.cmp(&b.span_id));
    assert_eq!(via_kafka, via_grpc, "the topic carries the same spans");

    // The termination messages carry their span's context.
    for m in &terminated {
        let tp = header(m, "traceparent").expect("traceparent on the output");
        let id = json(m)["event_id"].as_str().unwrap().to_string();
        let span = by_event[&id];
        assert_eq!(
            tp,
            format!("00-{TRACE_ID}-{}-01", hex(&span.span_id)),
            "the header names the finding's span"
        );
    }
}

/// A collector that cannot be reached costs spans (counted), not events: the findings
/// on the bus are replay's.
#[test]
fn an_unreachable_collector_changes_nothing_on_the_bus() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Fixture {
        brokers,
        topics,
        dir,
        cfg,
    } = fixture(2, "");
    let config = Arc::new(Config::load(&cfg, std::iter::empty()).unwrap());
    let (events, _) = fleet(60, 0.5, 82);
    produce(&brokers, &topics.input, &events, &[]);
    let run = spawn_run_with_env(
        &cfg,
        &dir.path().join("run.log"),
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://127.0.0.1:{closed}"),
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        ],
    );
    let addr = http_address(&run);
    let out = replay(config, &events);
    let want: std::collections::BTreeSet<String> = out
        .iter()
        .filter(|v| v["type"] == "session.terminated")
        .map(finding_key)
        .collect();
    let terminated = read_at_least(&brokers, &topics.terminated, want.len());
    let got: std::collections::BTreeSet<String> =
        terminated.iter().map(|m| finding_key(&json(m))).collect();
    assert_eq!(got, want, "terminations as replay's");
    let deadline = Instant::now() + Duration::from_secs(30);
    let dropped = loop {
        let dropped = total(&get(&addr, "/metrics").1, "loopwarden_spans_dropped_total");
        if dropped > 0.0 || Instant::now() > deadline {
            break dropped;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(dropped > 0.0, "dropped spans are counted");
    run.stop_gracefully();
}

/// The same spans over OTLP/HTTP with protobuf bodies (`OTEL_EXPORTER_OTLP_PROTOCOL=
/// http/protobuf`; the exporter appends `/v1/traces` to the endpoint).
#[test]
fn spans_also_go_over_otlp_http_protobuf() {
    let (endpoint, receiver) = otlp::start_http();
    let Fixture {
        brokers,
        topics,
        dir,
        cfg,
    } = fixture(1, "");
    let config = Arc::new(Config::load(&cfg, std::iter::empty()).unwrap());
    let (events, _) = fleet(30, 0.5, 83);
    produce(&brokers, &topics.input, &events, &[]);
    let run = spawn_run_with_env(
        &cfg,
        &dir.path().join("run.log"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    );
    let Replayed {
        findings,
        terminations,
        ..
    } = replayed(config, &events);
    let _ = read_at_least(&brokers, &topics.terminated, terminations);
    let spans = stop_and_collect(run, &receiver);
    let got: std::collections::BTreeSet<String> = spans
        .iter()
        .filter(|s| s.name == "loopwarden.finding")
        .filter_map(|s| otlp::attr(s, "loopwarden.event_id"))
        .collect();
    let want: std::collections::BTreeSet<String> = findings
        .iter()
        .map(|f| f["event_id"].as_str().unwrap().to_string())
        .collect();
    assert!(!want.is_empty());
    assert_eq!(got, want, "a span per finding, over HTTP");
}
