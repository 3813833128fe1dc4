//! The policy sections — the top-level `mode`, `[detectors.<name>]` and `[[overrides]]` —
//! read into the base [`Policy`] and the overrides, each detector table validated through
//! the detector's own settings type; overrides that can apply together are checked
//! together; and resolving a session's or a tool call's policy from them.

use std::collections::BTreeMap;

use globset::{Glob, GlobMatcher};
use serde::Deserialize;
use toml::Value as V;

use super::raw::{decode, section};
use super::Errors;
use crate::engine::detectors::settings::Threshold;
use crate::engine::detectors::{Class, DetectorKind};
use crate::engine::levels::{Levels, Mode};
use crate::engine::policy::Policy;
use crate::engine::state::{kept_label, LABEL_PREFIX, MAX_LABEL};

/// One `[detectors.<name>]` table: the levels every detector takes, and the rest, which
/// is the detector's own settings (read through its own type).
#[derive(Debug, Clone, Default)]
struct DetectorTable {
    mode: Option<Mode>,
    grace_steps: Option<u32>,
    warn_at: Option<Threshold>,
    critical_at: Option<Threshold>,
    terminate_at: Option<Threshold>,
    settings: toml::Table,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    tenant: Option<String>,
    agent: Option<String>,
    tool: Option<String>,
    mode: Option<String>,
    #[serde(default)]
    detectors: BTreeMap<String, toml::Value>,
}

/// A policy override for a tenant, an agent glob and/or a tool glob.
#[derive(Debug, Clone)]
pub struct Override {
    pub tenant: Option<String>,
    pub agent: Option<GlobMatcher>,
    pub tool: Option<GlobMatcher>,
    pub mode: Option<Mode>,
    detectors: Vec<(DetectorKind, DetectorTable)>,
}

impl Override {
    /// Its `warn` modes (its own and its detectors') read as `shadow`.
    pub(super) fn warn_as_shadow(&mut self) {
        let swap = |m: &mut Option<Mode>| {
            if *m == Some(Mode::Warn) {
                *m = Some(Mode::Shadow);
            }
        };
        swap(&mut self.mode);
        for (_, table) in &mut self.detectors {
            swap(&mut table.mode);
        }
    }

    /// Whether it applies to a session of `tenant` run by `agent`, labels as the session
    /// keeps them ([`kept_label`]), as its own tenant and literal agent are: a glob meets
    /// an id over 128 bytes by its first 115 bytes or fewer, then `~` and a digest.
    pub(super) fn matches_session(&self, tenant: Option<&str>, agent: Option<&str>) -> bool {
        let tenant_ok = self.tenant.as_deref().is_none_or(|t| tenant == Some(t));
        let agent_ok = self
            .agent
            .as_ref()
            .is_none_or(|g| agent.is_some_and(|a| g.is_match(a)));
        tenant_ok && agent_ok
    }

    /// Its mode and detector settings applied on `policy` (validated at load).
    pub(super) fn apply(&self, policy: &mut Policy) {
        if let Some(m) = self.mode {
            policy.set_mode(m);
        }
        let mut sink = Errors { list: Vec::new() };
        for (kind, table) in &self.detectors {
            apply_detector(*kind, table, policy, "", &mut sink);
        }
        debug_assert!(sink.list.is_empty(), "overrides are validated at load");
    }
}

/// The base policy: every loop detector's grace from `[engine]`, the top-level `mode`,
/// then each `[detectors.<name>]` table.
pub(super) fn base_policy(table: &toml::Table, grace_steps: u32, errors: &mut Errors) -> Policy {
    let global_mode: Option<String> = match table.get("mode") {
        None => None,
        Some(v) => decode(v.clone(), "mode", errors),
    };
    let detectors: BTreeMap<String, toml::Value> = section(table, "detectors", errors);
    let mut policy = Policy::default();
    for kind in DetectorKind::ALL.iter().filter(|k| !k.is_ceiling()) {
        policy.levels_mut(*kind).grace_steps = grace_steps;
    }
    if let Some(m) = global_mode.as_deref().and_then(|m| mode(m, "mode", errors)) {
        policy.set_mode(m);
    }
    for (kind, table) in detector_tables(&detectors, "detectors", errors) {
        apply_detector(
            kind,
            &table,
            &mut policy,
            &format!("detectors.{kind}"),
            errors,
        );
    }
    policy
}

/// `[[overrides]]`, each validated against the base `policy` (so that thresholds out of
/// order show now).
pub(super) fn overrides(
    table: &toml::Table,
    policy: &Policy,
    errors: &mut Errors,
) -> Vec<Override> {
    let values: Vec<toml::Value> = section(table, "overrides", errors);
    let mut parsed = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let key = format!("overrides[{i}]");
        let Some(raw) = decode::<RawOverride>(value, &key, errors) else {
            continue;
        };
        parsed.push(one_override(raw, &key, policy, errors));
    }
    parsed
}

fn one_override(raw: RawOverride, key: &str, policy: &Policy, errors: &mut Errors) -> Override {
    if raw.tenant.is_none() && raw.agent.is_none() && raw.tool.is_none() {
        errors.push(key, "names none of tenant, agent, tool: it would apply to everything (use the top-level settings instead)");
    }
    let glob = |g: &Option<String>, field: &str, errors: &mut Errors| -> Option<GlobMatcher> {
        g.as_ref().and_then(|g| match Glob::new(g) {
            Ok(g) => Some(g.compile_matcher()),
            Err(e) => {
                errors.push(format!("{key}.{field}"), format!("bad glob: {e}"));
                None
            }
        })
    };
    // A tenant, and an agent named without a glob's special characters, are met as the
    // sessions keep their labels: a long one by its kept form.
    let agent = raw.agent.map(|a| {
        if a.contains(glob_special) {
            a
        } else {
            kept_label(&a).into_owned()
        }
    });
    let agent = glob(&agent, "agent", errors);
    if let Some(start) = agent.as_ref().map(|g| glob_literals(g).0) {
        // Only ids over MAX_LABEL bytes could match it, and those are kept as at most
        // their first LABEL_PREFIX bytes and a digest: it would apply to no session.
        if start.len() > MAX_LABEL {
            errors.push(
                format!("{key}.agent"),
                format!("starts with {} bytes before its first glob character, and agent ids over {MAX_LABEL} bytes are kept as at most their first {LABEL_PREFIX} bytes and a digest: it would match no agent; start the glob within the id's first {LABEL_PREFIX} bytes, or name the whole id without glob characters", start.len()),
            );
        }
    }
    let tool = glob(&raw.tool, "tool", errors);
    let o_mode = raw
        .mode
        .as_deref()
        .and_then(|m| mode(m, &format!("{key}.mode"), errors));
    let dets = detector_tables(&raw.detectors, &format!("{key}.detectors"), errors);
    for (kind, d) in &dets {
        if raw.tool.is_some() && !kind.is_per_tool() {
            let per_tool: Vec<&str> = DetectorKind::ALL
                .iter()
                .filter(|k| k.is_per_tool())
                .map(|k| k.name())
                .collect();
            errors.push(
                format!("{key}.detectors.{kind}"),
                format!(
                    "{kind} is not judged per tool call; only {} can be set per tool",
                    per_tool.join(", ")
                ),
            );
        }
        // Validate against the base so threshold order errors show up now.
        let mut probe = policy.clone();
        apply_detector(
            *kind,
            d,
            &mut probe,
            &format!("{key}.detectors.{kind}"),
            errors,
        );
    }
    Override {
        tenant: raw.tenant.map(|t| kept_label(&t).into_owned()),
        agent,
        tool,
        mode: o_mode,
        detectors: dets,
    }
}

/// Every detector's levels and settings in force, as TOML.
pub(super) fn detectors_toml(policy: &Policy) -> toml::Table {
    let mut dets = toml::Table::new();
    for kind in DetectorKind::ALL {
        let levels = policy.levels(*kind);
        let th = |v: Option<f64>| V::try_from(Threshold(v)).expect("a threshold prints");
        let mut t = policy.detectors.settings(*kind);
        t.insert("mode".into(), V::String(levels.mode.name().into()));
        t.insert("grace_steps".into(), V::Integer(levels.grace_steps as i64));
        t.insert("warn_at".into(), th(levels.warn_at));
        t.insert("critical_at".into(), th(levels.critical_at));
        t.insert("terminate_at".into(), th(levels.terminate_at));
        dets.insert(kind.name().to_string(), V::Table(t));
    }
    dets
}

/// The literal start and end of a glob (up to its first and from its last special
/// character), for telling two globs apart without the strings they match.
fn glob_literals(glob: &GlobMatcher) -> (&str, &str) {
    let pattern = glob.glob().glob();
    let start = pattern
        .find(glob_special)
        .map_or(pattern, |i| &pattern[..i]);
    let end = pattern
        .rfind(glob_special)
        .map_or(pattern, |i| &pattern[i + 1..]);
    (start, end)
}

/// Whether `c` means more than itself in a glob.
fn glob_special(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\')
}

/// Whether no string matches both globs, as far as their literal starts (and, with
/// `ends`, ends) tell: sure when true, a maybe when false.
fn globs_disjoint(a: &GlobMatcher, b: &GlobMatcher, ends: bool) -> bool {
    let ((a_start, a_end), (b_start, b_end)) = (glob_literals(a), glob_literals(b));
    let apart = |x: &str, y: &str, f: fn(&str, &str) -> bool| !f(x, y) && !f(y, x);
    apart(a_start, b_start, |x, y| x.starts_with(y))
        || (ends && apart(a_end, b_end, |x, y| x.ends_with(y)))
}

/// Whether two overrides may apply to the same session or call.
fn may_meet(a: &Override, b: &Override) -> bool {
    let tenants = match (&a.tenant, &b.tenant) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    };
    let agents = match (&a.agent, &b.agent) {
        (Some(x), Some(y)) => !globs_disjoint(x, y, true),
        _ => true,
    };
    // A tool glob matches a call's tool or its `tool.action` name: only literal
    // starts tell two apart.
    let tools = match (&a.tool, &b.tool) {
        (Some(x), Some(y)) => !globs_disjoint(x, y, false),
        _ => true,
    };
    tenants && agents && tools
}

/// The sets of overrides to check together: every combination of up to 12 of those
/// that set detectors (pairs only beyond), each with the overrides that match wherever
/// all of it does; the smallest first, each once.
fn candidate_sets(overrides: &[Override], setting: &[usize]) -> Vec<Vec<usize>> {
    let n = setting.len();
    let mut sets: Vec<Vec<usize>> = if n <= 12 {
        (1u32..1 << n)
            .filter(|m| m.count_ones() >= 2)
            .map(|m| {
                (0..n)
                    .filter(|b| m >> b & 1 == 1)
                    .map(|b| setting[b])
                    .collect()
            })
            .collect()
    } else {
        (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| vec![setting[a], setting[b]]))
            .collect()
    };
    // An override that matches wherever all of a set match (its tenant, agent and tool
    // each unset or one of the set's own) always applies with them: it joins the set.
    let implied = |set: &[usize], o: &Override| {
        let tenant = o
            .tenant
            .as_ref()
            .is_none_or(|t| set.iter().any(|&i| overrides[i].tenant.as_ref() == Some(t)));
        let glob = |pick: fn(&Override) -> Option<&GlobMatcher>| {
            pick(o).is_none_or(|g| {
                set.iter().any(|&i| {
                    pick(&overrides[i]).is_some_and(|h| h.glob().glob() == g.glob().glob())
                })
            })
        };
        tenant && glob(|o| o.agent.as_ref()) && glob(|o| o.tool.as_ref())
    };
    for set in &mut sets {
        let joining: Vec<usize> = setting
            .iter()
            .copied()
            .filter(|i| !set.contains(i) && implied(set, &overrides[*i]))
            .collect();
        set.extend(joining);
        set.sort_unstable();
    }
    // The smallest first, each once.
    sets.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
    sets.dedup();
    sets
}

/// Overrides are checked one by one against the base as they are read; this checks the
/// ones that can apply together (the same session, or call) in the order they would be
/// applied, since one may set `terminate_at` under the `warn_at` another set. Two exact
/// tenants that differ never meet, nor globs whose literal starts (or, for agents, ends)
/// differ; anything else may. Every combination of up to 12 overrides that set
/// detectors is tried (pairs only beyond), the smallest first.
pub(super) fn check_overrides_together(
    policy: &Policy,
    overrides: &[Override],
    errors: &mut Errors,
) {
    let setting: Vec<usize> = (0..overrides.len())
        .filter(|&i| !overrides[i].detectors.is_empty())
        .collect();
    if setting.len() < 2 {
        return;
    }
    let sets = candidate_sets(overrides, &setting);
    let mut reported: Vec<String> = Vec::new();
    for set in sets {
        if !set.iter().enumerate().all(|(x, &a)| {
            set[x + 1..]
                .iter()
                .all(|&b| may_meet(&overrides[a], &overrides[b]))
        }) {
            continue;
        }
        // Session overrides first, then tool overrides, each in order (`policy_for`,
        // `policy_for_tool`).
        let mut order = set.clone();
        order.sort_by_key(|&i| (overrides[i].tool.is_some(), i));
        let mut p = policy.clone();
        for (at, &i) in order.iter().enumerate() {
            let mut found = Errors { list: Vec::new() };
            for (kind, table) in &overrides[i].detectors {
                apply_detector(
                    *kind,
                    table,
                    &mut p,
                    &format!("overrides[{i}].detectors.{kind}"),
                    &mut found,
                );
            }
            for e in found.list {
                if reported.contains(&e.key) {
                    continue;
                }
                let before: Vec<String> = order[..at]
                    .iter()
                    .map(|j| format!("overrides[{j}]"))
                    .collect();
                reported.push(e.key.clone());
                errors.push(
                    e.key,
                    format!(
                        "{}, applied after {} (which can match the same sessions or calls)",
                        e.message,
                        before.join(", ")
                    ),
                );
            }
        }
    }
}

fn mode(raw: &str, key: &str, errors: &mut Errors) -> Option<Mode> {
    let m = Mode::parse(raw);
    if m.is_none() {
        errors.push(
            key,
            format!("unknown mode \"{raw}\" (expected enforce, warn or shadow)"),
        );
    }
    m
}

/// Reads a `[detectors.<name>]` table: the common levels here, the rest is left to the
/// detector's own type (see [`apply_detector`]).
fn detector_table(value: &toml::Value, key: &str, errors: &mut Errors) -> Option<DetectorTable> {
    let Some(table) = value.as_table() else {
        errors.push(key, "must be a table of settings");
        return None;
    };
    let mut settings = table.clone();
    let mut take = |name: &str, errors: &mut Errors| {
        let value = settings.remove(name)?;
        decode::<Threshold>(value, &format!("{key}.{name}"), errors)
    };
    let warn_at = take("warn_at", errors);
    let critical_at = take("critical_at", errors);
    let terminate_at = take("terminate_at", errors);
    let grace_steps = settings
        .remove("grace_steps")
        .and_then(|v| decode::<u32>(v, &format!("{key}.grace_steps"), errors));
    let mode = settings
        .remove("mode")
        .and_then(|v| decode::<String>(v, &format!("{key}.mode"), errors))
        .and_then(|m| mode(&m, &format!("{key}.mode"), errors));
    Some(DetectorTable {
        mode,
        grace_steps,
        warn_at,
        critical_at,
        terminate_at,
        settings,
    })
}

/// Applies one detector table on `policy`, reporting problems under `key`.
fn apply_detector(
    kind: DetectorKind,
    table: &DetectorTable,
    policy: &mut Policy,
    key: &str,
    errors: &mut Errors,
) {
    let levels = policy.levels_mut(kind);
    if let Some(m) = table.mode {
        levels.mode = m;
    }
    if let Some(g) = table.grace_steps {
        levels.grace_steps = g;
    }
    if let Some(t) = table.terminate_at {
        levels.terminate_at = t.get();
        // A budget with only `terminate_at` set keeps its warnings relative to it.
        if kind.class() == Class::Budget {
            let (warn, critical) = Levels::budget_warnings(t.get());
            if table.warn_at.is_none() {
                levels.warn_at = warn;
            }
            if table.critical_at.is_none() {
                levels.critical_at = critical;
            }
        }
    }
    if let Some(t) = table.warn_at {
        levels.warn_at = t.get();
    }
    if let Some(t) = table.critical_at {
        levels.critical_at = t.get();
    }
    if !levels.rise() {
        errors.push(
            key.to_string(),
            {
                let shown = |t: Option<f64>| t.map_or_else(|| "off".to_string(), |v| v.to_string());
                format!(
                    "thresholds must rise (those not off): warn_at {} <= critical_at {} <= terminate_at {}",
                    shown(levels.warn_at),
                    shown(levels.critical_at),
                    shown(levels.terminate_at)
                )
            },
        );
    }
    if let Err(problems) = policy.detectors.configure(kind, &table.settings) {
        for p in problems {
            errors.push(format!("{key}.{}", p.key), p.message);
        }
    }
}

fn detector_tables(
    table: &BTreeMap<String, toml::Value>,
    prefix: &str,
    errors: &mut Errors,
) -> Vec<(DetectorKind, DetectorTable)> {
    let mut out = Vec::new();
    for (name, value) in table {
        let key = format!("{prefix}.{name}");
        let Some(kind) = DetectorKind::from_name(name) else {
            errors.push(
                key,
                format!(
                    "unknown detector (known: {})",
                    DetectorKind::ALL
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            continue;
        };
        if let Some(t) = detector_table(value, &key, errors) {
            out.push((kind, t));
        }
    }
    out
}
