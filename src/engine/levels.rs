//! What every detector's findings are measured against, whatever the detector: the
//! levels of a finding, the modes, and the thresholds every detector takes ([`Levels`]).
//!
//! Guarantees: plain data with no knowledge of any detector; the lowest layer of the
//! engine (detectors, state and policy all read it, it reads none of them).

use serde::{Deserialize, Serialize};

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

/// The thresholds and mode every detector takes (`warn_at`, `critical_at`,
/// `terminate_at`, each of which may be off, and `mode`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Levels {
    pub warn_at: Option<f64>,
    pub critical_at: Option<f64>,
    pub terminate_at: Option<f64>,
    pub mode: Mode,
    /// Nudge before kill: steps the episode must go on past its first finding before it
    /// may terminate (until then a termination is held as a critical warning).
    pub grace_steps: u32,
}

impl Levels {
    /// Thresholds in enforce mode.
    pub const fn new(
        warn_at: Option<f64>,
        critical_at: Option<f64>,
        terminate_at: Option<f64>,
    ) -> Levels {
        Levels {
            warn_at,
            critical_at,
            terminate_at,
            mode: Mode::Enforce,
            grace_steps: 0,
        }
    }

    /// A budget: warn at [`BUDGET_WARN_SHARE`] and go critical at
    /// [`BUDGET_CRITICAL_SHARE`] of the limit, terminate at the limit.
    pub fn budget(limit: f64) -> Levels {
        let (warn, critical) = Self::budget_warnings(Some(limit));
        Levels::new(warn, critical, Some(limit))
    }

    /// The warning and critical thresholds that go with a budget's limit.
    pub fn budget_warnings(limit: Option<f64>) -> (Option<f64>, Option<f64>) {
        (
            limit.map(|l| l * BUDGET_WARN_SHARE),
            limit.map(|l| l * BUDGET_CRITICAL_SHARE),
        )
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

    /// The lowest threshold that is on: below it, a detector's episode is over.
    #[inline]
    pub fn lowest_threshold(&self) -> Option<f64> {
        let min = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, None) | (None, x) => x,
        };
        min(min(self.warn_at, self.critical_at), self.terminate_at)
    }

    /// The thresholds that are on rise from warning to termination.
    pub fn rise(&self) -> bool {
        let set: Vec<f64> = [self.warn_at, self.critical_at, self.terminate_at]
            .into_iter()
            .flatten()
            .collect();
        set.windows(2).all(|w| w[0] <= w[1])
    }
}

/// Steps a loop detector's episode goes on past its first finding before it may
/// terminate: the hint crosses the bus and reaches the agent in its next model call (one
/// may already be under way), and the agent gets another to act on it.
pub const DEFAULT_GRACE_STEPS: u32 = 3;

/// Budgets warn at this share of their limit...
pub const BUDGET_WARN_SHARE: f64 = 0.8;
/// ...and are critical at this one (DESIGN §3: the 80 % / 90 % budget pattern).
pub const BUDGET_CRITICAL_SHARE: f64 = 0.9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_warn_at_80_and_90_percent() {
        let p = Levels::budget(10.0);
        assert_eq!(p.level_for(7.99), None);
        assert_eq!(p.level_for(8.0).map(|l| l.0), Some(Level::Warning));
        assert_eq!(p.level_for(9.0).map(|l| l.0), Some(Level::Critical));
        assert_eq!(p.level_for(10.0).map(|l| l.0), Some(Level::Terminate));
    }

    #[test]
    fn off_thresholds_are_skipped() {
        let p = Levels::new(Some(10.0), Some(20.0), None);
        assert_eq!(p.level_for(1000.0).map(|l| l.0), Some(Level::Critical));
        assert_eq!(p.level_for(9.0), None);
        assert_eq!(p.lowest_threshold(), Some(10.0));
    }

    #[test]
    fn thresholds_must_rise() {
        assert!(Levels::new(Some(3.0), None, Some(4.0)).rise());
        assert!(!Levels::new(Some(5.0), None, Some(4.0)).rise());
        assert!(Levels::new(None, None, None).rise());
    }
}
