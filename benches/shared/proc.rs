//! What Linux's `/proc` says about a process, for the benches that read it.

/// A process's CPU time so far (user + system, ms, every thread), 0 when it cannot be
/// read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_cpu(&stat).map_or(0, CpuTime::total_ms)
}

/// This process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in MiB.
#[allow(dead_code)] // The pipeline bench's alone.
pub fn resident_mib() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((kib("VmRSS:")? / 1024, kib("VmHWM:")? / 1024))
}

/// This process's threads as `/proc/self/task` lists them: each one's name and CPU time
/// so far, split into user and system time (in clock ticks: 10 ms steps). `None` when it
/// cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn threads_cpu_split() -> Option<Vec<(String, CpuTime)>> {
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
/// before `threads_cpu_split` is read. `None` when it cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn this_thread_cpu_ms() -> Option<u64> {
    Some(this_thread_cpu()?.total_ms())
}

/// The calling thread's CPU time so far, user and system apart, to the microsecond
/// (`getrusage`, not `/proc`'s 10 ms ticks: for spans of milliseconds). `None` when it
/// cannot be read.
#[allow(dead_code)] // Not every bench that reads /proc asks for this.
pub fn this_thread_cpu() -> Option<CpuTime> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `getrusage` writes a whole `rusage` into the pointer it is given, and it is
    // read only when the call succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Some(CpuTime {
        user_us: micros(usage.ru_utime),
        system_us: micros(usage.ru_stime),
    })
}

/// CPU time in µs: in the program's own code and libraries (`user`), and in the kernel
/// on its behalf (`system`: system calls, and faulting in and clearing fresh memory).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    pub user_us: u64,
    pub system_us: u64,
}

impl CpuTime {
    pub fn total_us(self) -> u64 {
        self.user_us + self.system_us
    }

    pub fn total_ms(self) -> u64 {
        self.total_us() / 1_000
    }

    /// The kernel's share of it, 0 to 1 (0 for none at all).
    #[allow(dead_code)] // Not every bench that reads /proc asks for this.
    pub fn system_share(self) -> f64 {
        self.system_us as f64 / self.total_us().max(1) as f64
    }

    /// The time from `before` to this reading.
    #[allow(dead_code)] // Not every bench that reads /proc asks for this.
    pub fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            user_us: self.user_us.saturating_sub(before.user_us),
            system_us: self.system_us.saturating_sub(before.system_us),
        }
    }

    /// This and `more`.
    #[allow(dead_code)] // Not every bench that reads /proc asks for this.
    pub fn add(&mut self, more: CpuTime) {
        self.user_us += more.user_us;
        self.system_us += more.system_us;
    }
}

/// The CPU time in a `stat` file's text: fields after the command name (which may hold
/// spaces) are space-separated; utime and stime are the 14th and 15th fields, in clock
/// ticks (USER_HZ: 100 per second on Linux).
fn stat_cpu(stat: &str) -> Option<CpuTime> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(CpuTime {
        user_us: ticks(11)? * 10_000,
        system_us: ticks(12)? * 10_000,
    })
}
