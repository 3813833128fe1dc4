//! The numbers of the outbox's records handed to the producer and not acknowledged yet,
//! as a window of bits from the oldest such number on. Every record sent passes through
//! it twice (marked before its send, cleared by its delivery report), so both are a few
//! instructions and allocate nothing once the window has grown; a `BTreeSet` cost a
//! tree walk each, and at a million open sessions there is about one record an event.
//!
//! Guarantees: the same answers as a set of the numbers (a property test holds it to
//! one) for numbers within a bounded span, as the outbox's are (its records from the
//! oldest unacknowledged on); memory in proportion to the widest span from the oldest
//! number unacknowledged to the newest it has held (a bit each; the window's capacity is
//! kept), not to how many were ever sent.

use std::collections::VecDeque;

/// Bits a word of the window holds.
const WORD_BITS: usize = u64::BITS as usize;

/// A set of record numbers, kept as bits from `base` on. The front word
/// is never all zeros (it is dropped as soon as it is), so the oldest number is the front
/// word's lowest set bit.
#[derive(Debug, Default)]
pub struct Unacknowledged {
    /// The number of the front word's lowest bit: a multiple of [`WORD_BITS`].
    base: usize,
    words: VecDeque<u64>,
}

impl Unacknowledged {
    /// Marks `number` unacknowledged (marked already: nothing changes).
    pub fn insert(&mut self, number: usize) {
        if self.words.is_empty() {
            self.base = number - number % WORD_BITS;
        }
        // A number below the window widens it at the front. The outbox never asks for
        // this (a failed record stays marked until it is acknowledged, so its new send
        // finds its bit set); it is here so that any order answers as a set does.
        while number < self.base {
            self.words.push_front(0);
            self.base -= WORD_BITS;
        }
        let (word, bit) = self.place(number);
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= bit;
    }

    /// Clears `number` (not marked: nothing changes).
    pub fn remove(&mut self, number: usize) {
        if number < self.base {
            return;
        }
        let (word, bit) = self.place(number);
        let Some(w) = self.words.get_mut(word) else {
            return;
        };
        *w &= !bit;
        while self.words.front() == Some(&0) {
            self.words.pop_front();
            // An empty window's base is set again by the next insert (and past the last
            // word of the numbers it would overflow).
            if self.words.is_empty() {
                break;
            }
            self.base += WORD_BITS;
        }
    }

    /// Whether some number below `mark` is marked.
    pub fn any_below(&self, mark: usize) -> bool {
        self.first().is_some_and(|first| first < mark)
    }

    /// The oldest number marked.
    pub fn first(&self) -> Option<usize> {
        let front = *self.words.front()?;
        debug_assert_ne!(front, 0, "a front word of zeros is dropped");
        Some(self.base + front.trailing_zeros() as usize)
    }

    /// No number marked: the window holds no words once its last number is cleared.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Forgets every number (the window's memory is kept).
    pub fn clear(&mut self) {
        self.words.clear();
    }

    /// `number`'s word in the window and its bit there (`number` at or above the base).
    fn place(&self, number: usize) -> (usize, u64) {
        let offset = number - self.base;
        (offset / WORD_BITS, 1 << (offset % WORD_BITS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_oldest_number_unacknowledged_holds_every_mark_above_it() {
        let mut u = Unacknowledged::default();
        for n in 100..300 {
            u.insert(n);
        }
        assert_eq!((u.len(), u.first()), (200, Some(100)));
        for n in 101..300 {
            u.remove(n);
        }
        assert!(u.any_below(101) && !u.any_below(100), "100 alone is left");
        u.remove(100);
        assert!(u.is_empty() && u.first().is_none() && !u.any_below(usize::MAX));
        assert!(u.words.is_empty(), "the window shrank with its last number");
    }

    #[test]
    fn a_number_below_the_window_widens_it_at_the_front() {
        let mut u = Unacknowledged::default();
        u.insert(1_000);
        u.insert(3);
        assert_eq!((u.first(), u.len()), (Some(3), 2));
        u.remove(3);
        assert_eq!(u.first(), Some(1_000));
        assert_eq!(u.words.len(), 1, "the words below 1,000 were dropped");
    }

    #[test]
    fn the_last_numbers_there_are_can_be_marked_and_cleared() {
        let mut u = Unacknowledged::default();
        u.insert(usize::MAX);
        u.insert(usize::MAX - 64);
        assert_eq!(u.first(), Some(usize::MAX - 64));
        u.remove(usize::MAX - 64);
        u.remove(usize::MAX);
        assert!(u.is_empty() && u.first().is_none());
    }

    #[test]
    fn removing_what_is_not_marked_changes_nothing() {
        let mut u = Unacknowledged::default();
        u.remove(5);
        u.insert(70);
        u.remove(7);
        u.remove(500);
        u.remove(71);
        assert_eq!((u.first(), u.len()), (Some(70), 1));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(usize),
        Remove(usize),
        Clear,
    }

    /// Numbers up to `NUMBERS`: a few words' span, so that removals often empty the front
    /// word and land on its edges.
    const NUMBERS: usize = 300;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..NUMBERS).prop_map(Op::Insert),
            8 => (0..NUMBERS).prop_map(Op::Remove),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Any sequence of marks, clears and forgets answers as a `BTreeSet` does.
        #[test]
        fn it_answers_as_a_set_of_the_numbers(ops in proptest::collection::vec(op(), 0..400)) {
            let (mut u, mut model) = (Unacknowledged::default(), BTreeSet::new());
            for op in ops {
                match op {
                    Op::Insert(n) => { u.insert(n); model.insert(n); }
                    Op::Remove(n) => { u.remove(n); model.remove(&n); }
                    Op::Clear => { u.clear(); model.clear(); }
                }
                prop_assert_eq!(u.len(), model.len());
                prop_assert_eq!(u.first(), model.first().copied());
                for mark in 0..=NUMBERS {
                    prop_assert_eq!(u.any_below(mark), model.range(..mark).next().is_some());
                }
            }
        }
    }
}
