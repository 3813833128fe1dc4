//! One assigned partition number (partition *p* of every input topic) as a worker holds
//! it: its engine, its sled tree, the offsets applied per input topic and the polled
//! messages waiting in its aligner, and what it turns a polled message into.
//!
//! Guarantees: a partition's changes are taken together with the offsets they reflect
//! (one store batch), and the offsets to commit are exactly the applied ones. With a
//! commit interval (`kafka.commit_interval_ms`, at least once) a partition's changes are
//! taken at the first batch end of each of its turns, and wait in its engine until then
//! (a stop takes them all, a revoke those of the partitions it takes away): the offsets it
//! commits then are still those its stored states reflect. A worker's partitions take
//! their turns in phases spread over the interval ([`first_due`]), so that each batch end
//! takes a slice of them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::warn;

use super::align::Aligner;
use super::batch::PolledTimes;
use super::outbox::{dead_letter, Record};
use super::outputs::Source;
use super::writer::SharedStore;
use crate::bus::kafka::headers::RawHeaders;
use crate::contract::event::wall_ms;
use crate::contract::event::{parse_event, Event, ParseLimits};
use crate::contract::output::Output;
use crate::engine::store::{SledStore, StoreBatch};
use crate::engine::{clock_limit, stamped_ms, Engine, EventMeta};

/// How many times `idle_after` a partition that is behind waits before its clock
/// advances anyway.
pub const BEHIND_WAITS: u32 = 4;

/// A polled message waiting for its turn: an event, or a dead letter (which keeps its
/// place so that the applied offsets stay a prefix of each topic).
// Nearly every item is an event: boxing it to shrink the rare dead letter's slot would
// cost an allocation per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum Pending<'m> {
    /// Its meta without its topic, which the aligner's topic index names. The event
    /// borrows from its message's bytes until it is held past the message
    /// ([`Pending::into_owned`]).
    Event(Event<'m>, EventMeta<'static>, Source),
    DeadLetter(Record, &'static str),
}

/// One assigned partition number (partition *p* of every input topic).
pub(super) struct Partition {
    pub engine: Engine,
    /// Written by the worker's store writer, off the worker's thread.
    pub store: SharedStore,
    /// Last applied offset per input topic.
    pub applied: BTreeMap<Arc<str>, i64>,
    /// Polled messages not applied yet, released across topics in event-time order.
    pub held: Aligner<Pending<'static>>,
    /// Whether state or offsets changed since the last store.
    pub dirty: bool,
    /// Wall time and engine clock at the last event, for the idle clock.
    pub last_event_wall: Instant,
    pub clock_at_last_event: Option<i64>,
    /// Messages of this partition wait on the broker (as the client last saw it): it is
    /// behind, not idle, and its clock waits for its events.
    pub behind: bool,
    /// Each input topic's high watermark as the broker gave it at the assignment (`None`:
    /// not asked, with one input topic, or no answer). The client's cached watermarks
    /// outlive a revoke, so after a partition comes back they may be older than this.
    pub high_at_assignment: Vec<Option<i64>>,
    /// Its log, as the first skipped event found it, ended before the offset its state
    /// says was applied (`None`: no event skipped yet since it was loaded): the state is
    /// of another log (a topic made again, a cluster replaced), which a warning says.
    pub log_ends_before_state: Option<bool>,
    /// When its changes are next taken ([`Partition::take_turn`]).
    pub due: Instant,
    /// When the events applied since its changes were last taken were polled (processing
    /// latency, observed once they are committed).
    pub polled: PolledTimes,
}

impl Pending<'_> {
    /// A polled message of input `topic`, parsed: an event with its event time (the
    /// message's timestamp when the event has none; at most [`clock_limit`], as the
    /// engine's clock takes it), or a dead letter saying why not. An
    /// event's [`Source`] is [`Source::deferred`]: the caller reads the message's headers
    /// into it while the message is at hand, if the event has outputs or is held. The
    /// event borrows its strings from the message's payload where they need no unescaping.
    pub fn of<'m, M: Message>(
        m: &'m M,
        topic: &str,
        limits: &ParseLimits,
        future_grace_ms: i64,
    ) -> (Option<i64>, Pending<'m>)
    where
        M::Headers: RawHeaders,
    {
        let (partition, offset) = (m.partition(), m.offset());
        let payload = m.payload().unwrap_or_default();
        match parse_event(payload, limits) {
            Ok(event) => {
                let meta = EventMeta {
                    topic: None,
                    partition: Some(partition),
                    offset: Some(offset),
                    message_timestamp_ms: m.timestamp().to_millis(),
                    processing_time_ms: Some(wall_ms()),
                };
                // A head stamped a day ahead would hold its topic's later events behind the
                // other topics' until they drain.
                let limit = clock_limit(&meta, future_grace_ms).unwrap_or(i64::MAX);
                let event_ms = stamped_ms(&event, &meta).unwrap_or(0).min(limit);
                let source = Source::deferred(m, meta.message_timestamp_ms);
                (Some(event_ms), Pending::Event(event, meta, source))
            }
            Err(bad) => {
                let detail = bad.detail();
                warn!(topic = %topic, partition, offset, reason = bad.reason(), error = %detail, "dead-lettering bad message");
                (
                    None,
                    Pending::DeadLetter(dead_letter(m, topic, bad.reason(), &detail), bad.reason()),
                )
            }
        }
    }

    /// The same item owning its event's strings, to be held past its message.
    pub fn into_owned(self) -> Pending<'static> {
        match self {
            Pending::Event(event, meta, source) => Pending::Event(event.into_owned(), meta, source),
            Pending::DeadLetter(record, reason) => Pending::DeadLetter(record, reason),
        }
    }
}

impl Partition {
    /// A partition loaded from its store, its aligner waiting `align_wait` across the
    /// `topics` input topics, its changes first taken at `due` ([`first_due`]).
    pub fn new(
        engine: Engine,
        store: SledStore,
        applied: BTreeMap<Arc<str>, i64>,
        topics: usize,
        align_wait: Duration,
        due: Instant,
    ) -> Partition {
        let clock_at_last_event = engine.watermark();
        Partition {
            engine,
            store: Arc::new(Mutex::new(store)),
            applied,
            held: Aligner::new(topics, align_wait, Instant::now()),
            dirty: false,
            last_event_wall: Instant::now(),
            clock_at_last_event,
            behind: false,
            high_at_assignment: Vec::new(),
            log_ends_before_state: None,
            due,
            polled: PolledTimes::default(),
        }
    }

    /// Whether its changes are due at `now`, with `interval` between takes: always when
    /// the interval is zero.
    pub fn is_due(&self, now: Instant, interval: Duration) -> bool {
        interval.is_zero() || now >= self.due
    }

    /// Whether a batch's end at `now` takes its changes ([`Partition::is_due`]); when it
    /// does, its next turn is the first of its phase after `now` (`due` plus whole
    /// intervals). Skipped turns (a quiet input ends no batch, a restore or an outage
    /// stalls them) keep the phase: counted from `now`, every partition of a worker would
    /// share one turn from then on, and each end would take them all.
    pub fn take_turn(&mut self, now: Instant, interval: Duration) -> bool {
        if !self.is_due(now, interval) {
            return false;
        }
        if !interval.is_zero() {
            // Below an interval (at most a minute: in u64 nanoseconds).
            let into = (now - self.due).as_nanos() % interval.as_nanos();
            self.due = now + (interval - Duration::from_nanos(into as u64));
        }
        true
    }

    /// Advances the engine's clock by the wall time since the last event, once nothing
    /// has been applied or held for `idle_after` (closing silent sessions). While
    /// messages wait on the broker the partition is behind, not idle, and waits up to
    /// [`BEHIND_WAITS`] × `idle_after`: a consumer that stalls or lags must not expire
    /// the sessions whose events it has not read yet, and a watermark that never comes
    /// level (aborted transactions at a partition's end) must not keep them open forever.
    pub fn advance_idle_clock(&mut self, idle_after: Duration, outputs: &mut Vec<Output>) {
        if !self.held.is_empty() {
            return;
        }
        let idle = self.last_event_wall.elapsed();
        let Some(clock) = self.clock_at_last_event else {
            return;
        };
        let threshold = if self.behind {
            idle_after.saturating_mul(BEHIND_WAITS)
        } else {
            idle_after
        };
        if idle < threshold {
            return;
        }
        self.engine
            .advance_clock(clock.saturating_add(idle.as_millis() as i64), outputs);
        // Its closes, and completed sessions it forgot (their markers' deletes): stored
        // now, not at the partition's next event.
        if self.engine.has_changes() {
            self.dirty = true;
        }
    }

    /// Takes the changes since the last store (sessions and applied offsets, one store
    /// batch) and adds the offsets to commit once stored, with when its events were
    /// polled; nothing when unchanged.
    pub fn take_changes(
        &mut self,
        partition: i32,
        commit: &mut TopicPartitionList,
    ) -> Option<(StoreBatch, PolledTimes)> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        let offsets: Vec<(String, i64)> = self
            .applied
            .iter()
            .map(|(t, o)| (format!("{t}/{partition}"), *o))
            .collect();
        for (t, o) in &self.applied {
            let _ = commit.add_partition_offset(t, partition, Offset::Offset(o + 1));
        }
        let polled = std::mem::take(&mut self.polled);
        self.engine
            .take_changes(&offsets)
            .map(|batch| (batch, polled))
    }
}

/// The golden ratio's fractional part: its multiples modulo 1 spread any run of
/// partition numbers evenly over the interval.
const PHASE_STEP: f64 = 0.618_033_988_749_895;

/// When a partition assigned at `now` first comes due, with `interval` between takes:
/// a fraction of the interval that differs from one partition number to the next, so that
/// a worker's partitions come due at different batch ends (at a million open sessions a
/// worker's whole state taken at once stopped it for seconds).
pub fn first_due(partition: i32, now: Instant, interval: Duration) -> Instant {
    let phase = (f64::from(partition) * PHASE_STEP).rem_euclid(1.0);
    now + interval.mul_f64(phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::contract::event::parse_event;
    use crate::engine::EventMeta;

    /// A partition on real sled with one open session, its last event `idle` ago.
    fn partition_with_a_session(dir: &std::path::Path, idle: Duration) -> Partition {
        let config = Arc::new(
            Config::from_toml_str("[engine]\nsession_gap_secs = 2\n", "t", std::iter::empty())
                .unwrap(),
        );
        let db = sled::open(dir).unwrap();
        let store = SledStore::partition(&db, 0).unwrap();
        let mut engine = Engine::restore(config, &store).unwrap();
        let event = br#"{"type":"tool.called","session_id":"s","timestamp":"2026-11-25T10:00:00Z","tool":"read","args":{"p":1},"result":"x"}"#;
        let mut out = Vec::new();
        engine.process(
            &parse_event(event, &ParseLimits::default()).unwrap(),
            &EventMeta::default(),
            &mut out,
        );
        let mut p = Partition::new(
            engine,
            store,
            BTreeMap::new(),
            1,
            Duration::ZERO,
            Instant::now(),
        );
        p.last_event_wall = Instant::now().checked_sub(idle).unwrap();
        p.clock_at_last_event = p.engine.watermark();
        p
    }

    #[test]
    fn a_partition_takes_its_turn_once_an_interval_in_its_own_phase() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = partition_with_a_session(dir.path(), Duration::ZERO);
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        // No interval: every batch's end.
        p.due = t0 + second * 100;
        assert!(p.is_due(t0, Duration::ZERO));
        assert!(p.take_turn(t0, Duration::ZERO));
        assert_eq!(p.due, t0 + second * 100, "left as it was");
        // Not yet due; due; then an interval on from when it was due, not from when the
        // batch ended (40 ms late), so that its phase holds.
        let interval = second * 10;
        p.due = t0 + second * 3;
        assert!(!p.take_turn(t0, interval));
        assert!(!p.is_due(t0 + second * 3 - Duration::from_millis(1), interval));
        assert!(!p.take_turn(t0 + second * 3 - Duration::from_millis(1), interval));
        assert!(p.is_due(t0 + second * 3, interval));
        assert!(p.take_turn(t0 + second * 3 + Duration::from_millis(40), interval));
        assert_eq!(p.due, t0 + second * 13);
        assert!(!p.take_turn(t0 + second * 12, interval));
        // Turns skipped (no batch ended from 13 s to 47 s): the next is the phase's first
        // after now, 53 s, not an interval from now.
        assert!(p.take_turn(t0 + second * 47, interval));
        assert_eq!(p.due, t0 + second * 53);
        // Exactly on a turn of the phase: the next one.
        assert!(p.take_turn(t0 + second * 63, interval));
        assert_eq!(p.due, t0 + second * 73);
        // Two partitions whose turns were skipped for the same stall keep their phases
        // apart.
        let dir = tempfile::tempdir().unwrap();
        let mut q = partition_with_a_session(dir.path(), Duration::ZERO);
        q.due = t0 + second * 6;
        p.due = t0 + second * 3;
        assert!(q.take_turn(t0 + second * 100, interval));
        assert!(p.take_turn(t0 + second * 100, interval));
        assert_eq!((p.due, q.due), (t0 + second * 103, t0 + second * 106));
    }

    #[test]
    fn a_workers_partitions_first_come_due_spread_over_the_interval() {
        let now = Instant::now();
        let interval = Duration::from_secs(10);
        for partitions in [
            vec![0, 1, 2, 3],
            (0..32).collect(),
            (0..64).step_by(2).collect::<Vec<_>>(),
        ] {
            let mut phases: Vec<Duration> = partitions
                .iter()
                .map(|&p| first_due(p, now, interval) - now)
                .collect();
            assert!(phases.iter().all(|d| *d < interval), "{phases:?}");
            phases.sort();
            // No two partitions come due together, and no gap is more than three times an
            // even spread's: each batch end takes a slice of them.
            let even = interval / partitions.len() as u32;
            let gaps: Vec<Duration> = phases.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(
                gaps.iter().all(|g| *g > even / 4 && *g < even * 3),
                "{partitions:?}: {phases:?}"
            );
        }
        assert_eq!(
            first_due(5, now, Duration::ZERO),
            now,
            "no interval: due at once"
        );
    }

    #[test]
    fn the_idle_clock_closes_silent_sessions_but_waits_while_events_wait_on_the_broker() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = partition_with_a_session(dir.path(), Duration::from_secs(3));
        let mut out = Vec::new();
        p.behind = true;
        p.advance_idle_clock(Duration::from_secs(1), &mut out);
        assert!(out.is_empty(), "behind: its events are not read yet");
        p.behind = false;
        p.advance_idle_clock(Duration::from_secs(1), &mut out);
        assert!(
            out.iter().any(|o| matches!(o, Output::Summary(_))),
            "idle past the session gap: the session closes ({out:?})"
        );
        // Behind for longer than BEHIND_WAITS × idle_after: it advances all the same.
        let dir = tempfile::tempdir().unwrap();
        let mut p = partition_with_a_session(dir.path(), Duration::from_secs(5));
        let mut out = Vec::new();
        p.behind = true;
        p.advance_idle_clock(Duration::from_secs(1), &mut out);
        assert!(
            out.iter().any(|o| matches!(o, Output::Summary(_))),
            "behind, but for too long ({out:?})"
        );
    }

    #[test]
    fn the_idle_clock_has_a_forgotten_completions_marker_deleted_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = partition_with_a_session(dir.path(), Duration::from_secs(62));
        // s completes and its batch is taken (its marker); then the partition is quiet.
        let done =
            br#"{"type":"session.completed","session_id":"s","timestamp":"2026-11-25T10:00:01Z"}"#;
        let mut out = Vec::new();
        let done = parse_event(done, &ParseLimits::default()).unwrap();
        p.engine.process(&done, &EventMeta::default(), &mut out);
        let batch = p.engine.take_changes(&[]).expect("tracked");
        assert_eq!(batch.puts.len(), 1, "s's marker");
        p.dirty = false;
        p.clock_at_last_event = p.engine.watermark();
        // A minute of quiet later the engine forgets s: nothing closes, but the marker's
        // delete is for the next batch, not the partition's next event.
        let mut out = Vec::new();
        p.advance_idle_clock(Duration::from_secs(1), &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert!(p.dirty, "a batch is due");
        let batch = p.engine.take_changes(&[]).expect("tracked");
        assert_eq!(batch.deletes, ["s"]);
    }
}
