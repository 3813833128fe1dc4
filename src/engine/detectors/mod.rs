//! The detectors of DESIGN §3, one module each, and the one list that makes them a closed
//! set: `detectors!` below generates [`DetectorKind`] (names, index, class), the
//! [`Detectors`] settings struct with one typed field per detector, and the dispatch,
//! whose match arms only delegate to the detector's own [`Detector`] implementation.
//!
//! A detector is pure: (its settings, its levels, its session as it sees it after the
//! event, the event's view) in, a [`Signal`] out; and, only when a finding is emitted,
//! its reason, hint and evidence. It reads the trajectory every detector shares
//! ([`crate::engine::trajectory`]) and keeps counters of its own ([`Detector::State`],
//! updated by [`Detector::observe`] on every event): the session's stored layout is
//! derived from those declarations. No I/O, no clock, no randomness: the same inputs
//! give the same signal. A detector that is not judged on an event (its view is `None`)
//! leaves its episode alone. Levels, episodes, modes and the termination tombstone are
//! the engine's.
//!
//! Adding a detector: `docs/DEVELOPMENT.md`, "Adding a detector".

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::levels::Levels;
use crate::engine::state::Encode;
use crate::engine::trajectory::RunState;

mod judging;
pub mod settings;
#[cfg(test)]
pub(crate) mod testing;

pub use judging::{
    fp_hex, num, recent_calls, Context, Description, Evidence, Input, LlmContext, Message, On,
    Reading, SessionView, Signal, ToolContext, View,
};

/// How a detector counts: what resets it and where its settings can be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A session budget: counts across runs; setting only `terminate_at` moves the
    /// warnings to 80 % / 90 % of it.
    Budget,
    /// Another session-wide ceiling: counts across runs.
    Ceiling,
    /// A loop of the current run: resets when `run_id` changes.
    Loop,
    /// A loop judged on one tool call: resets with the run, and its settings can also be
    /// set per tool (`[[overrides]] tool = …`).
    ToolLoop,
}

impl Class {
    /// Loop detectors nudge before they kill; ceilings warn at their own thresholds and
    /// stop at the limit.
    pub fn default_grace_steps(self) -> u32 {
        match self {
            Class::Loop | Class::ToolLoop => crate::engine::levels::DEFAULT_GRACE_STEPS,
            Class::Budget | Class::Ceiling => 0,
        }
    }
}

/// One detector: its settings are the implementing type (serde reads and prints them;
/// `deny_unknown_fields`, validating value types from [`settings`]), and it judges one
/// kind of event.
pub trait Detector:
    Default + Clone + PartialEq + fmt::Debug + Serialize + DeserializeOwned
{
    const CLASS: Class;

    /// The events it is judged on: [`Input`] (any), `&LlmContext` or `&ToolContext`.
    type On<'a>: View<'a>;

    /// The counters it keeps beside the shared trajectory (`()`: none). They are part of
    /// the stored session state, in the order of the list below, so a change to them
    /// is a change of the state format (`state::layout_tests` fails until it is one);
    /// they reset with the run, so budgets and ceilings keep none (a test holds it).
    /// They are written by [`Encode`] (postcard's bytes, without serde's per-byte path).
    type State: Default + Clone + PartialEq + fmt::Debug + Serialize + DeserializeOwned + Encode;

    /// Its default `warn_at`, `critical_at` and `terminate_at`.
    fn default_levels() -> Levels;

    /// Updates its counters from an event, once the trajectory (`run`) has taken it in
    /// and before any detector is judged on it; every event, whatever the detector is
    /// judged on. Pure like the rest.
    fn observe(&self, own: &mut Self::State, run: &RunState, input: &Input<'_>) {
        let _ = (own, run, input);
    }

    /// Its reading of the session after the event.
    fn evaluate(
        &self,
        levels: &Levels,
        session: &SessionView<'_, Self::State>,
        on: Self::On<'_>,
    ) -> Option<Signal>;

    /// The reason, hint and extra evidence of a finding (cold path: only on emission).
    fn describe(
        &self,
        session: &SessionView<'_, Self::State>,
        on: Self::On<'_>,
        reading: Reading,
        evidence: &mut Evidence,
    ) -> Message;
}

/// A detector setting that could not be read: its key inside the detector's table, and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    pub key: String,
    pub message: String,
}

#[inline]
fn evaluate_one<'a, D: Detector>(
    detector: &D,
    levels: &Levels,
    session: &SessionView<'_, D::State>,
    input: &Input<'a>,
) -> Option<Signal> {
    detector.evaluate(levels, session, <D::On<'a> as View<'a>>::view(input)?)
}

fn describe_one<'a, D: Detector>(
    detector: &D,
    session: &SessionView<'_, D::State>,
    input: &Input<'a>,
    signal: &Signal,
    threshold: f64,
) -> Description {
    let on = <D::On<'a> as View<'a>>::view(input)
        .expect("a finding is described on the event that raised it");
    let mut evidence = Evidence::new();
    evidence.insert("value".into(), num(signal.value));
    evidence.insert("threshold".into(), num(threshold));
    let reading = Reading {
        value: signal.value,
        threshold,
    };
    let message = detector.describe(session, on, reading, &mut evidence);
    Description {
        reason: message.reason,
        hint: message.hint,
        evidence,
    }
}

fn settings_one<D: Detector>(detector: &D) -> toml::Table {
    match toml::Value::try_from(detector) {
        Ok(toml::Value::Table(t)) => t,
        other => unreachable!("detector settings are a struct, got {other:?}"),
    }
}

/// Reads `overlay` on top of `current` through the detector's own type. Each key is
/// tried alone first, so that every bad key is reported, not only the first.
fn configure_one<D: Detector>(
    current: &mut D,
    overlay: &toml::Table,
) -> Result<(), Vec<SettingError>> {
    if overlay.is_empty() {
        return Ok(());
    }
    let base = settings_one(current);
    let read = |keys: &mut dyn Iterator<Item = (&String, &toml::Value)>| {
        let mut table = base.clone();
        table.extend(keys.map(|(k, v)| (k.clone(), v.clone())));
        serde_path_to_error::deserialize::<_, D>(toml::Value::Table(table)).map_err(|e| {
            let message = if base.is_empty() {
                "unknown key: this detector takes mode, warn_at, critical_at and terminate_at only"
                    .to_string()
            } else {
                e.inner().message().to_string()
            };
            SettingError {
                key: e.path().to_string(),
                message,
            }
        })
    };
    let errors: Vec<SettingError> = overlay
        .iter()
        .filter_map(|kv| read(&mut std::iter::once(kv)).err())
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    *current = read(&mut overlay.iter()).map_err(|e| vec![e])?;
    Ok(())
}

macro_rules! detectors {
    ($($module:ident: $detector:ident,)+) => {
        $(
            pub mod $module;
            pub use $module::$detector;
        )+

        /// Every detector, in a fixed order: its position indexes per-detector arrays in
        /// the stored session state, so new detectors go at the end.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum DetectorKind { $($detector),+ }

        impl DetectorKind {
            pub const ALL: &'static [DetectorKind] = &[$(DetectorKind::$detector),+];

            /// Its name in configuration and outputs (the module's name).
            pub fn name(self) -> &'static str {
                match self { $(DetectorKind::$detector => stringify!($module)),+ }
            }

            pub fn from_name(name: &str) -> Option<DetectorKind> {
                match name { $(stringify!($module) => Some(DetectorKind::$detector),)+ _ => None }
            }

            pub fn class(self) -> Class {
                match self { $(DetectorKind::$detector => <$detector as Detector>::CLASS),+ }
            }

            /// The events it is judged on.
            pub fn judged_on(self) -> On {
                match self {
                    $(DetectorKind::$detector => <<$detector as Detector>::On<'static> as View<'static>>::ON),+
                }
            }

            pub fn default_levels(self) -> Levels {
                let levels = match self { $(DetectorKind::$detector => <$detector as Detector>::default_levels()),+ };
                Levels { grace_steps: self.class().default_grace_steps(), ..levels }
            }
        }

        /// Every detector's own counters ([`Detector::State`]), one field each, in the
        /// list's order: part of the stored session state.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct DetectorStates { $(pub $module: <$detector as Detector>::State),+ }

        /// Each detector's counters in the list's order, as the derived `Serialize` writes them.
        impl Encode for DetectorStates {
            fn encode(&self, out: &mut Vec<u8>) {
                $(self.$module.encode(out);)+
            }
        }

        /// Every detector's own settings, one typed field each.
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct Detectors { $(pub $module: $detector),+ }

        impl Detectors {
            /// Every detector's counters updated from one event.
            #[inline]
            pub fn observe(&self, states: &mut DetectorStates, run: &RunState, input: &Input<'_>) {
                $(self.$module.observe(&mut states.$module, run, input);)+
            }

            /// Judges one detector on one event (`session`: as `kind` sees it, every
            /// detector's counters narrowed to its own here).
            #[inline]
            pub fn evaluate(
                &self,
                kind: DetectorKind,
                levels: &Levels,
                session: SessionView<'_, DetectorStates>,
                input: &Input<'_>,
            ) -> Option<Signal> {
                match kind { $(DetectorKind::$detector => evaluate_one(&self.$module, levels, &session.narrow(&session.own.$module), input)),+ }
            }

            /// Describes a finding of `kind` on the event it was found on.
            pub fn describe(
                &self,
                kind: DetectorKind,
                session: SessionView<'_, DetectorStates>,
                input: &Input<'_>,
                signal: &Signal,
                threshold: f64,
            ) -> Description {
                match kind { $(DetectorKind::$detector => describe_one(&self.$module, &session.narrow(&session.own.$module), input, signal, threshold)),+ }
            }

            /// Reads a table of settings on top of the current ones.
            pub fn configure(
                &mut self,
                kind: DetectorKind,
                overlay: &toml::Table,
            ) -> Result<(), Vec<SettingError>> {
                match kind { $(DetectorKind::$detector => configure_one(&mut self.$module, overlay)),+ }
            }

            /// The settings in force, as `check-config` prints them.
            pub fn settings(&self, kind: DetectorKind) -> toml::Table {
                match kind { $(DetectorKind::$detector => settings_one(&self.$module)),+ }
            }
        }
    };
}

// The list. One line per detector: `module: Type,` (the module's name is the detector's
// name). Append new detectors at the end.
detectors! {
    turn_cap: TurnCap,
    tool_call_cap: ToolCallCap,
    token_cap: TokenCap,
    cost_cap: CostCap,
    wall_clock_cap: WallClockCap,
    repeat: Repeat,
    generic_repeat: GenericRepeat,
    poll_no_progress: PollNoProgress,
    ping_pong: PingPong,
    cycle: Cycle,
    error_repeat: ErrorRepeat,
    unknown_tool: UnknownTool,
    error_streak: ErrorStreak,
    circuit_breaker: CircuitBreaker,
    stall: Stall,
    similar_turns: SimilarTurns,
    repetitive_text: RepetitiveText,
    low_novelty: LowNovelty,
    no_progress: NoProgress,
    no_new_information: NoNewInformation,
    compaction_loop: CompactionLoop,
    write_no_effect: WriteNoEffect,
    token_ratio: TokenRatio,
    depth_cap: DepthCap,
    same_error: SameError,
}

/// Number of detectors; sizes per-detector arrays.
pub const DETECTOR_COUNT: usize = DetectorKind::ALL.len();

impl DetectorKind {
    pub fn index(self) -> usize {
        self as usize
    }

    /// Ceilings count across `run_id` changes; loop detectors reset with the run.
    pub fn is_ceiling(self) -> bool {
        matches!(self.class(), Class::Budget | Class::Ceiling)
    }

    /// Detectors judged on a tool call, whose thresholds can be set per tool.
    pub fn is_per_tool(self) -> bool {
        self.class() == Class::ToolLoop
    }

    /// Detectors in the order they are judged: loop detectors before ceilings, so that
    /// when several would terminate on one event the most specific names the stop reason.
    pub fn evaluation_order() -> Vec<DetectorKind> {
        let (ceilings, loops): (Vec<DetectorKind>, Vec<DetectorKind>) =
            DetectorKind::ALL.iter().partition(|k| k.is_ceiling());
        loops.into_iter().chain(ceilings).collect()
    }

    /// [`DetectorKind::evaluation_order`] of the detectors judged on an event of kind
    /// `event` (the others would not be judged on it anyway).
    pub fn evaluation_order_for(event: On) -> Vec<DetectorKind> {
        let mut order = Self::evaluation_order();
        order.retain(|k| k.judged_on().covers(event));
        order
    }
}

impl fmt::Display for DetectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
            // Outputs name a detector through serde; it must agree with the list.
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        }
    }

    #[test]
    fn stored_indices_never_move() {
        // Session state stores detectors by index: these must keep their places.
        let stored = [
            "turn_cap",
            "tool_call_cap",
            "token_cap",
            "cost_cap",
            "wall_clock_cap",
            "repeat",
            "generic_repeat",
            "poll_no_progress",
            "ping_pong",
            "cycle",
            "error_repeat",
            "unknown_tool",
            "error_streak",
            "circuit_breaker",
            "stall",
            "similar_turns",
            "repetitive_text",
            "low_novelty",
            "no_progress",
            "no_new_information",
            "compaction_loop",
            "write_no_effect",
            "token_ratio",
            "depth_cap",
        ];
        let names: Vec<&str> = DetectorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(&names[..stored.len()], stored);
    }

    #[test]
    fn every_default_is_valid_and_prints_as_it_reads() {
        let defaults = Detectors::default();
        for kind in DetectorKind::ALL {
            assert!(kind.default_levels().rise(), "{kind}");
            let printed = defaults.settings(*kind);
            let mut again = Detectors::default();
            again.configure(*kind, &printed).unwrap();
            assert_eq!(again, defaults, "{kind}");
        }
    }

    #[test]
    fn loops_are_judged_before_ceilings() {
        let order = DetectorKind::evaluation_order();
        assert_eq!(order.len(), DETECTOR_COUNT);
        let first_ceiling = order.iter().position(|k| k.is_ceiling()).unwrap();
        assert!(order[first_ceiling..].iter().all(|k| k.is_ceiling()));
    }
}
