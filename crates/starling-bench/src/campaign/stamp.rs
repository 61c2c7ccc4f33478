//! UTC time stamps for result folders and documents, without a calendar dependency.

use std::time::{SystemTime, UNIX_EPOCH};

/// Year, month, day of a count of days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `(date-time for documents, name for a folder)`: `2026-12-02T10:04:05Z` and
/// `20261202-100405`.
pub fn utc_stamps(at: SystemTime) -> (String, String) {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let rest = secs.rem_euclid(86_400);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    (
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z"),
        format!("{year:04}{month:02}{day:02}-{h:02}{m:02}{s:02}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_instants_format_as_utc() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(utc_stamps(at(0)).0, "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day) 12:34:56.
        assert_eq!(
            utc_stamps(at(951_827_696)),
            ("2000-02-29T12:34:56Z".into(), "20000229-123456".into())
        );
        // 2026-12-31 23:59:59.
        assert_eq!(utc_stamps(at(1_798_761_599)).0, "2026-12-31T23:59:59Z");
    }
}
