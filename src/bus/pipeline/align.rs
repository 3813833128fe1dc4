//! Event-time alignment of one partition's input topics (Kafka Streams'
//! `max.task.idle.ms`, with KIP-695's rule for topics known to be behind). The runtime
//! writes a session's LLM calls and tool calls to different topics; the consumer fetches
//! each topic on its own schedule, so a backlog of one topic can arrive before the
//! other's events that happened in between. The aligner holds each topic's polled events
//! in offset order and hands out the head with the smallest event time, but only while
//! every topic has something held: a topic with nothing held may still deliver an
//! earlier event, so the heads wait for it.
//!
//! How long they wait depends on what the client knows of that topic:
//! - **Unpolled**: the broker holds events of it that were not polled yet (its fetch
//!   position is below its high watermark, or no fetch answered since the assignment).
//!   The heads wait for them: after a restart on a busy machine one topic's first fetch
//!   can come seconds after the other's, and applying the other's backlog meanwhile
//!   would judge sessions on a different order than replay's (findings lost or told by
//!   another detector). A topic that has just drained counts as unpolled until the
//!   client is asked again (its next fetch may already be waiting). The wait is bounded:
//!   a topic that stays unpolled for [`UNPOLLED_WAIT_MAX`] after it drained (or was
//!   assigned) is believed caught up until it drains again or is seen caught up, so a
//!   high watermark above an open transaction (read_committed hides its records until
//!   the commit) delays the others at most that long each time, and never stalls them.
//! - **Caught up**: nothing more is known on the broker; a live event may still be on
//!   its way, so the heads wait `wait` after they were polled.
//! - **Never written**: the partition of that topic has never held an event (its high
//!   watermark is 0): the heads do not wait for it. A deployment that writes one input
//!   topic only (OpenTelemetry spans through the ingest) waits on nothing; the first
//!   event a topic ever gets may be applied up to `wait` out of event-time order.
//!
//! `wait` zero turns alignment off: heads go as they come.
//!
//! Ties go to the topic listed first, then offset order.
//!
//! Guarantees: each topic's events come out in offset order (so "applied up to offset o"
//! stays a prefix and the stored offsets stay exact); the order out depends only on the
//! held events and on which heads waited out their wait, not on how the fetches were cut
//! (a batch read again after a restart comes out as replay's when every topic's backlog
//! is polled within [`UNPOLLED_WAIT_MAX`]); an item without an event time (a dead letter)
//! goes as soon as it heads its topic. Time is injected (`now`), so tests drive the clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a topic that claims unpolled events on the broker may hold the other topics'
/// heads without delivering one (see the module's docs).
pub const UNPOLLED_WAIT_MAX: Duration = Duration::from_secs(30);

/// One polled message waiting to be applied.
#[derive(Debug)]
pub struct Held<T> {
    /// Event time (ms); `None` for items that need no ordering (dead letters).
    pub time: Option<i64>,
    pub offset: i64,
    /// When it was polled (its wait counts from here).
    pub polled: Instant,
    pub item: T,
}

impl<T> Held<T> {
    /// The same message with its item made into another.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Held<U> {
        Held {
            time: self.time,
            offset: self.offset,
            polled: self.polled,
            item: f(self.item),
        }
    }
}

/// One input topic's held messages and what is known of its unpolled ones.
#[derive(Debug)]
struct Queue<T> {
    held: VecDeque<Held<T>>,
    /// Since when this topic counts as unpolled (events of it on the broker not polled
    /// yet, or not known since it drained); `None`: caught up as far as the client knows.
    unpolled_since: Option<Instant>,
    /// This stretch of being unpolled outlasted the bound and was reported.
    overrun_reported: bool,
    /// Its partition has never held an event: nothing to wait for.
    never_written: bool,
}

/// The held messages of one partition, one queue per input topic.
#[derive(Debug)]
pub struct Aligner<T> {
    queues: Vec<Queue<T>>,
    wait: Duration,
    unpolled_wait_max: Duration,
    /// Topics whose unpolled stretch outlasted the bound while a head went, not taken
    /// yet (see [`Aligner::take_overruns`]).
    overruns: Vec<usize>,
}

impl<T> Aligner<T> {
    /// An aligner for `topics` input topics (indexes `0..topics`, in configuration order),
    /// created at `now`. Until told otherwise every topic counts as unpolled: before its
    /// first fetch answers, nothing says the broker holds none of its events.
    pub fn new(topics: usize, wait: Duration, now: Instant) -> Aligner<T> {
        Aligner::with_unpolled_wait_max(topics, wait, UNPOLLED_WAIT_MAX, now)
    }

    /// [`Aligner::new`] with another bound on the wait for unpolled events.
    pub fn with_unpolled_wait_max(
        topics: usize,
        wait: Duration,
        unpolled_wait_max: Duration,
        now: Instant,
    ) -> Aligner<T> {
        Aligner {
            queues: (0..topics.max(1))
                .map(|_| Queue {
                    held: VecDeque::new(),
                    unpolled_since: Some(now),
                    overrun_reported: false,
                    never_written: false,
                })
                .collect(),
            wait,
            unpolled_wait_max,
            overruns: Vec::new(),
        }
    }

    /// Holds a message of topic `topic`; messages of one topic must come in offset order.
    pub fn push(&mut self, topic: usize, held: Held<T>) {
        let queue = &mut self.queues[topic];
        debug_assert!(queue
            .held
            .back()
            .is_none_or(|last| last.offset < held.offset));
        // An event of it: written now, whatever the watermarks said.
        queue.never_written = false;
        queue.held.push_back(held);
    }

    /// Records whether the broker holds events of `topic` that were not polled yet, as
    /// the client knows at `now`.
    pub fn set_unpolled(&mut self, topic: usize, unpolled: bool, now: Instant) {
        let queue = &mut self.queues[topic];
        if !unpolled {
            queue.unpolled_since = None;
            queue.overrun_reported = false;
        } else if queue.unpolled_since.is_none() {
            queue.unpolled_since = Some(now);
        }
    }

    /// Records whether `topic`'s partition has never held an event (high watermark 0),
    /// as the client knows: the heads do not wait for such a topic.
    pub fn set_never_written(&mut self, topic: usize, never_written: bool) {
        self.queues[topic].never_written = never_written;
    }

    /// Whether `topic` has nothing held (what it knows of the broker then matters).
    pub fn is_drained(&self, topic: usize) -> bool {
        self.queues[topic].held.is_empty()
    }

    /// The head that goes next (smallest event time, ties to the first topic), and when
    /// it may go (`None`: at once): while some topic has nothing held, a head with an
    /// event time waits `wait` after it was polled, and as long as an empty topic is
    /// unpolled (at most `unpolled_wait_max` after that topic's last delivery).
    fn candidate(&self) -> Option<(usize, Option<Instant>)> {
        let mut next: Option<(usize, &Held<T>)> = None;
        let mut due: Option<Instant> = None;
        let mut some_topic_empty = false;
        for (topic, queue) in self.queues.iter().enumerate() {
            match queue.held.front() {
                None if queue.never_written => {}
                None => {
                    some_topic_empty = true;
                    if let Some(since) = queue.unpolled_since {
                        let until = since + self.unpolled_wait_max;
                        due = Some(due.map_or(until, |d| d.max(until)));
                    }
                }
                // `None < Some(_)`: an item without a time goes first.
                Some(head) if next.is_none_or(|(_, n)| head.time < n.time) => {
                    next = Some((topic, head))
                }
                Some(_) => {}
            }
        }
        let (topic, head) = next?;
        if !some_topic_empty || head.time.is_none() || self.wait.is_zero() {
            return Some((topic, None));
        }
        let grace = head.polled + self.wait;
        Some((topic, Some(due.map_or(grace, |d| d.max(grace)))))
    }

    /// The next message to apply, if one may go at `now`: the head with the smallest
    /// event time, when every topic has something held or that head's wait is over.
    pub fn pop_ready(&mut self, now: Instant) -> Option<(usize, Held<T>)> {
        let (topic, due) = self.candidate()?;
        if due.is_some_and(|due| now < due) {
            return None;
        }
        if due.is_some() {
            // The head goes without an empty topic that still claims unpolled events:
            // the order may differ from replay's, so it is reported (once a stretch).
            let max = self.unpolled_wait_max;
            for (t, q) in self.queues.iter_mut().enumerate() {
                let overrun = q.held.is_empty()
                    && !q.overrun_reported
                    && q.unpolled_since.is_some_and(|since| now >= since + max);
                if overrun {
                    q.overrun_reported = true;
                    self.overruns.push(t);
                }
            }
        }
        let queue = &mut self.queues[topic];
        let held = queue.held.pop_front()?;
        if queue.held.is_empty() {
            // What follows may already wait in the client: unknown until asked.
            queue.unpolled_since = Some(now);
            queue.overrun_reported = false;
        }
        Some((topic, held))
    }

    /// The topics that stayed unpolled past the bound while other topics' heads went
    /// without them since the last call, each once per such stretch.
    pub fn take_overruns(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.overruns)
    }

    /// When the head that waits for another topic may go (`None`: nothing waits).
    pub fn next_due(&self) -> Option<Instant> {
        self.candidate()?.1
    }

    /// The offset of the last message held for `topic`.
    pub fn last_offset(&self, topic: usize) -> Option<i64> {
        self.queues[topic].held.back().map(|h| h.offset)
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(|q| q.held.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(|q| q.held.is_empty())
    }

    /// Drops everything held (their offsets were never applied: they are read again), at
    /// `now`; every topic counts as unpolled again, its events back on the broker.
    pub fn clear(&mut self, now: Instant) {
        for queue in &mut self.queues {
            queue.held.clear();
            queue.unpolled_since = Some(now);
            queue.overrun_reported = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(100);

    fn held(time: i64, offset: i64, polled: Instant) -> Held<&'static str> {
        Held {
            time: Some(time),
            offset,
            polled,
            item: "",
        }
    }

    /// An aligner whose topics are all known to be caught up at `now`.
    fn caught_up(topics: usize, wait: Duration, now: Instant) -> Aligner<&'static str> {
        let mut a = Aligner::new(topics, wait, now);
        for topic in 0..topics {
            a.set_unpolled(topic, false, now);
        }
        a
    }

    /// What may go at `now`, the client never asked in between (a drained topic stays
    /// unpolled).
    fn drain(a: &mut Aligner<&'static str>, now: Instant) -> Vec<(usize, i64)> {
        std::iter::from_fn(|| a.pop_ready(now))
            .map(|(t, h)| (t, h.offset))
            .collect()
    }

    /// What may go at `now`, the client saying whenever asked that nothing more waits on
    /// the broker (each drained topic is caught up), as on a live stream.
    fn drain_caught_up(a: &mut Aligner<&'static str>, now: Instant) -> Vec<(usize, i64)> {
        let mut out = Vec::new();
        loop {
            out.extend(drain(a, now));
            let unknown: Vec<usize> = (0..a.queues.len())
                .filter(|&t| a.is_drained(t) && a.queues[t].unpolled_since.is_some())
                .collect();
            if unknown.is_empty() {
                return out;
            }
            for t in unknown {
                a.set_unpolled(t, false, now);
            }
        }
    }

    #[test]
    fn heads_go_in_event_time_order_while_every_topic_has_data() {
        let t0 = Instant::now();
        let mut a = caught_up(2, WAIT, t0);
        // Topic 0 (LLM calls) at times 10, 30, 50; topic 1 (tool calls) at 20, 40.
        for (o, t) in [(0, 10), (1, 30), (2, 50)] {
            a.push(0, held(t, o, t0));
        }
        for (o, t) in [(0, 20), (1, 40)] {
            a.push(1, held(t, o, t0));
        }
        // 50 waits: topic 1 has nothing left that could come before it.
        assert_eq!(
            drain_caught_up(&mut a, t0),
            vec![(0, 0), (1, 0), (0, 1), (1, 1)]
        );
        assert_eq!(a.len(), 1);
        assert_eq!(a.next_due(), Some(t0 + WAIT));
        // A later tool call arrives: 50 goes, the tool call at 60 waits in its turn.
        a.push(1, held(60, 2, t0 + Duration::from_millis(5)));
        assert_eq!(
            drain_caught_up(&mut a, t0 + Duration::from_millis(5)),
            vec![(0, 2)]
        );
        assert_eq!(
            drain_caught_up(&mut a, t0 + Duration::from_millis(104)),
            vec![]
        );
        assert_eq!(
            drain_caught_up(&mut a, t0 + Duration::from_millis(105)),
            vec![(1, 2)]
        );
        assert!(a.is_empty());
        assert_eq!(a.next_due(), None);
    }

    #[test]
    fn a_head_waits_for_an_empty_topic_at_most_the_wait() {
        let t0 = Instant::now();
        let mut a = caught_up(2, WAIT, t0);
        a.push(0, held(10, 0, t0));
        assert!(a.pop_ready(t0 + WAIT - Duration::from_millis(1)).is_none());
        assert_eq!(drain_caught_up(&mut a, t0 + WAIT), vec![(0, 0)]);
    }

    #[test]
    fn an_earlier_event_of_the_late_topic_goes_first_when_it_comes_in_time() {
        let t0 = Instant::now();
        let mut a = caught_up(2, WAIT, t0);
        a.push(0, held(30, 0, t0));
        a.push(1, held(20, 0, t0 + Duration::from_millis(50)));
        assert_eq!(
            drain_caught_up(&mut a, t0 + Duration::from_millis(50)),
            vec![(1, 0)],
            "the tool call at 20 goes first; the LLM call at 30 waits for topic 1 again"
        );
        assert_eq!(drain_caught_up(&mut a, t0 + WAIT), vec![(0, 0)]);
    }

    #[test]
    fn ties_go_to_the_first_topic_and_items_without_time_go_at_once() {
        let t0 = Instant::now();
        let mut a = caught_up(2, WAIT, t0);
        a.push(1, held(10, 0, t0));
        a.push(0, held(10, 0, t0));
        a.push(
            0,
            Held {
                time: None,
                offset: 1,
                polled: t0,
                item: "dead letter",
            },
        );
        assert_eq!(drain_caught_up(&mut a, t0), vec![(0, 0), (0, 1)]);
        // Topic 0 has nothing held now: the tool call waits for it.
        assert_eq!(drain_caught_up(&mut a, t0 + WAIT), vec![(1, 0)]);
    }

    #[test]
    fn one_topic_never_waits_and_zero_wait_never_holds() {
        let t0 = Instant::now();
        let mut one = caught_up(1, WAIT, t0);
        one.push(0, held(10, 0, t0));
        assert_eq!(drain_caught_up(&mut one, t0), vec![(0, 0)]);
        // Zero turns alignment off: not even an unpolled topic holds a head.
        let mut eager = Aligner::new(2, Duration::ZERO, t0);
        eager.push(0, held(10, 0, t0));
        assert_eq!(drain(&mut eager, t0), vec![(0, 0)]);
    }

    #[test]
    fn the_order_out_does_not_depend_on_how_the_fetches_were_cut() {
        // The same two topics pushed in two different interleavings (as two fetch
        // schedules would) come out the same once both are held.
        let t0 = Instant::now();
        let llm = [(0, 5), (1, 12), (2, 13), (3, 40)];
        let tool = [(0, 6), (1, 7), (2, 30), (3, 41)];
        let mut outs = Vec::new();
        for llm_first in [true, false] {
            let mut a = caught_up(2, WAIT, t0);
            let mut out = Vec::new();
            for step in 0..4 {
                let (first, second) = if llm_first { (0, 1) } else { (1, 0) };
                for topic in [first, second] {
                    let (o, t) = if topic == 0 { llm[step] } else { tool[step] };
                    a.push(topic, held(t, o, t0));
                    out.extend(drain_caught_up(&mut a, t0));
                }
            }
            out.extend(drain_caught_up(&mut a, t0 + WAIT));
            outs.push(out);
        }
        assert_eq!(outs[0], outs[1]);
        assert_eq!(
            outs[0],
            vec![
                (0, 0),
                (1, 0),
                (1, 1),
                (0, 1),
                (0, 2),
                (1, 2),
                (0, 3),
                (1, 3)
            ]
        );
    }

    #[test]
    fn heads_wait_for_a_topic_with_unpolled_events_past_the_grace() {
        // After a restart the tool calls' first fetch comes 3 s after the LLM calls'
        // backlog: the LLM calls wait for it, then both go in event-time order.
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut a = Aligner::new(2, WAIT, t0);
        a.set_unpolled(0, false, t0);
        for (o, t) in [(0, 10), (1, 30)] {
            a.push(0, held(t, o, t0));
        }
        assert_eq!(drain(&mut a, ms(3000)), vec![], "topic 1 is unpolled");
        assert_eq!(a.next_due(), Some(t0 + UNPOLLED_WAIT_MAX));
        a.push(1, held(20, 0, ms(3000)));
        a.set_unpolled(1, false, ms(3000));
        // The tool call at 20 drains its topic: what follows may already wait in the
        // client, so the LLM call at 30 waits until the client is asked.
        assert_eq!(drain(&mut a, ms(3000)), vec![(0, 0), (1, 0)]);
        assert_eq!(a.next_due(), Some(ms(3000) + UNPOLLED_WAIT_MAX));
        // Caught up: it waits its grace only, from its poll, which ran out long ago.
        a.set_unpolled(1, false, ms(3000));
        assert_eq!(drain(&mut a, ms(3000)), vec![(0, 1)]);
    }

    #[test]
    fn a_topic_that_stays_unpolled_without_delivering_delays_the_others_at_most_the_bound() {
        let t0 = Instant::now();
        let max = Duration::from_secs(2);
        let ms = |n| t0 + Duration::from_millis(n);
        let mut a = Aligner::with_unpolled_wait_max(2, WAIT, max, t0);
        a.set_unpolled(0, false, t0);
        a.push(0, held(10, 0, ms(500)));
        // Still unpolled at every look (a watermark above an open transaction).
        a.set_unpolled(1, true, ms(1000));
        assert_eq!(drain(&mut a, ms(1999)), vec![]);
        assert!(
            a.take_overruns().is_empty(),
            "nothing went past the bound yet"
        );
        assert_eq!(drain(&mut a, ms(2000)), vec![(0, 0)]);
        assert_eq!(a.take_overruns(), vec![1], "the overrun is reported");
        // Believed caught up from then on: the next head waits its grace only.
        a.set_unpolled(1, true, ms(2100));
        a.push(0, held(20, 1, ms(2100)));
        assert_eq!(drain(&mut a, ms(2199)), vec![]);
        assert_eq!(drain(&mut a, ms(2200)), vec![(0, 1)]);
        assert!(a.take_overruns().is_empty(), "once a stretch");
        // Draining renews its credit: it is waited for again.
        a.push(1, held(30, 0, ms(3000)));
        assert_eq!(drain(&mut a, ms(3000)), vec![]);
        a.push(0, held(40, 2, ms(3000)));
        assert_eq!(drain(&mut a, ms(3000)), vec![(1, 0)]);
        assert_eq!(drain(&mut a, ms(4999)), vec![]);
        assert_eq!(drain(&mut a, ms(5000)), vec![(0, 2)]);
        assert_eq!(a.take_overruns(), vec![1], "a new stretch, reported again");
    }

    /// A topic whose partition never held an event (a deployment writing one input
    /// topic) holds no head; its first event makes it a topic to wait for again.
    #[test]
    fn a_topic_never_written_holds_nothing_until_it_is() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut a = caught_up(2, WAIT, t0);
        a.push(0, held(10, 0, t0));
        assert!(a.pop_ready(t0).is_none(), "waits for topic 1 first");
        a.set_never_written(1, true);
        assert_eq!(a.pop_ready(t0).map(|(t, h)| (t, h.offset)), Some((0, 0)));
        a.set_unpolled(0, false, t0);
        // Its first event: alignment as before.
        a.push(1, held(30, 0, ms(1)));
        a.push(0, held(40, 1, ms(1)));
        assert_eq!(a.pop_ready(ms(1)).map(|(t, h)| (t, h.offset)), Some((1, 0)));
        a.set_unpolled(1, false, ms(1));
        assert!(a.pop_ready(ms(1)).is_none(), "topic 1 is empty again: wait");
        assert!(a.pop_ready(ms(1) + WAIT).is_some());
    }

    #[test]
    fn a_new_aligner_waits_for_every_topic_until_its_fetch_answers() {
        let t0 = Instant::now();
        let mut a = Aligner::new(2, WAIT, t0);
        a.push(0, held(10, 0, t0));
        assert_eq!(drain(&mut a, t0 + WAIT), vec![]);
        a.set_unpolled(1, false, t0 + WAIT);
        assert_eq!(drain(&mut a, t0 + WAIT), vec![(0, 0)]);
        // Cleared (an assignment dropped): unpolled again.
        a.push(0, held(20, 1, t0 + WAIT));
        a.clear(t0 + WAIT);
        a.push(0, held(20, 1, t0 + WAIT));
        assert_eq!(drain(&mut a, t0 + WAIT * 5), vec![]);
    }
}
