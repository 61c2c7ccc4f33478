//! `strftime_now(format)` for chat templates (Llama 3.x templates put today's date in the
//! system prompt). Dates are in UTC: the server's zone is rarely what the user expects anyway,
//! and UTC needs no time-zone database.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The current UTC time formatted with C `strftime` directives.
pub(super) fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_utc(seconds, &format)
}

/// A broken-down UTC time.
struct CivilTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize,
    day_of_year: u32,
}

impl CivilTime {
    fn from_unix(seconds: i64) -> Self {
        let days = seconds.div_euclid(86_400);
        let secs_of_day = seconds.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let day_of_year = (days - days_from_civil(year, 1, 1)) as u32 + 1;
        CivilTime {
            year,
            month,
            day,
            hour: secs_of_day / 3600,
            minute: secs_of_day / 60 % 60,
            second: secs_of_day % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as usize,
            day_of_year,
        }
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `seconds` since the epoch (UTC). Supports the common directives, `%-d`-style
/// unpadded numbers (glibc), and passes unknown directives through unchanged.
fn format_utc(seconds: i64, format: &str) -> String {
    let t = CivilTime::from_unix(seconds);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next();
        let unpadded = directive == Some('-');
        if unpadded {
            directive = chars.next();
        }
        let number = |value: u32, width: usize| {
            if unpadded {
                value.to_string()
            } else {
                format!("{value:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            hour => hour,
        };
        match directive {
            Some('Y') => out.push_str(&t.year.to_string()),
            Some('y') => out.push_str(&number(t.year.rem_euclid(100) as u32, 2)),
            Some('m') => out.push_str(&number(t.month, 2)),
            Some('d') => out.push_str(&number(t.day, 2)),
            Some('e') => out.push_str(&format!("{:>2}", t.day)),
            Some('H') => out.push_str(&number(t.hour, 2)),
            Some('I') => out.push_str(&number(hour12, 2)),
            Some('M') => out.push_str(&number(t.minute, 2)),
            Some('S') => out.push_str(&number(t.second, 2)),
            Some('j') => out.push_str(&number(t.day_of_year, 3)),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[t.month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            Some('A') => out.push_str(WEEKDAYS[t.weekday]),
            Some('a') => out.push_str(&WEEKDAYS[t.weekday][..3]),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(format_utc(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            format_utc(t, "%A %B %-d, %y %I:%M:%S %p"),
            "Friday July 26, 24 01:05:09 PM"
        );
        assert_eq!(format_utc(t, "%j %H %a %Z %% %Q"), "208 13 Fri UTC % %Q");
        assert_eq!(
            format_utc(0, "%Y-%m-%d %H:%M %A"),
            "1970-01-01 00:00 Thursday"
        );
        // 2000-03-01, just after a leap day in a century leap year.
        assert_eq!(format_utc(951_868_800, "%Y-%m-%d %j"), "2000-03-01 061");
    }
}
