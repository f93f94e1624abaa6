//! What this machine offers that a fit's knee or bandwidth can be compared with: its data caches
//! (from /sys) and one core's memory copy speed.

/// What this machine offers that a knee or a bandwidth can be compared with.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// (name, bytes) of each data cache, "L2" etc., from /sys.
    pub caches: Vec<(String, f64)>,
    /// One core copying a 64 MiB buffer, GB/s (the best of three): a copy from memory.
    pub copy_gbps: f64,
    /// One core copying a 4 MiB buffer over and over, GB/s (the best of 20): a copy whose 8 MiB
    /// stay in the last-level cache, as the buffers of the fit's cache regime do.
    pub cached_copy_gbps: f64,
}

impl Machine {
    /// This machine's caches (Linux's /sys/devices/system/cpu/cpu0/cache) and copy speed.
    pub fn here() -> Machine {
        let mut caches = Vec::new();
        for index in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
            let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
            let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
            else {
                continue;
            };
            if kind.trim() == "Instruction" {
                continue;
            }
            let size = size.trim();
            let bytes = match size.strip_suffix('K') {
                Some(k) => k.parse::<f64>().ok().map(|k| k * 1024.0),
                None => size
                    .strip_suffix('M')
                    .and_then(|m| m.parse::<f64>().ok())
                    .map(|m| m * 1048576.0),
            };
            if let Some(bytes) = bytes {
                caches.push((format!("L{}", level.trim()), bytes));
            }
        }
        Machine {
            caches,
            copy_gbps: copy_gbps(64 << 20, 3),
            cached_copy_gbps: copy_gbps(4 << 20, 20),
        }
    }

    /// The cache within a factor of 2 of `bytes`, if one is.
    pub fn cache_near(&self, bytes: f64) -> Option<&(String, f64)> {
        self.caches
            .iter()
            .filter(|(_, c)| bytes / c <= 2.0 && c / bytes <= 2.0)
            .min_by(|a, b| {
                (bytes / a.1)
                    .ln()
                    .abs()
                    .total_cmp(&(bytes / b.1).ln().abs())
            })
    }
}

/// One core's copy speed: a buffer of `bytes` copied (read and written), best of `tries`.
fn copy_gbps(bytes: usize, tries: usize) -> f64 {
    let from = vec![1u8; bytes];
    let mut to = vec![0u8; bytes];
    to.copy_from_slice(&from); // the pages are mapped before anything is timed
    (0..tries)
        .map(|_| {
            let start = std::time::Instant::now();
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&to);
            from.len() as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}
