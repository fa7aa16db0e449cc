//! What the run's machine is.

/// A figure of `/proc/meminfo` (`MemTotal`, `MemAvailable`, ...), in
/// bytes, if readable.
fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Memory that can be allocated now without swapping, in bytes, if known.
pub fn available_memory() -> Option<u64> {
    meminfo("MemAvailable")
}
