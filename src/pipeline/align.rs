//! Event-time alignment of one partition's input topics (Kafka Streams'
//! `max.task.idle.ms`). The runtime writes a session's LLM calls and tool calls to
//! different topics; the consumer fetches each topic on its own schedule, so a backlog of
//! one topic can arrive before the other's events that happened in between. The aligner
//! holds each topic's polled events in offset order and hands out the head with the
//! smallest event time, but only while every topic has something held: a topic with
//! nothing held may still deliver an earlier event, so the heads wait for it, at most
//! `wait` after they were polled. Ties go to the topic listed first, then offset order.
//!
//! Guarantees: each topic's events come out in offset order (so "applied up to offset o"
//! stays a prefix and the stored offsets stay exact); the order out depends only on the
//! held events and on which heads waited out `wait`, not on how the fetches were cut
//! (a batch read again after a restart comes out the same when its topics are all
//! there); an item without an event time (a dead letter) goes as soon as it heads its
//! topic. Time is injected (`now`), so tests drive the clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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

/// The held messages of one partition, one queue per input topic.
#[derive(Debug)]
pub struct Aligner<T> {
    queues: Vec<VecDeque<Held<T>>>,
    wait: Duration,
}

impl<T> Aligner<T> {
    /// An aligner for `topics` input topics (indexes `0..topics`, in configuration order).
    pub fn new(topics: usize, wait: Duration) -> Aligner<T> {
        Aligner {
            queues: (0..topics.max(1)).map(|_| VecDeque::new()).collect(),
            wait,
        }
    }

    /// Holds a message of topic `topic`; messages of one topic must come in offset order.
    pub fn push(&mut self, topic: usize, held: Held<T>) {
        debug_assert!(self.queues[topic]
            .back()
            .is_none_or(|last| last.offset < held.offset));
        self.queues[topic].push_back(held);
    }

    /// The head that goes next (smallest event time, ties to the first topic), and
    /// whether it must wait (some topic has nothing held and it has an event time).
    fn candidate(&self) -> Option<(usize, bool)> {
        let mut next: Option<(usize, Option<i64>)> = None;
        let mut some_topic_empty = false;
        for (topic, queue) in self.queues.iter().enumerate() {
            match queue.front() {
                None => some_topic_empty = true,
                // `None < Some(_)`: an item without a time goes first.
                Some(head) if next.is_none_or(|(_, t)| head.time < t) => {
                    next = Some((topic, head.time))
                }
                Some(_) => {}
            }
        }
        next.map(|(topic, time)| (topic, some_topic_empty && time.is_some()))
    }

    /// The next message to apply, if one may go at `now`: the head with the smallest
    /// event time, when every topic has something held or that head has waited `wait`.
    pub fn pop_ready(&mut self, now: Instant) -> Option<(usize, Held<T>)> {
        let (topic, must_wait) = self.candidate()?;
        let head = self.queues[topic].front()?;
        if must_wait && now.saturating_duration_since(head.polled) < self.wait {
            return None;
        }
        self.queues[topic].pop_front().map(|h| (topic, h))
    }

    /// When the head that waits for another topic may go (`None`: nothing waits).
    pub fn next_due(&self) -> Option<Instant> {
        let (topic, must_wait) = self.candidate()?;
        must_wait.then(|| self.queues[topic].front().map(|h| h.polled + self.wait))?
    }

    /// The offset of the last message held for `topic`.
    pub fn last_offset(&self, topic: usize) -> Option<i64> {
        self.queues[topic].back().map(|h| h.offset)
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Drops everything held (their offsets were never applied: they are read again).
    pub fn clear(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
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

    fn drain(a: &mut Aligner<&'static str>, now: Instant) -> Vec<(usize, i64)> {
        std::iter::from_fn(|| a.pop_ready(now))
            .map(|(t, h)| (t, h.offset))
            .collect()
    }

    #[test]
    fn heads_go_in_event_time_order_while_every_topic_has_data() {
        let t0 = Instant::now();
        let mut a = Aligner::new(2, WAIT);
        // Topic 0 (LLM calls) at times 10, 30, 50; topic 1 (tool calls) at 20, 40.
        for (o, t) in [(0, 10), (1, 30), (2, 50)] {
            a.push(0, held(t, o, t0));
        }
        for (o, t) in [(0, 20), (1, 40)] {
            a.push(1, held(t, o, t0));
        }
        // 50 waits: topic 1 has nothing left that could come before it.
        assert_eq!(drain(&mut a, t0), vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert_eq!(a.len(), 1);
        assert_eq!(a.next_due(), Some(t0 + WAIT));
        // A later tool call arrives: 50 goes, the tool call at 60 waits in its turn.
        a.push(1, held(60, 2, t0 + Duration::from_millis(5)));
        assert_eq!(drain(&mut a, t0 + Duration::from_millis(5)), vec![(0, 2)]);
        assert_eq!(drain(&mut a, t0 + Duration::from_millis(104)), vec![]);
        assert_eq!(drain(&mut a, t0 + Duration::from_millis(105)), vec![(1, 2)]);
        assert!(a.is_empty());
        assert_eq!(a.next_due(), None);
    }

    #[test]
    fn a_head_waits_for_an_empty_topic_at_most_the_wait() {
        let t0 = Instant::now();
        let mut a = Aligner::new(2, WAIT);
        a.push(0, held(10, 0, t0));
        assert!(a.pop_ready(t0 + WAIT - Duration::from_millis(1)).is_none());
        assert_eq!(drain(&mut a, t0 + WAIT), vec![(0, 0)]);
    }

    #[test]
    fn an_earlier_event_of_the_late_topic_goes_first_when_it_comes_in_time() {
        let t0 = Instant::now();
        let mut a = Aligner::new(2, WAIT);
        a.push(0, held(30, 0, t0));
        a.push(1, held(20, 0, t0 + Duration::from_millis(50)));
        assert_eq!(
            drain(&mut a, t0 + Duration::from_millis(50)),
            vec![(1, 0)],
            "the tool call at 20 goes first; the LLM call at 30 waits for topic 1 again"
        );
        assert_eq!(drain(&mut a, t0 + WAIT), vec![(0, 0)]);
    }

    #[test]
    fn ties_go_to_the_first_topic_and_items_without_time_go_at_once() {
        let t0 = Instant::now();
        let mut a = Aligner::new(2, WAIT);
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
        assert_eq!(drain(&mut a, t0), vec![(0, 0), (0, 1)]);
        // Topic 0 has nothing held now: the tool call waits for it.
        assert_eq!(drain(&mut a, t0 + WAIT), vec![(1, 0)]);
    }

    #[test]
    fn one_topic_never_waits_and_zero_wait_never_holds() {
        let t0 = Instant::now();
        let mut one = Aligner::new(1, WAIT);
        one.push(0, held(10, 0, t0));
        assert_eq!(drain(&mut one, t0), vec![(0, 0)]);
        let mut eager = Aligner::new(2, Duration::ZERO);
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
            let mut a = Aligner::new(2, WAIT);
            let mut out = Vec::new();
            for step in 0..4 {
                let (first, second) = if llm_first { (0, 1) } else { (1, 0) };
                for topic in [first, second] {
                    let (o, t) = if topic == 0 { llm[step] } else { tool[step] };
                    a.push(topic, held(t, o, t0));
                    out.extend(drain(&mut a, t0));
                }
            }
            out.extend(drain(&mut a, t0 + WAIT));
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
}
