//! What the host machine has: memory (from `/proc/meminfo`), the processor's model name (from
//! `/proc/cpuinfo`) and the number of hardware threads. Where those files do not exist the
//! values are unknown: memory 0 and the architecture's name.

use tessera_core::Memory;

/// Host memory from `/proc/meminfo` (MemAvailable and MemTotal); zeros when unreadable.
pub(crate) fn memory() -> Memory {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return Memory::default();
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
            .map_or(0, |kib| kib.saturating_mul(1024))
    };
    let total = field("MemTotal");
    let free = match field("MemAvailable") {
        0 => field("MemFree"),
        n => n,
    };
    Memory { free, total }
}

/// The processor's model name, or the architecture when it cannot be read.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Hardware threads available to this process (at least 1).
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `n` threads, or one per hardware thread where `n` is 0.
pub(crate) fn threads_or_all(n: usize) -> usize {
    if n == 0 {
        threads()
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_facts_are_plausible() {
        let m = memory();
        assert!(m.free <= m.total);
        assert!(!cpu_model().is_empty());
        assert!(threads() >= 1);
    }
}
