//! The detector catalogue and the policy that tunes it: detector names, finding levels,
//! modes, and every default threshold of DESIGN §3 in one table.
//!
//! Guarantees: [`DetectorKind::ALL`] is the complete list, in a fixed order that indexes
//! per-detector arrays in session state; [`Policy::default`] is exactly the design's
//! defaults; a policy is plain data, resolved once per (tenant, agent, tool) and cached.

use serde::{Deserialize, Serialize};

macro_rules! detectors {
    ($($variant:ident => $name:literal),+ $(,)?) => {
        /// Every detector of DESIGN §3.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum DetectorKind { $($variant),+ }

        impl DetectorKind {
            pub const ALL: &'static [DetectorKind] = &[$(DetectorKind::$variant),+];

            pub fn name(self) -> &'static str {
                match self { $(DetectorKind::$variant => $name),+ }
            }

            pub fn from_name(name: &str) -> Option<DetectorKind> {
                match name { $($name => Some(DetectorKind::$variant),)+ _ => None }
            }
        }
    };
}

detectors! {
    TurnCap => "turn_cap",
    ToolCallCap => "tool_call_cap",
    TokenCap => "token_cap",
    CostCap => "cost_cap",
    WallClockCap => "wall_clock_cap",
    Repeat => "repeat",
    GenericRepeat => "generic_repeat",
    PollNoProgress => "poll_no_progress",
    PingPong => "ping_pong",
    Cycle => "cycle",
    ErrorRepeat => "error_repeat",
    UnknownTool => "unknown_tool",
    ErrorStreak => "error_streak",
    CircuitBreaker => "circuit_breaker",
    Stall => "stall",
    SimilarTurns => "similar_turns",
    RepetitiveText => "repetitive_text",
    LowNovelty => "low_novelty",
    NoProgress => "no_progress",
    NoNewInformation => "no_new_information",
    CompactionLoop => "compaction_loop",
    WriteNoEffect => "write_no_effect",
    TokenRatio => "token_ratio",
    DepthCap => "depth_cap",
}

/// Number of detectors; sizes per-detector arrays.
pub const DETECTOR_COUNT: usize = DetectorKind::ALL.len();

impl DetectorKind {
    pub fn index(self) -> usize {
        self as usize
    }

    /// Ceilings count across `run_id` changes; loop detectors reset with the run.
    pub fn is_ceiling(self) -> bool {
        matches!(
            self,
            DetectorKind::TurnCap
                | DetectorKind::ToolCallCap
                | DetectorKind::TokenCap
                | DetectorKind::CostCap
                | DetectorKind::WallClockCap
                | DetectorKind::TokenRatio
                | DetectorKind::DepthCap
        )
    }

    /// The five budget ceilings, whose warnings default to 80 % / 90 % of `terminate_at`.
    pub fn is_cap(self) -> bool {
        matches!(
            self,
            DetectorKind::TurnCap
                | DetectorKind::ToolCallCap
                | DetectorKind::TokenCap
                | DetectorKind::CostCap
                | DetectorKind::WallClockCap
        )
    }

    /// Detectors judged on a tool call, whose thresholds can be set per tool.
    pub fn is_per_tool(self) -> bool {
        matches!(
            self,
            DetectorKind::Repeat
                | DetectorKind::GenericRepeat
                | DetectorKind::PollNoProgress
                | DetectorKind::ErrorRepeat
                | DetectorKind::WriteNoEffect
        )
    }

    /// The detector-specific settings it accepts, besides the common ones.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            DetectorKind::Repeat => &["window_terminate_at"],
            DetectorKind::CircuitBreaker => &["window_calls"],
            DetectorKind::SimilarTurns => &["min_similarity"],
            DetectorKind::RepetitiveText => {
                &["chunk_chars", "min_repeats", "max_avg_spacing_chars"]
            }
            DetectorKind::LowNovelty => &["last_calls", "min_ratio"],
            DetectorKind::TokenRatio => &["min_tokens"],
            _ => &[],
        }
    }
}

impl std::fmt::Display for DetectorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Warning,
    Critical,
    Terminate,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Warning, Level::Critical, Level::Terminate];

    pub fn name(self) -> &'static str {
        match self {
            Level::Warning => "warning",
            Level::Critical => "critical",
            Level::Terminate => "terminate",
        }
    }

    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// What happens to a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Publish warnings and terminations.
    #[default]
    Enforce,
    /// Publish, but downgrade terminations to `critical` warnings.
    Warn,
    /// Publish nothing; metrics, logs and `replay` say what would have been.
    Shadow,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Shadow => "shadow",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "enforce" => Some(Mode::Enforce),
            "warn" => Some(Mode::Warn),
            "shadow" => Some(Mode::Shadow),
            _ => None,
        }
    }
}

/// Thresholds and mode of one detector, with its specific settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorPolicy {
    pub warn_at: Option<f64>,
    pub critical_at: Option<f64>,
    pub terminate_at: Option<f64>,
    pub mode: Mode,
    pub params: Params,
}

/// Detector-specific settings (each detector reads only its own; see `DetectorKind::params`).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `repeat`: same action and result this many times in the window terminates.
    pub window_terminate_at: Option<f64>,
    /// `circuit_breaker`: how many recent calls it looks at (at most 64).
    pub window_calls: usize,
    /// `similar_turns`: Jaccard similarity at or above which two turns are "the same".
    pub min_similarity: f64,
    /// `repetitive_text`: the repeated window's length.
    pub chunk_chars: usize,
    /// `repetitive_text`: how often the window must recur.
    pub min_repeats: u32,
    /// `repetitive_text`: repeats must be this close on average.
    pub max_avg_spacing_chars: usize,
    /// `low_novelty`: how many recent calls it looks at.
    pub last_calls: usize,
    /// `low_novelty`: distinct share below which the calls are "not novel".
    pub min_ratio: f64,
    /// `token_ratio`: the ratio is judged only past this many tokens.
    pub min_tokens: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            window_terminate_at: None,
            window_calls: 64,
            min_similarity: 0.85,
            chunk_chars: 50,
            min_repeats: 10,
            max_avg_spacing_chars: 250,
            last_calls: 8,
            min_ratio: 0.34,
            min_tokens: 10_000,
        }
    }
}

/// The most calls the circuit breaker can look back over (one bit per call in state).
pub const MAX_BREAKER_WINDOW: usize = 64;
/// The tool-call window of loop detectors (DESIGN §3: the last 30 calls of the run).
pub const WINDOW_CALLS: usize = 30;
/// How many previous turns `similar_turns` compares with.
pub const SIMILAR_TURNS_LOOKBACK: usize = 5;

fn pct(cap: f64, p: f64) -> Option<f64> {
    Some(cap * p)
}

impl DetectorPolicy {
    fn t(warn: Option<f64>, critical: Option<f64>, terminate: Option<f64>) -> DetectorPolicy {
        DetectorPolicy {
            warn_at: warn,
            critical_at: critical,
            terminate_at: terminate,
            mode: Mode::Enforce,
            params: Params::default(),
        }
    }

    fn cap(limit: f64) -> DetectorPolicy {
        DetectorPolicy::t(pct(limit, 0.8), pct(limit, 0.9), Some(limit))
    }

    /// The design's default for `kind`.
    pub fn default_for(kind: DetectorKind) -> DetectorPolicy {
        use DetectorKind::*;
        let n = |v: f64| Some(v);
        match kind {
            TurnCap => Self::cap(200.0),
            ToolCallCap => Self::cap(1000.0),
            TokenCap => Self::cap(2_000_000.0),
            CostCap => Self::cap(10.0),
            WallClockCap => Self::cap(4.0 * 3600.0),
            Repeat => {
                let mut p = Self::t(n(3.0), None, n(4.0));
                p.params.window_terminate_at = n(8.0);
                p
            }
            GenericRepeat => Self::t(n(10.0), n(20.0), None),
            PollNoProgress => Self::t(n(10.0), None, n(20.0)),
            PingPong => Self::t(n(6.0), None, n(10.0)),
            Cycle => Self::t(n(4.0), None, n(6.0)),
            ErrorRepeat => Self::t(n(2.0), None, n(3.0)),
            UnknownTool => Self::t(n(3.0), None, n(10.0)),
            ErrorStreak => Self::t(n(5.0), n(10.0), None),
            CircuitBreaker => Self::t(None, None, n(30.0)),
            Stall => Self::t(n(3.0), None, n(5.0)),
            SimilarTurns => Self::t(n(3.0), None, n(5.0)),
            RepetitiveText => Self::t(n(1.0), None, None),
            LowNovelty => Self::t(n(1.0), None, None),
            NoProgress => Self::t(n(3.0), None, n(6.0)),
            NoNewInformation => Self::t(n(2.0), n(3.0), None),
            CompactionLoop => Self::t(n(3.0), None, n(10.0)),
            WriteNoEffect => Self::t(n(3.0), None, None),
            TokenRatio => Self::t(n(50.0), None, None),
            DepthCap => Self::t(n(4.0), None, n(5.0)),
        }
    }

    /// The highest level `value` reaches, with the threshold it crossed.
    pub fn level_for(&self, value: f64) -> Option<(Level, f64)> {
        let reached = |t: Option<f64>| t.filter(|t| value >= *t - 1e-9);
        if let Some(t) = reached(self.terminate_at) {
            return Some((Level::Terminate, t));
        }
        if let Some(t) = reached(self.critical_at) {
            return Some((Level::Critical, t));
        }
        reached(self.warn_at).map(|t| (Level::Warning, t))
    }

    /// The next threshold above `value`, for evidence ("3 of 4").
    pub fn lowest_threshold(&self) -> Option<f64> {
        [self.warn_at, self.critical_at, self.terminate_at]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }
}

/// The thresholds of every detector.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub detectors: Vec<DetectorPolicy>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            detectors: DetectorKind::ALL
                .iter()
                .map(|k| DetectorPolicy::default_for(*k))
                .collect(),
        }
    }
}

impl Policy {
    pub fn get(&self, kind: DetectorKind) -> &DetectorPolicy {
        &self.detectors[kind.index()]
    }

    pub fn get_mut(&mut self, kind: DetectorKind) -> &mut DetectorPolicy {
        &mut self.detectors[kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_index_the_table() {
        for (i, k) in DetectorKind::ALL.iter().enumerate() {
            assert_eq!(DetectorKind::from_name(k.name()), Some(*k));
            assert_eq!(k.index(), i);
        }
        assert_eq!(DETECTOR_COUNT, 24);
    }

    #[test]
    fn caps_default_to_80_and_90_percent() {
        let p = DetectorPolicy::default_for(DetectorKind::CostCap);
        assert_eq!(p.level_for(7.99), None);
        assert_eq!(p.level_for(8.0).map(|l| l.0), Some(Level::Warning));
        assert_eq!(p.level_for(9.0).map(|l| l.0), Some(Level::Critical));
        assert_eq!(p.level_for(10.0).map(|l| l.0), Some(Level::Terminate));
    }

    #[test]
    fn off_thresholds_are_skipped() {
        let p = DetectorPolicy::default_for(DetectorKind::GenericRepeat);
        assert_eq!(p.level_for(1000.0).map(|l| l.0), Some(Level::Critical));
    }
}
