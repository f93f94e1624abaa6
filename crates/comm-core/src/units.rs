//! Byte counts for people, one way everywhere: comm-bench's tables, charts and reports, and the
//! library's messages (a buffer that does not fit in memory).

/// A byte count for labels and messages: `1 MB` for an exact multiple of 10^6, `4 MiB` for one
/// of 2^20 (while that takes at most four digits), else the decimal unit to three decimals
/// (`1.049 MB`), or bytes (`8 B`).
pub fn human_bytes(bytes: f64) -> String {
    if bytes <= 0.0 || !bytes.is_finite() {
        return format!("{bytes}");
    }
    let units = [
        (1e15, "PB"),
        (1e12, "TB"),
        (1e9, "GB"),
        (1e6, "MB"),
        (1e3, "KB"),
        (1125899906842624.0, "PiB"),
        (1099511627776.0, "TiB"),
        (1073741824.0, "GiB"),
        (1048576.0, "MiB"),
        (1024.0, "KiB"),
    ];
    // An exact multiple of a unit reads best, unless it is a long number (MemAvailable is a
    // whole number of KiB: `15612944 KiB` reads worse than `15.988 GB`); otherwise the decimal
    // unit, rounded.
    for (size, name) in units {
        let n = bytes / size;
        if (1.0..10_000.0).contains(&n) && (n - n.round()).abs() < 1e-9 {
            return format!("{} {name}", n.round());
        }
    }
    for (size, name) in &units[..5] {
        if bytes >= *size {
            return format!("{} {name}", trim(format!("{:.3}", bytes / size)));
        }
    }
    format!("{bytes} B")
}

/// `1.500` → `1.5`, `2.000` → `2`.
pub fn trim(number: String) -> String {
    if number.contains('.') {
        number
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        number
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(human_bytes(1e6), "1 MB");
        assert_eq!(human_bytes(1e9), "1 GB");
        assert_eq!(human_bytes(4194304.0), "4 MiB");
        assert_eq!(human_bytes(1024.0), "1 KiB");
        assert_eq!(human_bytes(1048560.0), "1.049 MB");
        assert_eq!(human_bytes(524280.0), "524.28 KB");
        assert_eq!(trim("10.0".into()), "10");
        assert_eq!(human_bytes(8.0), "8 B");
        assert_eq!(human_bytes(1500e6), "1500 MB");
        // What the memory check says: 10^15 f32 elements, twice; MemAvailable, which the
        // kernel counts in KiB.
        assert_eq!(human_bytes(8e15), "8 PB");
        assert_eq!(human_bytes(4.0 * 1125899906842624.0), "4 PiB");
        assert_eq!(human_bytes(15_987_654_656.0), "15.988 GB");
    }
}
