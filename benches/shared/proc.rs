//! What Linux's `/proc` says about a process, for the benches that read it.

/// A process's CPU time so far (user + system, ms, every thread), 0 when it cannot be
/// read.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) are space-separated;
    // utime and stime are the 14th and 15th fields, in clock ticks (100 per second).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) * 10
}
