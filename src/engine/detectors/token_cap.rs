//! `token_cap`: a ceiling on the tokens a session pays for, over all its runs: uncached
//! input plus output, plus cache reads weighted by `cache_read_weight` (default 0).
//!
//! Catches a session that keeps calling the model long after it should have stopped,
//! where no `cost_usd` is sent. Cached input is left out by default because it is billed
//! at a fraction of the price and grows with every turn of a long session whatever the
//! session does: counted in full, it ends long productive sessions (84 % of a Gemini
//! coding agent's input is cache reads). `input_tokens` is all the input of a call,
//! cached included, and `cache_read_tokens` the cached part. Default 2,000,000 tokens
//! (warnings at 80 % and 90 %): several times what the longest productive sessions of
//! today's coding agents pay for.

use serde::{Deserialize, Serialize};

use super::settings::Fraction;
use super::{Class, Detector, Evidence, Input, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;
use crate::engine::trajectory::Counters;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCap {
    /// How much a cached input token counts (0: not at all; 1: as an uncached one).
    pub cache_read_weight: Fraction,
}

impl Default for TokenCap {
    fn default() -> Self {
        TokenCap {
            cache_read_weight: Fraction::new(0.0),
        }
    }
}

impl TokenCap {
    /// The tokens the session has paid for, as this detector counts them.
    pub fn paid_tokens(&self, s: &Counters) -> f64 {
        let cached = s.cache_read_tokens.min(s.input_tokens);
        // Saturating: the counters saturate (a producer's `-1` read as 2^64 − 1 must not
        // wrap the sum to a small number, nor panic).
        let uncached = (s.input_tokens - cached).saturating_add(s.output_tokens);
        uncached as f64 + cached as f64 * self.cache_read_weight.get()
    }
}

impl Detector for TokenCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::budget(2_000_000.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionView<'_, Self::State>, _: Input<'_>) -> Option<Signal> {
        Some(Signal::of(self.paid_tokens(state.stats).floor(), levels))
    }

    fn describe(&self, st: &SessionView<'_, Self::State>, _: Input<'_>, r: Reading, ev: &mut Evidence) -> Message {
        ev.insert("cache_read_tokens".into(), st.stats.cache_read_tokens.into());
        Message::new(
            format!("{} tokens paid for in the session (limit {})", r.count(), r.limit()),
            "this session has used most of its token budget; finish with what you have",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::TokenCap;
    use crate::engine::levels::Level;
    use crate::engine::trajectory::Counters;

    #[test]
    fn counts_input_and_output_tokens() {
        let evs: Vec<Value> = (0..3)
            .map(|_| llm(json!({"input_tokens": 900_000, "output_tokens": 0})))
            .collect();
        assert_eq!(
            of(&evs, TokenCap),
            vec![(1, Level::Critical), (2, Level::Terminate)],
            "1.8M tokens is 90 %"
        );
        let evs = vec![llm(json!({"input_tokens": 1_599_999, "output_tokens": 0}))];
        assert!(of(&evs, TokenCap).is_empty(), "just under 80 %");
        let evs = vec![llm(json!({"input_tokens": 1_599_999, "output_tokens": 1}))];
        assert_eq!(of(&evs, TokenCap), vec![(0, Level::Warning)]);
    }

    #[test]
    fn tokens_past_the_counters_range_terminate_without_a_panic() {
        // Input tokens of 2^64 − 1 (a producer's -1 read unsigned), then any output: the
        // sum saturates (it wrapped to a small number, or panicked in a debug build).
        let evs = vec![llm(json!({"input_tokens": u64::MAX, "output_tokens": 0}))];
        assert_eq!(of(&evs, TokenCap), vec![(0, Level::Terminate)]);
        let counters = Counters {
            input_tokens: u64::MAX,
            output_tokens: 10,
            ..Counters::default()
        };
        let paid = super::TokenCap::default().paid_tokens(&counters);
        assert!(paid >= u64::MAX as f64, "{paid}");
    }

    #[test]
    fn cache_reads_count_only_by_their_weight() {
        // 10 calls of 1M input, 900k of it cached: 100k paid each.
        let evs: Vec<Value> = (0..20)
            .map(|_| llm(json!({"input_tokens": 1_000_000, "cache_read_tokens": 900_000, "output_tokens": 0})))
            .collect();
        assert_eq!(of(&evs, TokenCap).first(), Some(&(15, Level::Warning)));
        // Counted at a tenth, a cached token adds 90k a call: 190k a call in all.
        let cfg = "[detectors.token_cap]\ncache_read_weight = 0.1\n";
        assert_eq!(
            of_with(cfg, &evs, TokenCap),
            vec![(8, Level::Warning), (9, Level::Critical), (10, Level::Terminate)]
        );
    }
}
