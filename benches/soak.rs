//! Soak: `loopwarden run` for an hour at a steady input rate, with a second member
//! joining and leaving the group every few minutes and the broker going away twice;
//! then the terminations on the bus are compared with `replay`'s.
//!
//! `cargo bench --bench soak` (the defaults: one hour, 200 events/s). Knobs (environment):
//! `SOAK_SECS` (3600), `SOAK_RATE` (events/s, 200), `SOAK_MEMBER_SECS` (the second
//! member joins, then leaves, every this many seconds; 120, so that the first member
//! has restored partitions from the changelog once before the 5-minute reading that
//! memory is measured against), `SOAK_OUTAGE_SECS` (each of
//! the two broker outages; 20), `SOAK_PORT` (the broker of its own; 19096),
//! `SOAK_DEBUG` (librdkafka debug contexts for both members, e.g. `fetch,cgrp`),
//! `SOAK_STATS_SECS` (librdkafka statistics every this many seconds from both members'
//! consumers, logged as "Client stats": each partition's fetch state, offsets and
//! queue). The members' logs, and the first member's memory map (`smaps`) after 5
//! minutes and at the end, are kept in a directory the bench prints (and does not
//! remove). `SOAK_FETCH_WAIT_MS` (both members' `fetch.wait.max.ms`, their restores'
//! included; 500, librdkafka's default, instead of loopwarden's 20 and the restores' 10:
//! Tansu answers a fetch empty when finding its records takes longer than the fetch may
//! wait, which its in-memory log does once it holds tens of thousands of record batches
//! a partition, so that consumers with a 20 ms wait stall for minutes; see
//! docs/DEVELOPMENT.md). It prints
//! one line every 30 s and a JSON report at the end, and exits non-zero when a target is
//! missed: the first member's RSS at the end more than 10 % above (or below) its RSS
//! after 5 minutes, lag not back to 0 within 2 minutes of the input's end or above
//! `rate × (outage + 60 s)` at any point, or terminations that differ from replay's (each
//! lost, invented or with other counters; copies with the same `event_id` are counted).
//!
//! The broker is Tansu (`scripts/broker`), which keeps its data in memory only: a restart
//! would empty it, so its outages are SIGSTOP … SIGCONT (no request answered, every
//! connection stalled), as in the pipeline tests.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/proc.rs"]
mod proc;
use proc::cpu_ms;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use loopwarden::tools::simulate::{Fleet, FleetSpec};

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One 30 s reading.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Reading {
    at_secs: u64,
    produced: u64,
    lag: i64,
    rss_kb: u64,
    /// The anonymous part of `rss_kb` (heap, stacks: what a leak would grow) and the
    /// file-backed part (the binary's code and libraries, paged in as code paths first
    /// run).
    rss_anon_kb: u64,
    rss_file_kb: u64,
    /// The most RSS the process has had so far (`VmHWM`): a transient peak between two
    /// readings shows here.
    rss_peak_kb: u64,
    /// CPU the broker used since the last reading: a stall with the broker busy is the
    /// broker's, one with the broker idle is the clients'.
    broker_cpu_ms: u64,
    second_member: bool,
}

/// A copy of a process's memory map with each mapping's resident size (`smaps`), for
/// telling what grew between two readings; nothing when it cannot be read.
fn keep_smaps(pid: u32, to: &std::path::Path) {
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) {
        let _ = std::fs::write(to, text);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let secs = knob("SOAK_SECS", 3600);
    let rate = knob("SOAK_RATE", 200).max(1);
    let member_every = knob("SOAK_MEMBER_SECS", 120).max(1);
    let outage = knob("SOAK_OUTAGE_SECS", 20);
    let port = knob("SOAK_PORT", 19096) as u16;

    let broker = OwnBroker::start_on(port);
    // The bench's own readers (lag, outputs) fetch as the members do.
    set_reader_fetch_wait_ms(knob("SOAK_FETCH_WAIT_MS", 500) as u32);
    if let Ok(base) = std::env::var("SOAK_VERIFY_TOPICS") {
        return verify_earlier_run(&broker, &base, secs, rate);
    }
    let fx = fixture_on(broker.address.clone(), 4, "");
    // The tests' 2 s group session suits a minute-long test; an hour under load with a
    // member coming and going needs what production runs with (librdkafka's defaults are
    // 45 s and 3 s; 10 s still lets a SIGKILLed member's partitions move on quickly).
    // Under 2 s the group rebalanced over and over on a loaded machine and fetched nothing.
    let text = std::fs::read_to_string(&fx.cfg)
        .unwrap()
        .replace(
            "\"session.timeout.ms\" = 2000",
            "\"session.timeout.ms\" = 10000",
        )
        .replace(
            "\"heartbeat.interval.ms\" = 200",
            "\"heartbeat.interval.ms\" = 1000",
        );
    std::fs::write(&fx.cfg, text).unwrap();
    let config = config_of(&fx.cfg);
    let group = config.kafka.group_id.clone();
    let topic = fx.topics.input.clone();

    // The input: a fleet whose event time runs at the input rate (replay reads the same
    // events in the same order, so the idle clock and event time agree with it).
    let events = soak_events(secs, rate);
    let want = expected(config.clone(), &events);
    eprintln!(
        "soak: {} events at {rate}/s over {secs} s, {} terminations expected; group {group}",
        events.len(),
        want.terminations.len()
    );

    // The steady producer.
    let produced = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (brokers, topic, produced, done) = (
            broker.address.clone(),
            topic.clone(),
            produced.clone(),
            done.clone(),
        );
        let events = events.clone();
        std::thread::spawn(move || {
            let producer = producer(&brokers);
            let start = Instant::now();
            let per_tick = (rate / 10).max(1) as usize;
            for (n, chunk) in events.chunks(per_tick).enumerate() {
                let due = start + Duration::from_millis(100 * n as u64);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                produce_with(&producer, &topic, chunk, &[]);
                produced.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
        })
    };

    let (cfg_b, log_b) = fx.instance("second");
    let debug = std::env::var("SOAK_DEBUG").ok();
    let stats_secs = knob("SOAK_STATS_SECS", 0);
    let fetch_wait_ms = knob("SOAK_FETCH_WAIT_MS", 500);
    // librdkafka's debug lines are logged at debug level, under the `librdkafka` target.
    let member_env: &[(&str, &str)] = if debug.is_some() {
        &[("RUST_LOG", "info,librdkafka=debug")]
    } else {
        &[]
    };
    for cfg in [&fx.cfg, &cfg_b] {
        // Both configurations end in their [kafka.consumer] table.
        let mut text = std::fs::read_to_string(cfg).unwrap();
        text.push_str(&format!("\"fetch.wait.max.ms\" = {fetch_wait_ms}\n"));
        if let Some(debug) = &debug {
            text.push_str(&format!("\"debug\" = \"{debug}\"\n"));
        }
        if stats_secs > 0 {
            text.push_str(&format!(
                "\"statistics.interval.ms\" = {}\n",
                stats_secs * 1000
            ));
        }
        std::fs::write(cfg, text).unwrap();
    }
    eprintln!("soak: members' logs in {}", fx.dir.path().display());
    let first = spawn_run_with_env(&fx.cfg, &fx.dir.path().join("first.log"), member_env);
    let mut second: Option<Running> = None;
    let outages = [secs / 3, 2 * secs / 3];
    let mut readings: Vec<Reading> = Vec::new();
    let start = Instant::now();
    let mut broker_cpu = cpu_ms(broker.pid);
    let mut next_reading = 30;
    let mut next_toggle = member_every;
    let mut next_outage = 0;
    let mut drained_at: Option<Duration> = None;
    let mut input_ended: Option<Duration> = None;
    let lag_of = |produced: u64| {
        let committed: i64 = committed_offsets(&broker.address, &group, &topic)
            .into_iter()
            .map(|o| o.unwrap_or(0))
            .sum();
        produced as i64 - committed
    };
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now = start.elapsed().as_secs();
        if next_outage < outages.len() && now >= outages[next_outage] {
            eprintln!(
                "soak: broker away for {outage} s ({} of 2)",
                next_outage + 1
            );
            broker.signal("-STOP");
            std::thread::sleep(Duration::from_secs(outage));
            broker.signal("-CONT");
            next_outage += 1;
        }
        if now >= next_toggle && now < secs {
            match second.take() {
                None => {
                    eprintln!("soak: second member joins");
                    second = Some(spawn_run_with_env(&cfg_b, &log_b, member_env));
                }
                Some(run) => {
                    eprintln!("soak: second member leaves");
                    run.stop_gracefully();
                }
            }
            next_toggle += member_every;
        }
        if now >= next_reading {
            let produced = produced.load(Ordering::Relaxed);
            let r = Reading {
                at_secs: now,
                produced,
                lag: lag_of(produced),
                rss_kb: rss_kb(first.child.id()),
                rss_anon_kb: status_kb(first.child.id(), "RssAnon"),
                rss_file_kb: status_kb(first.child.id(), "RssFile"),
                rss_peak_kb: status_kb(first.child.id(), "VmHWM"),
                broker_cpu_ms: cpu_ms(broker.pid) - broker_cpu,
                second_member: second.is_some(),
            };
            broker_cpu += r.broker_cpu_ms;
            if r.at_secs >= 300 && !readings.iter().any(|r| r.at_secs >= 300) {
                keep_smaps(
                    first.child.id(),
                    &fx.dir.path().join("first-smaps-5min.txt"),
                );
            }
            eprintln!("soak: {r:?}");
            readings.push(r);
            next_reading += 30;
        }
        if done.load(Ordering::Relaxed) {
            // The drain is timed from the input's end, which a loaded machine's producer
            // can reach later than `secs`.
            let input_end = *input_ended.get_or_insert(start.elapsed());
            let produced = produced.load(Ordering::Relaxed);
            if lag_of(produced) <= 0 {
                drained_at.get_or_insert(start.elapsed() - input_end);
                break;
            }
            if start.elapsed() > input_end + Duration::from_secs(120) {
                break;
            }
        }
    }
    feeder.join().unwrap();
    let end_rss = rss_kb(first.child.id());
    keep_smaps(first.child.id(), &fx.dir.path().join("first-smaps-end.txt"));
    let (terminated, summaries) =
        read_expected(&broker.address, &fx.topics, &want, Duration::from_secs(120));
    if let Some(run) = second.take() {
        run.stop_gracefully();
    }
    first.stop_gracefully();

    // The report, then the targets.
    let after_5_min = readings
        .iter()
        .find(|r| r.at_secs >= 300)
        .map_or(0, |r| r.rss_kb);
    let max_lag = readings.iter().map(|r| r.lag).max().unwrap_or(0);
    let lag_bound = (rate * (outage + 60)) as i64;
    let outcome =
        std::panic::catch_unwind(|| assert_each_once_as_replay(&want, &terminated, &summaries));
    let report = serde_json::json!({
        "secs": secs,
        "rate": rate,
        "events": events.len(),
        "terminations_expected": want.terminations.len(),
        "terminations_as_replay": outcome.is_ok(),
        "re_emitted_copies": outcome.as_ref().ok(),
        "rss_kb_after_5_min": after_5_min,
        "rss_kb_at_end": end_rss,
        "max_lag_events": max_lag,
        "lag_bound_events": lag_bound,
        "input_ended_secs": input_ended.map(|d| d.as_secs()),
        "drained_secs_after_input": drained_at.map(|d| d.as_secs()),
        "readings": readings,
    });
    println!("{report}");
    // The members' logs and the memory maps outlive the run, for reading afterwards.
    let kept = fx.dir.keep();
    eprintln!(
        "soak: members' logs and memory maps kept in {}",
        kept.display()
    );
    let mut missed = Vec::new();
    if outcome.is_err() {
        missed.push("terminations differ from replay's".to_string());
    }
    if after_5_min > 0 && (end_rss as f64 - after_5_min as f64).abs() > 0.1 * after_5_min as f64 {
        missed.push(format!(
            "RSS {end_rss} kB at the end vs {after_5_min} kB after 5 minutes"
        ));
    }
    if max_lag > lag_bound {
        missed.push(format!("lag reached {max_lag} events (bound {lag_bound})"));
    }
    if drained_at.is_none() {
        missed.push("lag not back to 0 within 2 minutes of the input's end".into());
    }
    if !missed.is_empty() {
        eprintln!("soak: targets missed: {}", missed.join("; "));
        // `exit` runs no destructors: the broker this bench started is stopped first.
        drop(broker);
        std::process::exit(1);
    }
    eprintln!("soak: every target held");
}

/// The input of a soak of `secs` at `rate`: a fleet whose event time runs at the input
/// rate (replay reads the same events in the same order).
fn soak_events(secs: u64, rate: u64) -> Vec<Vec<u8>> {
    let total = (secs * rate) as usize;
    let mut fleet = Fleet::new(FleetSpec {
        sessions: total as u64 / 30 + 500,
        concurrency: 400,
        loop_share: 0.2,
        seed: 28,
    });
    let step_ms = (1000 / rate).max(1) as i64;
    let mut t = 1_763_000_000_000;
    let mut events = Vec::with_capacity(total);
    while events.len() < total {
        let Some(e) = fleet.next_event(t) else { break };
        events.push(e.json);
        t += step_ms;
    }
    events
}

/// `SOAK_VERIFY_TOPICS=t-…`: checks the outputs an earlier run left on this broker
/// (its topics' common prefix, as its log names them) against replay's, with the same
/// `SOAK_SECS` and `SOAK_RATE`; runs nothing.
fn verify_earlier_run(broker: &OwnBroker, base: &str, secs: u64, rate: u64) {
    let topics = Topics::of(base);
    let config = Arc::new(loopwarden::config::Config::default());
    let want = expected(config, &soak_events(secs, rate));
    let (terminated, summaries) =
        read_expected(&broker.address, &topics, &want, Duration::from_secs(300));
    let copies = assert_each_once_as_replay(&want, &terminated, &summaries);
    eprintln!(
        "soak: the run on {base}: {} terminations and {} completed sessions' summaries as replay's; {copies} re-emitted copies",
        want.terminations.len(),
        want.summaries.len()
    );
}
