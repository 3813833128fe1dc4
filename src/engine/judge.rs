//! Judging: every detector run on a session's updated state, and what crosses a new
//! level made a finding (levels, episodes, grace, modes, the termination tombstone).

use super::*;

/// Runs every detector on the updated state and emits what crosses a new level.
#[allow(clippy::too_many_arguments)]
pub(super) fn judge(
    order: &[DetectorKind],
    st: &mut SessionState,
    policy: &Policy,
    event: &Event<'_>,
    meta: &EventMeta<'_>,
    event_ms: i64,
    input: &Input<'_>,
    out: &mut Vec<Output>,
) {
    for &kind in order {
        let levels = policy.levels(kind);
        let Some(sig) = policy
            .detectors
            .evaluate(kind, levels, st.view_for(kind), input)
        else {
            continue;
        };
        if sig.reset {
            st.end_episode(kind);
        }
        let Some((reached, threshold)) = sig.level else {
            continue;
        };
        let ep = st.episodes.get(kind);
        let steps = st.steps();
        // Nudge before kill: a termination waits until the episode's first finding has
        // had `grace_steps` steps to reach the agent and be acted on; until then it
        // is said as a critical warning.
        let grace_left = match ep.warned_at_step {
            Some(at) => levels.grace_steps.saturating_sub(steps.saturating_sub(at)),
            None => levels.grace_steps,
        };
        let level = if reached == Level::Terminate && grace_left > 0 {
            Level::Critical
        } else {
            reached
        };
        // Emitted once per level per episode; a level also covers the ones below it.
        if ep.emitted >= level.bit() {
            continue;
        }
        let mode = levels.mode;
        let effective = if level == Level::Terminate && mode == Mode::Warn {
            Level::Critical
        } else {
            level
        };
        // Terminate at most once per session, and a shadow termination once too. A
        // shadow one does not hold back an enforced one: a detector tried out in shadow
        // mode must not switch off the others' kills for the rest of the session.
        if level == Level::Terminate
            && st
                .termination
                .is_some_and(|t| !t.shadow || mode == Mode::Shadow)
        {
            continue;
        }
        let e = st.episodes.get_mut(kind);
        let said_before = e.emitted & effective.bit() != 0;
        e.emitted |= (level.bit() << 1) - 1;
        if said_before {
            continue; // `warn` mode: the held termination was already said as critical
        }
        e.warned_at_step.get_or_insert(steps);
        if let Some(subject) = sig.subject {
            e.subject = subject;
        }
        let episode = e.number;
        st.count_finding(kind, effective);
        let terminated = effective == Level::Terminate;
        if terminated {
            st.termination = Some(crate::engine::state::Termination {
                detector: kind,
                at_ms: event_ms,
                shadow: mode == Mode::Shadow,
            });
        }
        let finding = Finding {
            kind,
            level: effective,
            signal: sig,
            threshold,
            episode,
            mode,
            held_for_steps: (level != reached).then_some(grace_left),
        };
        out.push(Output::Finding(Box::new(build_finding(
            event, meta, event_ms, st, policy, input, &finding,
        ))));
        if terminated && mode != Mode::Shadow {
            st.shrink_to_tombstone();
            break;
        }
    }
}

/// A finding the engine decided to emit.
#[derive(Clone, Copy)]
struct Finding {
    kind: DetectorKind,
    /// The level published (a termination in `warn` mode is a critical warning).
    level: Level,
    signal: Signal,
    threshold: f64,
    episode: u32,
    mode: Mode,
    /// A termination held back by the grace: the steps it still waits.
    held_for_steps: Option<u32>,
}

fn build_finding(
    event: &Event<'_>,
    meta: &EventMeta<'_>,
    event_ms: i64,
    st: &SessionState,
    policy: &Policy,
    input: &Input<'_>,
    finding: &Finding,
) -> FindingEvent {
    let Finding {
        kind,
        level,
        signal,
        threshold,
        episode,
        mode,
        held_for_steps,
    } = *finding;
    let mut d = policy
        .detectors
        .describe(kind, st.view_for(kind), input, &signal, threshold);
    if let Some(steps) = held_for_steps {
        d.evidence
            .insert("terminates_in_steps".into(), serde_json::json!(steps));
        d.hint
            .push_str("; if this goes on, the session will be stopped");
    }
    let terminated = level == Level::Terminate;
    FindingEvent {
        kind: if terminated {
            "session.terminated"
        } else {
            "session.warning"
        }
        .to_string(),
        schema_version: SCHEMA_VERSION,
        event_id: finding_event_id(&event.session_id, st.first_event_ms, kind, level, episode),
        session_id: event.session_id.to_string(),
        run_id: st.run_id.clone(),
        agent_id: st.agent_id.clone(),
        tenant: st.tenant.clone(),
        detector: kind,
        level,
        reason: d.reason,
        hint: d.hint,
        evidence: d.evidence,
        stats: Stats::of(st),
        trigger: Trigger {
            topic: meta.topic.map(str::to_string),
            partition: meta.partition,
            offset: meta.offset,
            event_id: event.event_id.to_string(),
            trace_id: event.trace_id.as_deref().map(str::to_string),
        },
        event_time: format_rfc3339_ms(event_ms),
        detected_at: format_rfc3339_ms(meta.processing_time_ms.unwrap_or(event_ms)),
        mode,
        stop_reason: terminated.then_some(kind),
    }
}
