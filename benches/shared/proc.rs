//! What Linux's `/proc` says about a process, for the benches that read it.

/// A process's CPU time so far (user + system, ms, every thread), 0 when it cannot be
/// read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_cpu(&stat).map_or(0, CpuMs::total)
}

/// This process's threads as `/proc/self/task` lists them: each one's name and CPU
/// time so far (user + system, ms). `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn threads_cpu_ms() -> Option<Vec<(String, u64)>> {
    Some(
        threads_cpu_split_ms()?
            .into_iter()
            .map(|(name, cpu)| (name, cpu.total()))
            .collect(),
    )
}

/// This process's threads' CPU time so far, each split into user and system time.
/// `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn threads_cpu_split_ms() -> Option<Vec<(String, CpuMs)>> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let name = std::fs::read_to_string(dir.join("comm")).ok()?;
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        threads.push((name.trim().to_string(), stat_cpu(&stat)?));
    }
    Some(threads)
}

/// The calling thread's CPU time so far (user + system, ms): for a thread that ends
/// before `threads_cpu_ms` is read. `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn this_thread_cpu_ms() -> Option<u64> {
    Some(this_thread_cpu()?.total())
}

/// The calling thread's CPU time so far, user and system apart. `None` when it cannot be
/// read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn this_thread_cpu() -> Option<CpuMs> {
    stat_cpu(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// CPU time in ms: in the program's own code and libraries (`user`), and in the kernel on
/// its behalf (`system`: system calls, and faulting in and clearing fresh memory).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuMs {
    pub user: u64,
    pub system: u64,
}

impl CpuMs {
    pub fn total(self) -> u64 {
        self.user + self.system
    }

    /// The time from `before` to this reading.
    #[allow(dead_code)] // Not every bench that reads /proc asks for this.
    pub fn since(self, before: CpuMs) -> CpuMs {
        CpuMs {
            user: self.user.saturating_sub(before.user),
            system: self.system.saturating_sub(before.system),
        }
    }
}

/// The CPU time in a `stat` file's text: fields after the command name (which may hold
/// spaces) are space-separated; utime and stime are the 14th and 15th fields, in clock
/// ticks (USER_HZ: 100 per second on Linux).
fn stat_cpu(stat: &str) -> Option<CpuMs> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(CpuMs {
        user: ticks(11)? * 10,
        system: ticks(12)? * 10,
    })
}
