//! Allocations on the hot path, counted by a global allocator that counts: parsing an
//! event allocates nothing (its strings are borrowed from the input), and the engine over
//! a steady fleet (every session open and grown) allocates next to nothing per event.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use loopwarden::config::Config;
use loopwarden::contract::event::{parse_event, ParseLimits};
use loopwarden::engine::{Engine, EventMeta};
use loopwarden::tools::simulate::{prose, Rng};

struct Counting;

thread_local! {
    /// Allocations made by this thread: what the test harness's other threads allocate
    /// meanwhile (another test, its report) is not counted. A `const` cell without drop
    /// glue is readable inside the allocator, even while a thread ends.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    ALLOCATIONS.with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

/// `steps` events of each of `sessions` sessions, interleaved: turns with text (escapes
/// in it), and tool calls with arguments and a result of prose.
fn fleet(sessions: u64, steps: u64) -> Vec<String> {
    let mut rng = Rng::new(7);
    let mut lines = Vec::new();
    for step in 0..steps {
        for s in 0..sessions {
            let sid = format!("s{s:04}");
            let ms = 1_800_000_000_000 + (step * sessions + s) as i64 * 10;
            let ts = loopwarden::contract::event::format_rfc3339_ms(ms);
            let v = if step % 2 == 0 {
                serde_json::json!({"type": "cost.attributed", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "input_tokens": 1000, "output_tokens": 100, "tool_calls": 1, "text": prose(&mut rng, 400)})
            } else {
                serde_json::json!({"type": "tool.called", "session_id": sid, "event_id": format!("{sid}#{step}"), "timestamp": ts, "tool": "read_file", "args": {"path": format!("src/f{}.rs", rng.below(100))}, "result": prose(&mut rng, 800)})
            };
            lines.push(v.to_string());
        }
    }
    lines
}

#[test]
fn parsing_an_event_allocates_nothing() {
    let lines = fleet(20, 10);
    let mut events = 0;
    let n = allocations_in(|| {
        for l in &lines {
            let ev = parse_event(l.as_bytes(), &ParseLimits::default()).unwrap();
            events += usize::from(!ev.session_id.is_empty());
        }
    });
    assert_eq!(events, lines.len());
    assert_eq!(n, 0, "{n} allocations parsing {events} events");
}

#[test]
fn the_engine_allocates_next_to_nothing_per_event_in_a_steady_fleet() {
    let lines = fleet(200, 120);
    let mut engine = Engine::new(Arc::new(Config::default()));
    let mut out = Vec::new();
    let (warm, steady) = lines.split_at(lines.len() / 2);
    for l in warm {
        let ev = parse_event(l.as_bytes(), &ParseLimits::default()).unwrap();
        engine.process(&ev, &EventMeta::default(), &mut out);
        out.clear();
    }
    let mut outputs = 0;
    let n = allocations_in(|| {
        for l in steady {
            let ev = parse_event(l.as_bytes(), &ParseLimits::default()).unwrap();
            engine.process(&ev, &EventMeta::default(), &mut out);
            outputs += out.len();
            out.clear();
        }
    });
    assert_eq!(outputs, 0, "a steady, healthy fleet: no findings");
    // A session's bounded collections (the window, rings of digests) grow to their caps
    // once; the expiry heap is rescheduled now and then. Less than one allocation in 20
    // events.
    let events = steady.len() as u64;
    assert!(n * 20 < events, "{n} allocations for {events} events");
    eprintln!("steady fleet: {n} allocations for {events} events");
}
