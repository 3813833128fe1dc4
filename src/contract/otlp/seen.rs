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
//! What it owns: for each span whose children named a session, that session; for each
//! agent of each trace, the session its spans named (or that they named several). A span
//! that names none, nor has an ancestor in its export that does, takes its siblings'
//! session (its chain's top's parent's children), else its children's, else its agent's
//! in its trace when that agent's spans there named exactly one. Traces holding several
//! sessions (an agent called as a tool with a session of its own, an evaluation loop)
//! are told apart by the siblings and the agents.
//!
//! Guarantees: bounded (two generations of at most [`GENERATION`] keys each, per map:
//! the oldest are forgotten first, and a span whose trace was forgotten falls back to its
//! trace id, as before this memory); deterministic (the same exports in the same order
//! give the same sessions, so `replay` of a file and the ingest agree). It is per
//! process: an ingest that restarts, or that takes a trace partition over, knows no
//! sessions of the exports before, until the trace names one again.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Keys a generation holds before it becomes the older one (and the older one is
/// dropped). An agent of a trace takes one key; a parent span with a named child one (an
/// agent's run, or each model call where a framework wraps it in a span of its own): at
/// about 48 bytes a key, both maps full hold about 25 MB.
pub const GENERATION: usize = 1 << 17;

/// What the spans under a key named.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Named {
    One(Arc<str>),
    Several,
}

impl Named {
    pub(super) fn one(&self) -> Option<&Arc<str>> {
        match self {
            Named::One(s) => Some(s),
            Named::Several => None,
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

    fn learn(&mut self, key: K, session: &str) {
        match self.current.get(&key) {
            Some(Named::One(s)) if &**s == session => return,
            Some(Named::Several) => return,
            _ => {}
        }
        let named = match self
            .current
            .remove(&key)
            .or_else(|| self.previous.remove(&key))
        {
            Some(Named::One(s)) if &*s == session => Named::One(s),
            Some(_) => Named::Several,
            None => Named::One(Arc::from(session)),
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

/// A trace's agent: its trace id and a digest of its agent's name (none: 0).
type AgentKey = ([u8; 16], u64);

fn agent_key(trace_id: &[u8], agent: Option<&str>) -> Option<AgentKey> {
    let trace = <[u8; 16]>::try_from(trace_id).ok()?;
    let agent = agent.map_or(0, |a| {
        let mut h = std::hash::DefaultHasher::new();
        a.hash(&mut h);
        h.finish() | 1
    });
    Some((trace, agent))
}

/// The sessions earlier exports named, by trace and agent and by parent span.
#[derive(Debug, Clone)]
pub struct SessionsSeen {
    agents: Generations<AgentKey>,
    under: Generations<SpanKey>,
}

impl Default for SessionsSeen {
    fn default() -> SessionsSeen {
        SessionsSeen::with_capacity(GENERATION)
    }
}

impl SessionsSeen {
    pub(super) fn with_capacity(capacity: usize) -> SessionsSeen {
        SessionsSeen {
            agents: Generations::new(capacity),
            under: Generations::new(capacity),
        }
    }

    /// A span of `trace_id` and `agent`, under `parent` (a key, unless it is a root),
    /// named `session`.
    pub(super) fn learn(
        &mut self,
        trace_id: &[u8],
        agent: Option<&str>,
        parent: Option<SpanKey>,
        session: &str,
    ) {
        if let Some(key) = agent_key(trace_id, agent) {
            self.agents.learn(key, session);
        }
        if let Some(parent) = parent {
            self.under.learn(parent, session);
        }
    }

    /// Spans under `parent` are in `session` (learnt from a span whose own session was
    /// its children's): not the trace's, which its named spans alone say.
    pub(super) fn learn_under(&mut self, parent: SpanKey, session: &str) {
        self.under.learn(parent, session);
    }

    /// What the children of span `key` named.
    pub(super) fn under(&self, key: &SpanKey) -> Option<&Named> {
        self.under.get(key)
    }

    /// The session `agent`'s spans of trace `trace_id` named, if exactly one.
    pub(super) fn agent(&self, trace_id: &[u8], agent: Option<&str>) -> Option<&Arc<str>> {
        let key = agent_key(trace_id, agent)?;
        self.agents.get(&key).and_then(Named::one)
    }

    /// Keys held, both maps, both generations.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.agents.len() + self.under.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_named_two_sessions_names_none() {
        let mut g = Generations::new(8);
        g.learn(1u8, "a");
        g.learn(1, "a");
        assert_eq!(g.get(&1), Some(&Named::One("a".into())));
        g.learn(1, "b");
        assert_eq!(g.get(&1), Some(&Named::Several));
        g.learn(1, "a");
        assert_eq!(g.get(&1), Some(&Named::Several), "several stays several");
    }

    #[test]
    fn the_oldest_keys_are_forgotten_first_and_the_rest_kept() {
        let mut g = Generations::new(4);
        for k in 0..5u32 {
            g.learn(k, "s");
        }
        // Keys 0 to 3 are the older generation now; 0 used again moves to the newer.
        g.learn(0, "s");
        for k in 5..8u32 {
            g.learn(k, "s");
        }
        assert!(g.len() <= 8);
        assert!(g.get(&0).is_some(), "used again, kept");
        assert!(g.get(&7).is_some());
        for k in 1..4u32 {
            assert!(g.get(&k).is_none(), "key {k} forgotten");
        }
        for k in 8..100u32 {
            g.learn(k, "s");
            assert!(g.len() <= 8, "bounded");
        }
    }
}
