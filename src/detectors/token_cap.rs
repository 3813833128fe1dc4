//! `token_cap`: a ceiling on the tokens a session uses (input plus output, all runs).
//!
//! Catches a session whose context keeps growing or that keeps calling the model long
//! after it should have stopped; the token count is what the session costs where no
//! `cost_usd` is sent. Default 2,000,000 tokens (warnings at 80 % and 90 %).

use serde::{Deserialize, Serialize};

use super::{Class, Detector, Evidence, Input, Message, Reading, Signal};
use crate::policy::Levels;
use crate::state::SessionState;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCap {}

impl Detector for TokenCap {
    const CLASS: Class = Class::Budget;
    type On<'a> = Input<'a>;

    fn default_levels() -> Levels {
        Levels::budget(2_000_000.0)
    }

    fn evaluate(&self, levels: &Levels, state: &SessionState, _: Input<'_>) -> Option<Signal> {
        let s = &state.stats;
        Some(Signal::of(
            s.input_tokens.saturating_add(s.output_tokens) as f64,
            levels,
        ))
    }

    fn describe(&self, _: &SessionState, _: Input<'_>, r: Reading, _: &mut Evidence) -> Message {
        Message::new(
            format!("{} tokens used in the session (limit {})", r.count(), r.limit()),
            "this session has used most of its token budget; finish with what you have",
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::detectors::testing::*;
    use crate::detectors::DetectorKind::TokenCap;
    use crate::policy::Level;

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
}
