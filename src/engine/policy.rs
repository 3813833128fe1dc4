//! What a policy is: the [`Levels`] of every detector (from [`crate::engine::levels`])
//! with each detector's own settings ([`Detectors`]).
//!
//! Guarantees: [`Policy::default`] is exactly the design's defaults (each detector states
//! its own, in its module under `src/engine/detectors/`); a policy is plain data, resolved once
//! per (tenant, agent, tool) and cached. Nothing here knows a detector by name.

use crate::engine::detectors::{DetectorKind, Detectors, DETECTOR_COUNT};
use crate::engine::levels::{Levels, Mode};

/// Every detector's levels and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Indexed by [`DetectorKind::index`].
    pub levels: [Levels; DETECTOR_COUNT],
    pub detectors: Detectors,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            levels: std::array::from_fn(|i| DetectorKind::ALL[i].default_levels()),
            detectors: Detectors::default(),
        }
    }
}

impl Policy {
    pub fn levels(&self, kind: DetectorKind) -> &Levels {
        &self.levels[kind.index()]
    }

    pub fn levels_mut(&mut self, kind: DetectorKind) -> &mut Levels {
        &mut self.levels[kind.index()]
    }

    /// Sets every detector's mode.
    pub fn set_mode(&mut self, mode: Mode) {
        for levels in &mut self.levels {
            levels.mode = mode;
        }
    }
}
