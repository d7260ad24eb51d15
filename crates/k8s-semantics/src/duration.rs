//! Go's `time.ParseDuration` and `time.Duration.String()`, exact to the nanosecond (integer
//! arithmetic, overflow refused as Go refuses it). Used for `metav1.Duration` fields in config
//! files (`syncPeriod: 30s`, `1h0m0s`) and for duration flags.

use std::time::Duration;

/// Why a duration string was refused; messages follow Go's (`time: invalid duration "x"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit { unit: String, input: String },
    #[error("duration {0:?} is negative")]
    Negative(String),
}

const NANOS_PER: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),  // U+00B5 micro sign
    ("\u{3bc}s", 1_000), // U+03BC Greek mu
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration ("300ms", "-1.5h", "2h45m", "1h0m0s", "0") into signed nanoseconds.
pub fn parse_go_duration(input: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(input.to_string());
    let mut s = input;
    let neg = match s.as_bytes().first() {
        Some(b'-') => {
            s = &s[1..];
            true
        }
        Some(b'+') => {
            s = &s[1..];
            false
        }
        _ => false,
    };
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    // The magnitude may reach 1<<63 for a negative duration (i64::MIN).
    let limit: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        // integer part
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let int_digits = &s[..int_len];
        s = &s[int_len..];
        let mut whole: u64 = 0;
        for b in int_digits.bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(b - b'0')))
                .filter(|v| *v <= limit)
                .ok_or_else(invalid)?;
        }
        // fraction
        let mut frac_digits = "";
        if let Some(rest) = s.strip_prefix('.') {
            let n = rest.bytes().take_while(u8::is_ascii_digit).count();
            frac_digits = &rest[..n];
            s = &rest[n..];
            if int_len == 0 && n == 0 {
                return Err(invalid());
            }
        } else if int_len == 0 {
            return Err(invalid());
        }
        // unit
        let unit_len = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        let unit = &s[..unit_len];
        s = &s[unit_len..];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(input.to_string()));
        }
        let per = NANOS_PER
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, n)| *n)
            .ok_or_else(|| DurationError::UnknownUnit {
                unit: unit.to_string(),
                input: input.to_string(),
            })?;
        let mut v = whole
            .checked_mul(per)
            .filter(|v| *v <= limit)
            .ok_or_else(invalid)?;
        // The fraction, as Go's leadingFraction: digits are accumulated while they fit, the
        // rest only scanned; the value is then scaled in float64 exactly as Go does.
        let mut scale: f64 = 1.0;
        let mut frac: u64 = 0;
        let mut full = false;
        for b in frac_digits.bytes() {
            if full || frac > (1u64 << 63) / 10 {
                full = true;
                continue;
            }
            let y = frac * 10 + u64::from(b - b'0');
            if y >= 1 << 63 {
                full = true;
                continue;
            }
            frac = y;
            scale *= 10.0;
        }
        if frac > 0 {
            let add = (frac as f64 * (per as f64 / scale)) as u64;
            v = v
                .checked_add(add)
                .filter(|v| *v <= limit)
                .ok_or_else(invalid)?;
        }
        total = total
            .checked_add(v)
            .filter(|t| *t <= limit)
            .ok_or_else(invalid)?;
    }
    if neg {
        // total <= 1<<63 here
        Ok((total as i128).wrapping_neg() as i64)
    } else if total > i64::MAX as u64 {
        Err(invalid())
    } else {
        Ok(total as i64)
    }
}

/// Parses a Go duration that must not be negative, as a [`Duration`].
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let n = parse_go_duration(input)?;
    if n < 0 {
        return Err(DurationError::Negative(input.to_string()));
    }
    Ok(Duration::from_nanos(n as u64))
}

/// Go's `time.Duration.String()`: "0s", "1.5s", "1m30s", "1h0m0s", "250ms", "1µs", "-2s".
pub fn format_go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let u = nanos.unsigned_abs();
    let mut s = String::new();
    if nanos < 0 {
        s.push('-');
    }
    if u < 1_000_000_000 {
        // below a second: the largest unit that keeps a leading digit
        let (unit, div) = if u < 1_000 {
            ("ns", 1)
        } else if u < 1_000_000 {
            ("\u{b5}s", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        s.push_str(&fraction(u, div));
        s.push_str(unit);
    } else {
        let secs = u / 1_000_000_000;
        let (h, m) = (secs / 3600, (secs / 60) % 60);
        if h > 0 {
            s.push_str(&format!("{h}h{m}m"));
        } else if m > 0 {
            s.push_str(&format!("{m}m"));
        }
        s.push_str(&fraction(u % 60_000_000_000, 1_000_000_000));
        s.push('s');
    }
    s
}

/// `v / div` with the fraction's trailing zeros trimmed ("1.5", "2").
fn fraction(v: u64, div: u64) -> String {
    let whole = v / div;
    let frac = v % div;
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn parses_what_go_parses() {
        for (text, want) in [
            ("0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            ("-5s", -5 * S),
            ("+5s", 5 * S),
            ("-0", 0),
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600_000_000),
            ("5.s", 5 * S),
            (".5s", S / 2),
            ("1.0s", S),
            ("1.00s", S),
            ("1.004s", S + 4_000_000),
            ("100.00100s", 100 * S + 1_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12\u{b5}s", 12_000),
            ("12\u{3bc}s", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14 * S),
            ("15m", 15 * 60 * S),
            ("16h", 16 * 3600 * S),
            ("3h30m", (3 * 3600 + 30 * 60) * S),
            ("10.5s4m", 4 * 60 * S + 10 * S + S / 2),
            ("-2m3.4s", -(2 * 60 * S + 3 * S + 400_000_000)),
            (
                "1h2m3s4ms5us6ns",
                3600 * S + 2 * 60 * S + 3 * S + 4_000_000 + 5_000 + 6,
            ),
            ("39h9m14.425s", (39 * 3600 + 9 * 60 + 14) * S + 425_000_000),
            ("52763797000ns", 52_763_797_000),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036.854775807s", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("1h0m0s", 3600 * S),
        ] {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        for text in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{b5}s",
            "9223372036854775808ns",
            "9223372036854775.808s",
            "3000000h",
            "1e3s",
            " 1s",
            "1s ",
        ] {
            assert!(
                parse_go_duration(text).is_err(),
                "{text:?} should be refused"
            );
        }
        assert_eq!(
            parse_go_duration("3"),
            Err(DurationError::MissingUnit("3".into()))
        );
        assert_eq!(
            parse_go_duration("1d").unwrap_err().to_string(),
            "time: unknown unit \"d\" in duration \"1d\""
        );
        assert_eq!(
            parse_duration("-1s"),
            Err(DurationError::Negative("-1s".into()))
        );
    }

    #[test]
    fn formats_as_go() {
        for (n, want) in [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1\u{b5}s"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (4 * 60 * S + 5 * S, "4m5s"),
            (4 * 60 * S + 5 * S + S / 10 * 10 / 10, "4m5.1s"),
            (5 * 3600 * S + 6 * 60 * S + 7 * S + 1, "5h6m7.000000001s"),
            (8 * 3600 * S + S, "8h0m1s"),
            (3600 * S, "1h0m0s"),
            (-S, "-1s"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ] {
            assert_eq!(format_go_duration(n), want, "{n}");
        }
    }

    #[test]
    fn round_trips() {
        for n in [
            0,
            1,
            999,
            1_000_001,
            59 * S,
            61 * S + 7,
            86_400 * S + 3,
            -42 * S,
        ] {
            assert_eq!(parse_go_duration(&format_go_duration(n)), Ok(n));
        }
    }
}
