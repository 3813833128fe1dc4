//! Sessions named by spans of earlier exports, for a span that names none of its own and
//! has no ancestor naming one in its own export.
//!
//! Why: a framework may name the session on some of a run's spans only. Google ADK puts
//! `gen_ai.conversation.id` on its model calls and on the agent's span, not on its tool
//! calls; the agent's span ends, and is exported, after the run. A tool call exported
//! with its model calls could take the session from them; one exported alone fell back
//! to its trace id, and the run was judged as two sessions: its model calls without
//! their tools, its tools without their model calls, neither what the agent did.
//!
//! What it owns: for each span whose children named a session, that session (or that
//! they named several). An LLM or tool call that names none, nor has an ancestor in its
//! export that does, takes its siblings' session (the other children of its parent), else
//! its parent's siblings' and so on up its ancestors in its export, where they named
//! exactly one (a level that named several stops it). A framework's span wrapping a model call (of no kind the mapping reads,
//! naming nothing, whose children named one session, a model call among them: ADK's
//! `call_llm` in its schema 1) passes that session on to its own siblings, one level only
//! (what it passed on makes no wrapper of its parent). Nothing else is inferred: not a
//! tool call's session from its children (an agent called as a tool runs in a session of
//! its own under it), nor from its trace or its agent (a trace may hold several runs of
//! one agent, each its own session, and a run's first call would go to the run before).
//!
//! Guarantees: bounded (two generations of at most [`GENERATION`] keys each: the oldest
//! are forgotten first; a span whose parent was forgotten falls back to its trace id, as
//! before this memory, or, where the forgotten key had named several sessions, takes the
//! one named since); deterministic (the same exports in the same order give the same
//! sessions, so `replay` of a file and the ingest agree). It is per process: an ingest
//! that restarts, or that takes a trace partition over, knows nothing of the exports
//! before, until a sibling names the session again.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use crate::contract::event::MAX_SESSION_ID_BYTES;

/// Keys a generation holds before it becomes the older one (and the older one is
/// dropped): one a parent span with a named child (an agent's run; each model call where a
/// framework wraps it in a span of its own). Both generations full take about 13 MB of
/// table (48 bytes a key and its value, in tables of twice as many slots), and the
/// session ids learnt, shared between keys learnt one after another; a table's growth
/// and the allocator's freed pages add to the peak (`scripts/otlp-session-memory`
/// measures what the memory filled to its bound adds to `replay`'s).
pub const GENERATION: usize = 1 << 16;

/// What the spans under a key named.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Named {
    /// One session; `model_call`: a model call among the spans that named it (not only
    /// what a wrapper passed on).
    One {
        session: Arc<str>,
        model_call: bool,
    },
    Several,
}

impl Named {
    pub(super) fn one(&self) -> Option<&Arc<str>> {
        match self {
            Named::One { session, .. } => Some(session),
            Named::Several => None,
        }
    }

    /// The one session, where a model call named it.
    pub(super) fn of_a_model_call(&self) -> Option<&Arc<str>> {
        match self {
            Named::One {
                session,
                model_call: true,
            } => Some(session),
            _ => None,
        }
    }
}

/// A map that forgets its oldest keys: new keys go to the current generation; when it is
/// full it becomes the previous one, whose keys are dropped.
#[derive(Debug, Clone)]
struct Generations<K> {
    current: HashMap<K, Named>,
    previous: HashMap<K, Named>,
    capacity: usize,
}

impl<K: Hash + Eq> Generations<K> {
    fn new(capacity: usize) -> Generations<K> {
        Generations {
            current: HashMap::new(),
            previous: HashMap::new(),
            capacity,
        }
    }

    fn get(&self, key: &K) -> Option<&Named> {
        self.current.get(key).or_else(|| self.previous.get(key))
    }

    /// A span under `key` (a model call, or not) named `session` (`shared` makes it,
    /// only for a new key).
    fn learn(
        &mut self,
        key: K,
        session: &str,
        model_call: bool,
        shared: impl FnOnce() -> Arc<str>,
    ) {
        match self.current.get_mut(&key) {
            Some(Named::One {
                session: s,
                model_call: m,
            }) if &**s == session => {
                *m |= model_call;
                return;
            }
            Some(Named::Several) => return,
            _ => {}
        }
        let named = match self
            .current
            .remove(&key)
            .or_else(|| self.previous.remove(&key))
        {
            Some(Named::One {
                session: s,
                model_call: m,
            }) if &*s == session => Named::One {
                session: s,
                model_call: m || model_call,
            },
            Some(_) => Named::Several,
            None => Named::One {
                session: shared(),
                model_call,
            },
        };
        if self.current.len() >= self.capacity {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, named);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

/// A span's key: its trace id and its span id (or parent span id).
pub(super) type SpanKey = [u8; 24];

pub(super) fn span_key(trace_id: &[u8], span_id: &[u8]) -> Option<SpanKey> {
    let mut key = [0; 24];
    if trace_id.len() != 16 || span_id.len() != 8 {
        return None;
    }
    key[..16].copy_from_slice(trace_id);
    key[16..].copy_from_slice(span_id);
    Some(key)
}

/// The sessions earlier exports named, by parent span.
#[derive(Debug, Clone)]
pub struct SessionsSeen {
    under: Generations<SpanKey>,
    /// The session learnt last: the next key learnt for it shares it.
    last: Option<Arc<str>>,
}

impl Default for SessionsSeen {
    fn default() -> SessionsSeen {
        SessionsSeen::with_capacity(GENERATION)
    }
}

impl SessionsSeen {
    pub(super) fn with_capacity(capacity: usize) -> SessionsSeen {
        SessionsSeen {
            under: Generations::new(capacity),
            last: None,
        }
    }

    /// A span under `parent` (a model call, or not) named `session`. Not a session id
    /// longer than the contract takes (its events are dead-lettered): the memory's size
    /// is bounded in bytes too.
    pub(super) fn learn(&mut self, parent: SpanKey, session: &str, model_call: bool) {
        if session.len() > MAX_SESSION_ID_BYTES {
            return;
        }
        let last = &mut self.last;
        self.under
            .learn(parent, session, model_call, || match last {
                Some(s) if &**s == session => s.clone(),
                _ => {
                    let s: Arc<str> = Arc::from(session);
                    *last = Some(s.clone());
                    s
                }
            });
    }

    /// What the children of span `key` named.
    pub(super) fn under(&self, key: &SpanKey) -> Option<&Named> {
        self.under.get(key)
    }

    /// Keys held, both generations.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.under.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_named_two_sessions_names_none() {
        let mut g = Generations::new(8);
        g.learn(1u8, "a", false, || "a".into());
        g.learn(1, "a", true, || unreachable!("known"));
        let a = Named::One {
            session: "a".into(),
            model_call: true,
        };
        assert_eq!(g.get(&1), Some(&a), "a model call among them");
        g.learn(1, "b", false, || "b".into());
        assert_eq!(g.get(&1), Some(&Named::Several));
        g.learn(1, "a", true, || "a".into());
        assert_eq!(g.get(&1), Some(&Named::Several), "several stays several");
    }

    #[test]
    fn keys_learnt_for_one_session_share_its_id() {
        let mut seen = SessionsSeen::with_capacity(8);
        let key = |k: u8| [k; 24];
        seen.learn(key(1), "adk-1", true);
        seen.learn(key(2), "adk-1", false);
        seen.learn(key(3), "adk-2", true);
        // An id longer than the contract takes is not kept.
        seen.learn(key(4), &"x".repeat(MAX_SESSION_ID_BYTES + 1), true);
        assert!(seen.under(&key(4)).is_none());
        let one = |k: u8| seen.under(&key(k)).and_then(Named::one).unwrap().clone();
        assert!(Arc::ptr_eq(&one(1), &one(2)));
        assert_eq!(&*one(3), "adk-2");
    }

    #[test]
    fn the_oldest_keys_are_forgotten_first_and_the_rest_kept() {
        let mut g = Generations::new(4);
        for k in 0..5u32 {
            g.learn(k, "s", false, || "s".into());
        }
        // Keys 0 to 3 are the older generation now; 0 used again moves to the newer.
        g.learn(0, "s", false, || "s".into());
        for k in 5..8u32 {
            g.learn(k, "s", false, || "s".into());
        }
        assert!(g.len() <= 8);
        assert!(g.get(&0).is_some(), "used again, kept");
        assert!(g.get(&7).is_some());
        for k in 1..4u32 {
            assert!(g.get(&k).is_none(), "key {k} forgotten");
        }
        for k in 8..100u32 {
            g.learn(k, "s", false, || "s".into());
            assert!(g.len() <= 8, "bounded");
        }
    }
}
