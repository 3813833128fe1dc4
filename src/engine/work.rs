//! What judging an event needs besides its session, per engine: the configuration
//! resolved once (policies per tenant and agent, tool classes, tool overrides), cached,
//! and the buffers reused from event to event, so the hot path allocates nothing.

use super::*;

/// Caps on the resolution caches; past them they are cleared (they only save work).
const POLICY_CACHE_CAP: usize = 4096;
const CLASS_CACHE_CAP: usize = 16_384;

/// What judging an event needs besides its session: configuration resolved once, caches,
/// and the buffers reused from event to event (so the hot path allocates nothing).
pub(super) struct Work {
    pub(super) config: Arc<Config>,
    pub(super) fingerprinter: Fingerprinter,
    pub(super) prints: fingerprint::Scratch,
    pub(super) text: String,
    pub(super) chant: ChantScratch,
    /// `tool.action`, when a call has an `action` argument.
    pub(super) action_name: String,
    /// The detectors judged on LLM calls, tool calls and other events, in order.
    pub(super) order_llm: Vec<DetectorKind>,
    pub(super) order_tool: Vec<DetectorKind>,
    pub(super) order_other: Vec<DetectorKind>,
    pub(super) policies: FxHashMap<u64, Arc<Policy>>,
    /// Tool-override policies by (session policy key, tool or `tool.action` hash); `None`:
    /// no override applies.
    pub(super) tool_policies: FxHashMap<(u64, u64), Option<Arc<Policy>>>,
    pub(super) classes: FxHashMap<String, ToolClasses>,
}

pub(super) fn hash_id(s: &str) -> u64 {
    let mut h = FxHasher::default();
    s.hash(&mut h);
    h.finish()
}

pub(super) fn policy_key(tenant: Option<&str>, agent: Option<&str>) -> u64 {
    let mut h = FxHasher::default();
    tenant.hash(&mut h);
    agent.hash(&mut h);
    h.finish()
}

impl Work {
    pub(super) fn new(config: Arc<Config>) -> Work {
        Work {
            fingerprinter: Fingerprinter::new(&config.fingerprint),
            config,
            prints: fingerprint::Scratch::default(),
            text: String::new(),
            chant: ChantScratch::default(),
            action_name: String::new(),
            order_llm: DetectorKind::evaluation_order_for(On::LlmCalls),
            order_tool: DetectorKind::evaluation_order_for(On::ToolCalls),
            order_other: DetectorKind::evaluation_order_for(On::Any),
            policies: FxHashMap::default(),
            tool_policies: FxHashMap::default(),
            classes: FxHashMap::default(),
        }
    }

    /// The policy key and policy of a session opened by `event`.
    pub(super) fn policy_of(&mut self, event: &Event<'_>) -> (u64, Arc<Policy>) {
        // Resolved from the labels as the session keeps them, as every later resolution
        // (a relabelling, a restore) is: a long label's policy may not change with them.
        let tenant = event.tenant.as_deref().map(kept_label);
        let agent = event.agent_id.as_deref().map(kept_label);
        let (tenant, agent) = (tenant.as_deref(), agent.as_deref());
        let key = policy_key(tenant, agent);
        (key, self.policy(key, tenant, agent))
    }

    pub(super) fn policy(
        &mut self,
        key: u64,
        tenant: Option<&str>,
        agent: Option<&str>,
    ) -> Arc<Policy> {
        if let Some(p) = self.policies.get(&key) {
            return p.clone();
        }
        if self.policies.len() >= POLICY_CACHE_CAP {
            self.policies.clear();
            self.tool_policies.clear();
        }
        let p = Arc::new(self.config.policy_for(tenant, agent));
        self.policies.insert(key, p.clone());
        p
    }

    pub(super) fn classify(&mut self, tool: &str, action_name: Option<&str>) -> ToolClasses {
        let key = action_name.unwrap_or(tool);
        if key.len() > MAX_SHOWN_TOOL_NAME {
            // Not kept: a cache of names as long as events (a megabyte each) is not bounded
            // by its count. No real tool is named so; classified each time.
            return self.config.tools.classify(tool, action_name);
        }
        if let Some(c) = self.classes.get(key) {
            return *c;
        }
        if self.classes.len() >= CLASS_CACHE_CAP {
            self.classes.clear();
        }
        let c = self.config.tools.classify(tool, action_name);
        self.classes.insert(key.to_string(), c);
        c
    }

    /// The policy of one tool call when a tool override applies to it.
    pub(super) fn tool_policy(
        &mut self,
        slot: &Slot,
        tool: &str,
        action_name: Option<&str>,
    ) -> Option<Arc<Policy>> {
        let key = (slot.policy_key, hash_id(action_name.unwrap_or(tool)));
        if let Some(p) = self.tool_policies.get(&key) {
            return p.clone();
        }
        let st = &slot.state;
        let p = self
            .config
            .policy_for_tool(
                &slot.policy,
                st.tenant.as_deref(),
                st.agent_id.as_deref(),
                tool,
                action_name,
            )
            .map(Arc::new);
        if self.tool_policies.len() >= POLICY_CACHE_CAP {
            self.tool_policies.clear();
        }
        self.tool_policies.insert(key, p.clone());
        p
    }

    /// The features of an LLM call's text: its sketch and opening (turns only) and any
    /// chant.
    pub(super) fn text_features(
        &mut self,
        call: &LlmCall<'_>,
        is_turn: bool,
        policy: &Policy,
    ) -> (Option<TextSketch>, Option<u64>, Option<Chant>, bool) {
        let Some(content) = call
            .text
            .as_ref()
            .and_then(|t| json::string_content(t.as_str()))
            .filter(|c| !c.is_empty())
        else {
            return (None, None, None, false);
        };
        self.text.clear();
        json::unescape_into(content, &mut self.text);
        let rt = &policy.detectors.repetitive_text;
        let rule = ChantRule {
            chunk: rt.chunk_chars.get(),
            min_repeats: rt.min_repeats.get() as u32,
            max_spacing: rt.max_avg_spacing_chars,
        };
        let (sketch, chant) = turn_features(&self.text, is_turn, rule, &mut self.chant);
        self.chant.trim();
        let words = policy.detectors.similar_turns.opening_words.get();
        let opening = if is_turn {
            opening(&self.text, words)
        } else {
            None
        };
        (sketch, opening, chant, true)
    }

    /// A tool call's fingerprints and classes, and its `tool.action` name if any.
    pub(super) fn tool_observation(
        &mut self,
        call: &ToolCall<'_>,
        event_id: &str,
    ) -> (ToolObservation, bool) {
        let action = self
            .fingerprinter
            .action(&call.tool, call.args.as_ref(), &mut self.prints);
        let has_action = action.action_arg.is_some();
        if let Some(a) = &action.action_arg {
            self.action_name.clear();
            self.action_name.push_str(&call.tool);
            self.action_name.push('.');
            self.action_name.push_str(a);
        }
        let name = std::mem::take(&mut self.action_name);
        let classes = self.classify(&call.tool, has_action.then_some(name.as_str()));
        self.action_name = name;
        // A call that says nothing of its result (neither `result` nor `result_digest`)
        // is not guessed to have returned what the last one did: its result is its own,
        // a digest of the event's id (unique in a session: an exact duplicate is dropped
        // before), as the OTLP ingest names an uncaptured one by its span id. Hex of a
        // hash, not the id itself: ids that differ only in a number (`call-7`, `call-8`)
        // would read alike to the comparisons that read numbers as any number. Counts,
        // ceilings and error streaks still judge it.
        let unknown;
        let given = match (&call.result, &call.result_digest) {
            (None, None) => {
                unknown = format!("{:016x}", hash_id(event_id));
                Some(unknown.as_str())
            }
            (_, digest) => digest.as_deref(),
        };
        let result = self
            .fingerprinter
            .result(call.result.as_ref(), given, &mut self.prints);
        let unknown_tool = call.error_kind.as_deref() == Some("unknown_tool");
        let is_error = call.is_error || unknown_tool;
        let wordless = !result.has_words;
        // A tool that waits by its name needs no reading of its arguments.
        let sleeps = if !classes.wait && self.config.tools.has_waits() {
            fingerprint::sleeps(call.args.as_ref())
        } else {
            None
        };
        let wait = classes.wait || sleeps == Some(fingerprint::Sleeps::Only);
        // A read that blocked for its whole timeout (a serial port, a queue) is a poll
        // by what it did, whatever its name. A failure is judged as one.
        let timed_out_read = !is_error
            && !classes.poll
            && !classes.write
            && !wait
            && fingerprint::waited_out_its_timeout(call.args.as_ref(), call.duration_ms);
        let reads_pending = result.pending && !is_error;
        let obs = ToolObservation {
            action: action.digest.short(),
            result: result.digest.short(),
            shape: result.shape,
            is_error,
            error_text: is_error && !wordless,
            wordless,
            unknown_tool,
            // A wait is a poll: waiting again is what waiting is.
            poll: classes.poll || wait || reads_pending || timed_out_read,
            wait,
            sleeps_first: !wait && sleeps == Some(fingerprint::Sleeps::First),
            after_wait: false,
            reads_pending,
            waiting: !is_error && result.status_pending,
            poll_class: classes.poll || classes.wait || timed_out_read,
            checks_after_wait: false,
            // A failure that says it is passing (a 503, a rate limit; not a timeout) is
            // retried as a `retry_safe` tool's: the ceilings and `error_streak` still end
            // a retry that never gets through.
            retry_safe: classes.retry_safe
                || (is_error
                    && fingerprint::reads_transient(
                        call.error_kind.as_deref(),
                        call.result.as_ref(),
                    )),
            write: classes.write,
            content: if wordless {
                ContentSample::default()
            } else {
                self.prints.content_sample()
            },
        };
        (obs, has_action)
    }
}
