//! CronJob schedules as upstream reads them (the robfig/cron "standard" parser the API server
//! and the CronJob controller use): five fields (minute, hour, day of month, month, day of
//! week), each a list of `*`/`?`, `n`, `a-b`, with an optional `/step` (`n/step` runs from `n` to
//! the field's maximum), month and weekday names (`JAN`, `sun`), and the descriptors
//! `@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/`@midnight`, `@hourly` and
//! `@every <Go duration>`. When neither day field is a plain `*`/`?`, a day matches if either
//! does (cron's OR rule); otherwise both must. Errors carry robfig's wording, which the API
//! server returns in its 422.
//!
//! Times are evaluated in a time zone (the CronJob's `timeZone`, else the controller's): a
//! wall-clock time that does not exist (the hour skipped when clocks go forward) is skipped, a
//! wall-clock time that happens twice (clocks going back) runs once, at its first occurrence.

use std::fmt;
use std::time::Duration;

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{ToSpan, Zoned};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("{0}")]
    Invalid(String),
    #[error("unknown time zone {0}")]
    UnknownTimeZone(String),
}

fn invalid(msg: impl Into<String>) -> CronError {
    CronError::Invalid(msg.into())
}

/// A parsed schedule.
#[derive(Clone, PartialEq, Eq)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind {
    Fields(Fields),
    Every(Duration),
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Fields {
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
    /// The day-of-month / day-of-week field was a plain `*` or `?`.
    dom_star: bool,
    dow_star: bool,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Every(d) => write!(f, "Schedule(@every {d:?})"),
            Kind::Fields(x) => write!(
                f,
                "Schedule(min {:#x}, hour {:#x}, dom {:#x}{}, month {:#x}, dow {:#x}{})",
                x.minute,
                x.hour,
                x.dom,
                if x.dom_star { "*" } else { "" },
                x.month,
                x.dow,
                if x.dow_star { "*" } else { "" }
            ),
        }
    }
}

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Bounds = Bounds { min: 0, max: 59, names: &[] };
const HOUR: Bounds = Bounds { min: 0, max: 23, names: &[] };
const DOM: Bounds = Bounds { min: 1, max: 31, names: &[] };
const MONTH: Bounds =
    Bounds { min: 1, max: 12, names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"] };
const DOW: Bounds = Bounds { min: 0, max: 6, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

/// A value of a field: a name (case-insensitive) or a non-negative integer.
fn value(text: &str, b: &Bounds) -> Result<u32, CronError> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = b.names.iter().position(|n| *n == lower) {
        return Ok(b.min + u32::try_from(i).unwrap_or(0));
    }
    text.parse::<u32>()
        .map_err(|_| invalid(format!("failed to parse int from {text}: strconv.Atoi: parsing {text:?}: invalid syntax")))
}

/// One comma-separated element: the bits it sets and whether it is a plain star.
fn range(expr: &str, b: &Bounds) -> Result<(u64, bool), CronError> {
    let parts: Vec<&str> = expr.split('/').collect();
    if parts.len() > 2 {
        return Err(invalid(format!("too many slashes: {expr}")));
    }
    let bounds: Vec<&str> = parts[0].split('-').collect();
    if bounds.len() > 2 {
        return Err(invalid(format!("too many hyphens: {expr}")));
    }
    let (mut start, mut end, mut star) = if bounds[0] == "*" || bounds[0] == "?" {
        if bounds.len() == 2 {
            return Err(invalid(format!("too many hyphens: {expr}")));
        }
        (b.min, b.max, true)
    } else {
        let start = value(bounds[0], b)?;
        let end = if bounds.len() == 2 { value(bounds[1], b)? } else { start };
        (start, end, false)
    };
    let step = if parts.len() == 2 {
        let step = value(parts[1], b)?;
        if bounds.len() == 1 && !star {
            // "n/step" runs from n to the field's maximum.
            end = b.max;
        }
        if step > 1 {
            star = false;
        }
        step
    } else {
        1
    };
    if start < b.min {
        return Err(invalid(format!("beginning of range ({start}) below minimum ({}): {expr}", b.min)));
    }
    if end > b.max {
        return Err(invalid(format!("end of range ({end}) above maximum ({}): {expr}", b.max)));
    }
    if start > end {
        return Err(invalid(format!("beginning of range ({start}) beyond end of range ({end}): {expr}")));
    }
    if step == 0 {
        return Err(invalid(format!("step of range should be a positive number: {expr}")));
    }
    let mut bits = 0u64;
    while start <= end {
        bits |= 1 << start;
        start += step;
    }
    Ok((bits, star))
}

fn field(text: &str, b: &Bounds) -> Result<(u64, bool), CronError> {
    let mut bits = 0;
    let mut star = false;
    for expr in text.split(',') {
        let (b2, s) = range(expr, b)?;
        bits |= b2;
        star |= s;
    }
    Ok((bits, star))
}

impl Schedule {
    /// Parses a schedule as the API server validates `spec.schedule`.
    pub fn parse(spec: &str) -> Result<Schedule, CronError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(invalid("empty spec string"));
        }
        if let Some(d) = spec.strip_prefix('@') {
            let fields = match d {
                "yearly" | "annually" => "0 0 1 1 *",
                "monthly" => "0 0 1 * *",
                "weekly" => "0 0 * * 0",
                "daily" | "midnight" => "0 0 * * *",
                "hourly" => "0 * * * *",
                _ => {
                    if let Some(every) = d.strip_prefix("every ") {
                        let nanos = crate::duration::parse_go_duration(every.trim())
                            .map_err(|e| invalid(format!("failed to parse duration {spec}: {e}")))?;
                        if nanos <= 0 {
                            return Err(invalid(format!("failed to parse duration {spec}: the duration must be positive")));
                        }
                        // Sub-second parts are dropped, and the least is one second.
                        let secs = (u64::try_from(nanos).unwrap_or(0) / 1_000_000_000).max(1);
                        return Ok(Schedule { kind: Kind::Every(Duration::from_secs(secs)) });
                    }
                    return Err(invalid(format!("unrecognized descriptor: {spec}")));
                }
            };
            return Schedule::parse(fields);
        }
        let parts: Vec<&str> = spec.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(invalid(format!("expected exactly 5 fields, found {}: {spec}", parts.len())));
        }
        let (minute, _) = field(parts[0], &MINUTE)?;
        let (hour, _) = field(parts[1], &HOUR)?;
        let (dom, dom_star) = field(parts[2], &DOM)?;
        let (month, _) = field(parts[3], &MONTH)?;
        let (dow, dow_star) = field(parts[4], &DOW)?;
        Ok(Schedule { kind: Kind::Fields(Fields { minute, hour, dom, month, dow, dom_star, dow_star }) })
    }

    /// The first time strictly after `after` the schedule fires, in `after`'s time zone; `None`
    /// when nothing matches within five years (e.g. `0 0 30 2 *`).
    pub fn next_after(&self, after: &Zoned) -> Option<Zoned> {
        let f = match &self.kind {
            Kind::Every(d) => {
                let secs = i64::try_from(d.as_secs()).ok()?;
                let base = after.timestamp().as_second();
                let ts = jiff::Timestamp::from_second(base.checked_add(secs)?).ok()?;
                return Some(ts.to_zoned(after.time_zone().clone()));
            }
            Kind::Fields(f) => *f,
        };
        let tz = after.time_zone().clone();
        let start = after.datetime();
        // Next whole minute strictly after `after`.
        let mut c = start.with().second(0).subsec_nanosecond(0).build().ok()?.checked_add(1.minute()).ok()?;
        let limit = start.checked_add(5.years()).ok()?;
        while c <= limit {
            if f.month & (1 << c.month()) == 0 {
                c = c.first_of_month().checked_add(1.month()).ok()?.with().hour(0).minute(0).build().ok()?;
                continue;
            }
            if !f.day_matches(&c) {
                c = c.date().checked_add(1.day()).ok()?.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if f.hour & (1 << c.hour()) == 0 {
                c = c.with().minute(0).build().ok()?.checked_add(1.hour()).ok()?;
                continue;
            }
            if f.minute & (1 << c.minute()) == 0 {
                c = c.checked_add(1.minute()).ok()?;
                continue;
            }
            if let Some(z) = instant(&tz, c, after) {
                return Some(z);
            }
            c = c.checked_add(1.minute()).ok()?;
        }
        None
    }

    /// Every time the schedule fired in (`after`, `until`], oldest first, at most `max` of
    /// them (the CronJob controller's "too many missed start times" counts up to 100).
    pub fn times_between(&self, after: &Zoned, until: &Zoned, max: usize) -> Vec<Zoned> {
        let mut out = Vec::new();
        let mut t = after.clone();
        while out.len() < max {
            match self.next_after(&t) {
                Some(n) if n.timestamp() <= until.timestamp() => {
                    t = n.clone();
                    out.push(n);
                }
                _ => break,
            }
        }
        out
    }
}

impl Fields {
    fn day_matches(&self, c: &DateTime) -> bool {
        let dom = self.dom & (1 << c.day()) != 0;
        let dow = self.dow & (1 << c.weekday().to_sunday_zero_offset()) != 0;
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }
}

/// The instant of wall-clock time `c` in `tz` that is after `after`: none in a gap, the first
/// occurrence in a fold (the second only if the first is not after `after`).
fn instant(tz: &TimeZone, c: DateTime, after: &Zoned) -> Option<Zoned> {
    let candidates = match tz.to_ambiguous_zoned(c).offset() {
        AmbiguousOffset::Unambiguous { offset } => vec![offset],
        AmbiguousOffset::Gap { .. } => return None,
        AmbiguousOffset::Fold { before, after } => vec![before, after],
    };
    candidates
        .into_iter()
        .filter_map(|o| o.to_timestamp(c).ok())
        .find(|ts| *ts > after.timestamp())
        .map(|ts| ts.to_zoned(tz.clone()))
}

/// The IANA time zone `name` (a CronJob's `spec.timeZone`); "Local" and "" are refused, as the
/// API server does, since they would depend on the controller's machine.
pub fn time_zone(name: &str) -> Result<TimeZone, CronError> {
    if name.is_empty() || name.eq_ignore_ascii_case("local") {
        return Err(CronError::UnknownTimeZone(name.to_string()));
    }
    TimeZone::get(name).map_err(|_| CronError::UnknownTimeZone(name.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(tz: &str, text: &str) -> Zoned {
        let dt: DateTime = text.parse().unwrap();
        dt.to_zoned(time_zone(tz).unwrap()).unwrap()
    }

    fn next(spec: &str, tz: &str, from: &str) -> String {
        let z = Schedule::parse(spec).unwrap().next_after(&at(tz, from)).unwrap();
        z.strftime("%Y-%m-%dT%H:%M %Z").to_string()
    }

    #[test]
    fn the_standard_syntax_is_accepted_as_upstream_does() {
        for ok in [
            "* * * * *", "*/5 * * * *", "0 0 * * 0", "15,45 9-17 * * MON-FRI", "0 0 1 jan,JUL *", "? ? ? ? ?", "5/15 * * * *",
            "@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually", "@every 90m",
        ] {
            assert!(Schedule::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bad_schedules_fail_with_robfigs_words() {
        let err = |s: &str| Schedule::parse(s).unwrap_err().to_string();
        assert_eq!(err("* * *"), "expected exactly 5 fields, found 3: * * *");
        assert_eq!(err(""), "empty spec string");
        assert_eq!(err("60 * * * *"), "end of range (60) above maximum (59): 60");
        assert_eq!(err("* * 0 * *"), "beginning of range (0) below minimum (1): 0");
        assert_eq!(err("5-1 * * * *"), "beginning of range (5) beyond end of range (1): 5-1");
        assert_eq!(err("*/0 * * * *"), "step of range should be a positive number: */0");
        assert_eq!(err("1/2/3 * * * *"), "too many slashes: 1/2/3");
        assert_eq!(err("1-2-3 * * * *"), "too many hyphens: 1-2-3");
        assert_eq!(err("@fortnightly"), "unrecognized descriptor: @fortnightly");
        assert!(err("x * * * *").starts_with("failed to parse int from x"));
        assert_eq!(err("* * * * 7"), "end of range (7) above maximum (6): 7");
    }

    #[test]
    fn next_times_follow_the_fields() {
        assert_eq!(next("*/15 * * * *", "UTC", "2026-11-26T10:07:30"), "2026-11-26T10:15 UTC");
        assert_eq!(next("*/15 * * * *", "UTC", "2026-11-26T10:15:00"), "2026-11-26T10:30 UTC", "strictly after");
        assert_eq!(next("0 9 * * MON-FRI", "UTC", "2026-11-27T09:00:00"), "2026-11-30T09:00 UTC", "Friday -> Monday");
        assert_eq!(next("@monthly", "UTC", "2026-11-26T10:00:00"), "2026-12-01T00:00 UTC");
        assert_eq!(next("@yearly", "UTC", "2026-11-26T10:00:00"), "2027-01-01T00:00 UTC");
        assert_eq!(next("0 0 29 2 *", "UTC", "2026-03-01T00:00:00"), "2028-02-29T00:00 UTC");
        assert!(Schedule::parse("0 0 30 2 *").unwrap().next_after(&at("UTC", "2026-01-01T00:00:00")).is_none());
        // Both day fields restricted: either matches (the 1st, or any Monday).
        assert_eq!(next("0 0 1 * MON", "UTC", "2026-11-26T00:00:00"), "2026-11-30T00:00 UTC");
        // Day of month restricted, weekday "*": both (so the 1st only).
        assert_eq!(next("0 0 1 * *", "UTC", "2026-11-26T00:00:00"), "2026-12-01T00:00 UTC");
        assert_eq!(
            Schedule::parse("@every 90m").unwrap().next_after(&at("UTC", "2026-11-26T10:00:00")).unwrap().timestamp(),
            at("UTC", "2026-11-26T11:30:00").timestamp()
        );
    }

    #[test]
    fn daylight_saving_changes_skip_missing_times_and_run_repeated_ones_once() {
        // New York, 2026-03-08: 02:00 -> 03:00. A 02:30 run does not exist that day.
        assert_eq!(next("30 2 * * *", "America/New_York", "2026-03-07T03:00:00"), "2026-03-09T02:30 EDT");
        assert_eq!(next("0 * * * *", "America/New_York", "2026-03-08T01:30:00"), "2026-03-08T03:00 EDT");
        // 2026-11-01: 02:00 -> 01:00. 01:30 happens twice; it runs once, at the first.
        let s = Schedule::parse("30 1 * * *").unwrap();
        let first = s.next_after(&at("America/New_York", "2026-11-01T00:00:00")).unwrap();
        assert_eq!(first.strftime("%H:%M %Z").to_string(), "01:30 EDT");
        let second = s.next_after(&first).unwrap();
        assert_eq!(second.strftime("%Y-%m-%dT%H:%M %Z").to_string(), "2026-11-02T01:30 EST");
        // Hourly across the fold: 01:00 EDT, (01:00 EST is the same wall-clock time: once), 02:00 EST.
        let hourly = Schedule::parse("0 * * * *").unwrap();
        let a = hourly.next_after(&at("America/New_York", "2026-11-01T00:30:00")).unwrap();
        let b = hourly.next_after(&a).unwrap();
        assert_eq!((a.strftime("%H:%M %Z").to_string(), b.strftime("%H:%M %Z").to_string()), ("01:00 EDT".into(), "02:00 EST".into()));
    }

    #[test]
    fn missed_times_are_counted_oldest_first_up_to_a_maximum() {
        let s = Schedule::parse("*/10 * * * *").unwrap();
        let times = s.times_between(&at("UTC", "2026-11-26T10:00:00"), &at("UTC", "2026-11-26T11:00:00"), 100);
        assert_eq!(times.len(), 6);
        assert_eq!(times[0].timestamp(), at("UTC", "2026-11-26T10:10:00").timestamp());
        assert_eq!(times[5].timestamp(), at("UTC", "2026-11-26T11:00:00").timestamp());
        assert_eq!(s.times_between(&at("UTC", "2026-11-26T00:00:00"), &at("UTC", "2026-11-27T00:00:00"), 100).len(), 100);
    }

    #[test]
    fn time_zones_are_iana_names() {
        assert!(time_zone("Europe/Paris").is_ok());
        assert!(time_zone("UTC").is_ok());
        assert_eq!(time_zone("Mars/Olympus").unwrap_err().to_string(), "unknown time zone Mars/Olympus");
        assert!(time_zone("Local").is_err());
        assert!(time_zone("").is_err());
    }
}
