//! Feeding a simulated fleet somewhere: to Kafka (keyed by session, routed by event type)
//! or to a JSON Lines writer, at a target rate, with the ground truth written alongside.
//! Used by `loopwarden simulate`, the demo and the pipeline benchmark.
//!
//! Guarantees: every event is either acknowledged by the broker or reported as an error
//! (the producer is idempotent and waits for its deliveries before returning); pacing
//! never runs ahead of the target rate.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::contract::event::wall_ms;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::shutdown::Shutdown;
use crate::tools::simulate::{Fleet, SimEvent, Truth};

/// Why feeding stopped.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("producing to {topic} failed: {source}")]
    Produce { topic: String, source: KafkaError },
    #[error("waiting for the broker to acknowledge the events failed: {0}")]
    Flush(KafkaError),
    #[error("{count} event(s) were not delivered (first error: {first})")]
    Undelivered { count: u64, first: String },
    #[error("writing events failed: {0}")]
    Write(#[from] std::io::Error),
}

/// Counts failed deliveries so that none goes unnoticed.
#[derive(Default)]
pub struct DeliveryCounter {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// The producer `feed` writes with.
pub type FeedProducer = BaseProducer<DeliveryCounter>;

/// Which topic each event type goes to.
#[derive(Debug, Clone)]
pub struct Routing {
    pub llm_calls: String,
    pub tool_calls: String,
    /// `session.started` / `session.completed`.
    pub lifecycle: String,
}

impl Routing {
    /// Routes by type onto the input topics: `cost.attributed` to the first topic named
    /// so (else the first topic), `tool.called` likewise, lifecycle with LLM calls.
    pub fn for_inputs(inputs: &[String]) -> Routing {
        let find = |name: &str| {
            inputs
                .iter()
                .find(|t| t.as_str() == name)
                .unwrap_or(&inputs[0])
                .clone()
        };
        let llm_calls = find("cost.attributed");
        Routing {
            tool_calls: find("tool.called"),
            lifecycle: llm_calls.clone(),
            llm_calls,
        }
    }

    /// Everything on one topic.
    pub fn single(topic: &str) -> Routing {
        Routing {
            llm_calls: topic.to_string(),
            tool_calls: topic.to_string(),
            lifecycle: topic.to_string(),
        }
    }

    pub fn topic_of(&self, e: &SimEvent) -> &str {
        match e.kind {
            "cost.attributed" => &self.llm_calls,
            "tool.called" => &self.tool_calls,
            _ => &self.lifecycle,
        }
    }
}

/// Paces a loop at `rate` per second (`0` = as fast as possible).
pub struct Pacer {
    rate: f64,
    start: Instant,
    sent: u64,
}

impl Pacer {
    pub fn new(rate: f64) -> Pacer {
        Pacer {
            rate,
            start: Instant::now(),
            sent: 0,
        }
    }

    /// Waits until the next item is due.
    pub fn wait(&mut self) {
        self.sent += 1;
        if self.rate <= 0.0 {
            return;
        }
        let due = self.start + Duration::from_secs_f64(self.sent as f64 / self.rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// Where the events go.
pub enum Target<'a> {
    Kafka {
        producer: &'a FeedProducer,
        routing: Routing,
    },
    Lines(&'a mut dyn Write),
}

/// What was fed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedReport {
    pub events: u64,
    pub sessions: u64,
}

/// The clock of simulated fleets written to files: 2025-11-13T00:00:00Z, 20 ms per event
/// (`loopwarden simulate --output`), so the same seed always gives the same file.
pub const FILE_CLOCK: (i64, i64) = (1_763_000_000_000, 20);

/// Feeds the fleet (all of it, or `limit` events; until shutdown), stamping events with the wall clock for
/// Kafka or with a synthetic clock (`clock_start_ms`, +`clock_step_ms` per event) for
/// files, then waits for every delivery.
pub fn feed(
    fleet: &mut Fleet,
    target: Target<'_>,
    rate: f64,
    clock: Option<(i64, i64)>,
    limit: Option<u64>,
    shutdown: &Shutdown,
) -> Result<FeedReport, FeedError> {
    let mut pacer = Pacer::new(rate);
    let mut report = FeedReport::default();
    let mut synthetic = clock.map(|(start, _)| start);
    let step = clock.map_or(0, |(_, s)| s);
    let mut target = target;
    while !shutdown.is_triggered() && limit.is_none_or(|l| report.events < l) {
        pacer.wait();
        let now = match synthetic.as_mut() {
            Some(t) => {
                *t += step;
                *t
            }
            None => wall_ms(),
        };
        let Some(e) = fleet.next_event(now) else {
            break;
        };
        report.events += 1;
        match &mut target {
            Target::Kafka { producer, routing } => {
                let topic = routing.topic_of(&e);
                let mut record = BaseRecord::to(topic)
                    .key(e.session_id.as_bytes())
                    .payload(&e.json)
                    .timestamp(now);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            producer.poll(Duration::from_millis(5));
                            record = r;
                        }
                        Err((source, _)) => {
                            return Err(FeedError::Produce {
                                topic: topic.to_string(),
                                source,
                            })
                        }
                    }
                }
                producer.poll(Duration::ZERO);
            }
            Target::Lines(w) => {
                w.write_all(&e.json)?;
                w.write_all(b"\n")?;
            }
        }
    }
    match target {
        Target::Kafka { producer, .. } => {
            producer
                .flush(Duration::from_secs(60))
                .map_err(FeedError::Flush)?;
            let ctx = producer.context();
            let count = ctx.failed.load(Ordering::Relaxed);
            if count > 0 {
                let first = ctx
                    .first_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_default();
                return Err(FeedError::Undelivered { count, first });
            }
        }
        Target::Lines(w) => w.flush()?,
    }
    report.sessions = fleet.truths().len() as u64;
    Ok(report)
}

/// Writes ground truth as JSON Lines.
pub fn write_truth(truths: &[Truth], w: &mut dyn Write) -> std::io::Result<()> {
    for t in truths {
        serde_json::to_writer(&mut *w, t)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}
