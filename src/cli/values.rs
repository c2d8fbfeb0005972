//! Parsers of flag values: durations, byte counts, header names.

use std::time::Duration;

/// Parses an HTTP header name (case-insensitive; stored lowercase).
pub fn parse_header_name(s: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(s.trim().as_bytes())
        .map_err(|_| format!("invalid header name {s:?}"))
}

/// `None` for a zero duration (a setting turned off).
pub fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Parses a byte count: `1048576`, `512Ki`, `100Mi`, `1Gi`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, factor) = match s.find(|c: char| !c.is_ascii_digit()) {
        None => (s, 1),
        Some(i) => {
            let factor = match &s[i..] {
                "Ki" => 1 << 10,
                "Mi" => 1 << 20,
                "Gi" => 1 << 30,
                other => return Err(format!("unknown size unit {other:?} (use Ki, Mi or Gi)")),
            };
            (&s[..i], factor)
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    n.checked_mul(factor)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?} is not a positive byte count"))
}

/// Parses a byte count as [`parse_bytes`] does, or `0` (a limit turned off).
pub fn parse_bytes_or_zero(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        other => parse_bytes(other),
    }
}

/// Parses `500ms`, `5s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("512Ki").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("100Mi").unwrap(), 100 << 20);
        assert_eq!(parse_bytes("2Gi").unwrap(), 2 << 30);
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("10MB").is_err());
        assert!(parse_bytes("Mi").is_err());
    }
}
