//! What Linux's `/proc` says about a process, for the benches that read it.

/// A process's CPU time so far (user + system, ms, every thread), 0 when it cannot be
/// read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_cpu_ms(&stat).unwrap_or(0)
}

/// This process's threads as `/proc/self/task` lists them: each one's name and CPU
/// time so far (user + system, ms). `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn threads_cpu_ms() -> Option<Vec<(String, u64)>> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let name = std::fs::read_to_string(dir.join("comm")).ok()?;
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        threads.push((name.trim().to_string(), stat_cpu_ms(&stat)?));
    }
    Some(threads)
}

/// The calling thread's CPU time so far (user + system, ms): for a thread that ends
/// before `threads_cpu_ms` is read. `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn this_thread_cpu_ms() -> Option<u64> {
    stat_cpu_ms(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// The CPU time (ms) in a `stat` file's text: fields after the command name (which may
/// hold spaces) are space-separated; utime and stime are the 14th and 15th fields, in
/// clock ticks (USER_HZ: 100 per second on Linux).
fn stat_cpu_ms(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some((ticks(11)? + ticks(12)?) * 10)
}
