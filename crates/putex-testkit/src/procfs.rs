//! Readings of `/proc` for the benchmarks: the machine (CPUs, load) and a
//! process (memory, CPU time), and the processes that name a path.

/// The CPUs this process may use.
pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A process's resident set (`VmRSS`), in kB; 0 if it is gone.
pub fn rss_kb(pid: i32) -> u64 {
    status_kb(pid, "VmRSS:")
}

/// A process's peak resident set (`VmHWM`), in kB; 0 if it is gone.
pub fn peak_rss_kb(pid: i32) -> u64 {
    status_kb(pid, "VmHWM:")
}

/// A `kB` line of `/proc/PID/status`; 0 if the process is gone.
fn status_kb(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
pub fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The sum of `/proc/PID/stat` fields `fields` (0 = the state, the field
/// after the command), in clock ticks; 0 if the process is gone.
fn stat_ticks(pid: i32, fields: std::ops::Range<usize>) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s[s.rfind(')')? + 1..].to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            fields
                .map(|i| f.get(i)?.parse::<u64>().ok())
                .sum::<Option<u64>>()
        })
        .unwrap_or(0)
}

/// A process's CPU time (utime + stime, stat fields 14 and 15), in clock
/// ticks; 0 if it is gone.
pub fn cpu_ticks(pid: i32) -> u64 {
    stat_ticks(pid, 11..13)
}

/// A process's CPU time with that of its children it waited for (utime +
/// stime + cutime + cstime), in clock ticks: an agent with the hooks it
/// ran. 0 if it is gone.
pub fn cpu_ticks_with_children(pid: i32) -> u64 {
    stat_ticks(pid, 11..15)
}

/// The CPU's model name (`/proc/cpuinfo`), or `unknown CPU`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// What a process is doing, for a fixture's failure message: its state
/// (`R` running, `S` sleeping, `T` stopped, `Z` zombie …), CPU time and
/// what it waits in (`/proc/PID/wchan`), or that it is gone.
pub fn describe(pid: i32) -> String {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return format!("process {pid} is gone");
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .unwrap_or("?")
        .to_owned();
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    format!(
        "process {pid}: state {state}, {} CPU ticks, waiting in {:?}; load {}",
        cpu_ticks(pid),
        wchan,
        load_average()
    )
}
