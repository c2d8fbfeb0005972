//! RFC 3339 UTC timestamps, as Kubernetes writes them (the simulated cluster's objects and
//! logs) and as audit events carry them, and the compact form recordings and audit batches are
//! named by (read back when a restart finds them). A few lines of calendar arithmetic instead of
//! a date library: nothing here needs time zones.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `2026-11-25T01:02:03Z`: second precision, as in Kubernetes objects.
pub fn rfc3339(t: SystemTime) -> String {
    let (secs, _) = since_epoch(t);
    let (date, time) = split(secs);
    format!("{date}T{time}Z")
}

/// `2026-11-25T01:02:03.456Z`: millisecond precision, for audit events.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let (secs, millis) = since_epoch(t);
    let (date, time) = split(secs);
    format!("{date}T{time}.{millis:03}Z")
}

/// The UTC calendar date (year, month, day) of `t`: the date folders of uploaded objects.
pub fn utc_date(t: SystemTime) -> (i64, u32, u32) {
    civil_from_days(since_epoch(t).0.div_euclid(86_400))
}

/// `20261129T033000Z`: [`rfc3339`] without its separators, as recordings and audit batches are
/// named (sortable, and safe in any file system or object key).
pub fn compact(t: SystemTime) -> String {
    rfc3339(t)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

/// A [`compact`] time read back; `None` unless it is exactly that form of a real date.
pub fn parse_compact(stamp: &str) -> Option<SystemTime> {
    let b = stamp.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = stamp.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (y, mo, d) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (h, mi, s) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Whole seconds and the milliseconds after them; times before 1970 read as the epoch.
fn since_epoch(t: SystemTime) -> (i64, u32) {
    t.duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_millis()))
        .unwrap_or((0, 0))
}

/// `YYYY-MM-DD` and `hh:mm:ss` of a Unix time.
fn split(secs: i64) -> (String, String) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // 2024-02-29 (a leap day) 12:34:56.789 UTC.
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339_millis(t), "2024-02-29T12:34:56.789Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_millis(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn compact_stamps_read_back() {
        for secs in [
            0u64,
            951_782_400,
            1_709_210_096,
            1_795_910_399,
            1_795_910_400,
        ] {
            let t = UNIX_EPOCH + Duration::from_secs(secs);
            let stamp = compact(t);
            assert_eq!(parse_compact(&stamp), Some(t), "{stamp}");
        }
        for bad in [
            "",
            "20261129T033000",
            "2026112xT033000Z",
            "20261329T033000Z",
            "20261129T243000Z",
        ] {
            assert_eq!(parse_compact(bad), None, "{bad}");
        }
    }
}
