//! Byte counts as people read them ("1.50 GiB").
//!
//! A leaf module: the error messages and the sizing report both format bytes
//! here, so neither has to import the other.

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;

/// Human-readable size with two decimals: "1.50 GiB", "768.00 MiB",
/// "4.00 KiB", "12 B".
pub fn format_bytes(bytes: u64) -> String {
    format_bytes_in_unit_of(bytes, bytes)
}

/// Formats `bytes` in the unit `format_bytes` would pick for `reference`, so
/// two numbers side by side read in one unit ("1.50 GiB ... 0.75 GiB").
pub(crate) fn format_bytes_in_unit_of(bytes: u64, reference: u64) -> String {
    let (divisor, unit) = match reference {
        r if r >= GIB => (GIB, "GiB"),
        r if r >= MIB => (MIB, "MiB"),
        r if r >= KIB => (KIB, "KiB"),
        _ => return format!("{bytes} B"),
    };
    format!("{:.2} {unit}", bytes as f64 / divisor as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_bytes_picks_units() {
        assert_eq!(format_bytes(3 * GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes(768 * MIB), "768.00 MiB");
        assert_eq!(format_bytes(4 * KIB), "4.00 KiB");
        assert_eq!(format_bytes(12), "12 B");
        assert_eq!(format_bytes_in_unit_of(3 * GIB / 4, GIB), "0.75 GiB");
    }
}
