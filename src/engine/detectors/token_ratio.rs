//! `token_ratio`: output ÷ input tokens over the session, once it has used `min_tokens`.
//!
//! Runaway generation: a model writing far more than it reads (the same file dumped
//! again and again, an endless plan). Agents read much more than they write, so a ratio
//! of 50 is far outside normal work; it only warns. Judged on LLM calls, across runs.

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, LlmContext, Message, Reading, SessionView, Signal};
use crate::engine::levels::Levels;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRatio {
    /// The ratio is judged only past this many tokens.
    pub min_tokens: u64,
}

impl Default for TokenRatio {
    fn default() -> Self {
        TokenRatio { min_tokens: 10_000 }
    }
}

impl Detector for TokenRatio {
    const CLASS: Class = Class::Ceiling;
    type On<'a> = &'a LlmContext<'a>;
    type State = ();

    fn default_levels() -> Levels {
        Levels::new(Some(50.0), None, None)
    }

    fn evaluate(&self, levels: &Levels, st: &SessionView<'_, Self::State>, _: &LlmContext) -> Option<Signal> {
        let s = &st.stats;
        if s.input_tokens.saturating_add(s.output_tokens) < self.min_tokens {
            return None;
        }
        let ratio = s.output_tokens as f64 / s.input_tokens.max(1) as f64;
        Some(Signal::of(ratio, levels))
    }

    fn describe(&self, _: &SessionView<'_, Self::State>, _: &LlmContext, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("output/input token ratio {:.1} (limit {:.1})", r.value, r.threshold),
            "you are generating far more text than you read; stop and check whether the output is what was asked",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::engine::detectors::testing::*;
    use crate::engine::detectors::DetectorKind::TokenRatio;
    use crate::engine::levels::Level;

    #[test]
    fn waits_for_enough_tokens() {
        let evs = vec![
            llm(json!({"input_tokens": 10, "output_tokens": 5000})),
            llm(json!({"input_tokens": 10, "output_tokens": 6000})),
        ];
        assert_eq!(of(&evs, TokenRatio), vec![(1, Level::Warning)]);
    }

    #[test]
    fn a_ratio_under_50_is_normal() {
        let evs = vec![llm(json!({"input_tokens": 1000, "output_tokens": 49_000}))];
        assert!(of(&evs, TokenRatio).is_empty());
        let evs = vec![llm(json!({"input_tokens": 1000, "output_tokens": 50_000}))];
        assert_eq!(of(&evs, TokenRatio), vec![(0, Level::Warning)]);
    }
}
