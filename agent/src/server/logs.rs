//! Container logs: the CRI log file format and the options of `GET /containerLogs`.
//!
//! The runtime writes one record per line: `<RFC3339Nano time> <stdout|stderr> <P|F> <content>`
//! where `P` marks a partial record that continues in the next one (the runtime splits long
//! lines) and `F` a full one. Records are joined here into logical lines; the options (tail,
//! since, timestamps, limitBytes) apply to logical lines, which carry the time of their first
//! record.

use jiff::Timestamp;

/// The query options of `GET /containerLogs/...` (upstream's PodLogOptions subset the agent
/// receives).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub tail_lines: Option<u64>,
    pub timestamps: bool,
    pub previous: bool,
    /// Only lines at or after this time (from sinceSeconds or sinceTime).
    pub since: Option<Timestamp>,
    pub limit_bytes: Option<u64>,
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "" | "true" | "1" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "f" | "F" => Ok(false),
        _ => Err(format!("invalid value {v:?} for {key}: not a boolean")),
    }
}

fn parse_count(key: &str, v: &str) -> Result<u64, String> {
    v.parse::<i64>()
        .map_err(|_| format!("invalid value {v:?} for {key}: not an integer"))
        .and_then(|n| u64::try_from(n).map_err(|_| format!("{key} must be greater than or equal to 0")))
}

impl LogOptions {
    /// Parses the query; `now` resolves sinceSeconds. Errors are 400 messages.
    pub fn parse(query: Option<&str>, now: Timestamp) -> Result<LogOptions, String> {
        let mut o = LogOptions::default();
        let mut since_seconds = None;
        let mut since_time = None;
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "follow" => o.follow = parse_bool("follow", &v)?,
                "timestamps" => o.timestamps = parse_bool("timestamps", &v)?,
                "previous" => o.previous = parse_bool("previous", &v)?,
                "tailLines" => o.tail_lines = Some(parse_count("tailLines", &v)?),
                "limitBytes" => {
                    let n = parse_count("limitBytes", &v)?;
                    if n == 0 {
                        return Err("limitBytes must be greater than zero".into());
                    }
                    o.limit_bytes = Some(n);
                }
                "sinceSeconds" => {
                    let n = parse_count("sinceSeconds", &v)?;
                    if n == 0 {
                        return Err("sinceSeconds must be greater than zero".into());
                    }
                    since_seconds = Some(n);
                }
                "sinceTime" => {
                    let t: Timestamp = v.parse().map_err(|e| format!("invalid value {v:?} for sinceTime: {e}"))?;
                    since_time = Some(t);
                }
                _ => {}
            }
        }
        o.since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => return Err("at most one of sinceTime or sinceSeconds may be specified".into()),
            (Some(s), None) => {
                let secs = i64::try_from(s).unwrap_or(i64::MAX);
                Some(now.checked_sub(jiff::SignedDuration::from_secs(secs)).unwrap_or(Timestamp::MIN))
            }
            (None, t) => t,
        };
        Ok(o)
    }
}

/// One record of a CRI log file.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub stream: &'a str,
    pub partial: bool,
    pub content: &'a [u8],
}

/// Parses one record (without its trailing newline). `None` for a malformed line.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(3, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?.parse::<Timestamp>().ok()?;
    let stream = std::str::from_utf8(parts.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let rest = parts.next().unwrap_or(b"");
    let (partial, content) = match rest {
        [b'P'] => (true, &rest[1..]),
        [b'F'] => (false, &rest[1..]),
        [b'P', b' ', c @ ..] => (true, c),
        [b'F', b' ', c @ ..] => (false, c),
        // Older runtimes wrote no tag: the rest is the content of a full line.
        _ => (false, rest),
    };
    Some(Record { time, stream, partial, content })
}

/// A logical line: the joined content of its records, with the newline, and the time of its
/// first record.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub time: Timestamp,
    pub content: Vec<u8>,
}

/// Joins records into logical lines. Feed it the bytes of the file in order; it keeps an
/// unfinished trailing record and a pending partial line between calls.
#[derive(Debug, Default)]
pub struct Joiner {
    buf: Vec<u8>,
    pending: Option<Line>,
}

impl Joiner {
    /// Adds bytes read from the file and returns the lines they complete.
    pub fn push(&mut self, data: &[u8]) -> Vec<Line> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let end = start + nl;
            if let Some(rec) = parse_record(&self.buf[start..end]) {
                let line = self.pending.get_or_insert_with(|| Line { time: rec.time, content: Vec::new() });
                line.content.extend_from_slice(rec.content);
                if !rec.partial {
                    line.content.push(b'\n');
                    if let Some(l) = self.pending.take() {
                        out.push(l);
                    }
                }
            }
            start = end + 1;
        }
        self.buf.drain(..start);
        out
    }

    /// The file was replaced (rotation): drops an unfinished record.
    pub fn reset(&mut self) {
        self.buf.clear();
    }
}

/// upstream's RFC3339NanoFixed in UTC: `2006-01-02T15:04:05.000000000Z`.
pub fn format_time(t: Timestamp) -> String {
    format!("{}.{:09}Z", t.strftime("%Y-%m-%dT%H:%M:%S"), t.subsec_nanosecond())
}

/// Applies since/timestamps/limitBytes to lines as they are produced (tail is applied by the
/// caller on the initial lines). Tracks the remaining byte budget.
#[derive(Debug)]
pub struct Writer {
    since: Option<Timestamp>,
    timestamps: bool,
    remaining: Option<u64>,
}

impl Writer {
    pub fn new(o: &LogOptions) -> Writer {
        Writer { since: o.since, timestamps: o.timestamps, remaining: o.limit_bytes }
    }

    /// The bytes to send for `lines`.
    pub fn render(&mut self, lines: &[Line]) -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines {
            if self.done() {
                break;
            }
            if self.since.is_some_and(|s| l.time < s) {
                continue;
            }
            let mut bytes = Vec::with_capacity(l.content.len() + 32);
            if self.timestamps {
                bytes.extend_from_slice(format_time(l.time).as_bytes());
                bytes.push(b' ');
            }
            bytes.extend_from_slice(&l.content);
            if let Some(rem) = self.remaining.as_mut() {
                let n = usize::try_from(*rem).unwrap_or(usize::MAX).min(bytes.len());
                bytes.truncate(n);
                *rem -= n as u64;
            }
            out.extend_from_slice(&bytes);
        }
        out
    }

    /// The byte limit is used up.
    pub fn done(&self) -> bool {
        self.remaining == Some(0)
    }
}

/// The last `n` lines (all with `None`).
pub fn tail(mut lines: Vec<Line>, n: Option<u64>) -> Vec<Line> {
    if let Some(n) = n {
        let keep = usize::try_from(n).unwrap_or(usize::MAX);
        if lines.len() > keep {
            lines.drain(..lines.len() - keep);
        }
    }
    lines
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-11-22T00:00:01.000000001Z stdout F one
2026-11-22T00:00:02.5Z stderr P tw
2026-11-22T00:00:02.6Z stderr F o
2026-11-22T00:00:03+00:00 stdout F three
garbage
2026-11-22T00:00:04.000000000Z stdout F 
";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn all(log: &str) -> Vec<Line> {
        Joiner::default().push(log.as_bytes())
    }

    fn text(lines: &[Line], o: &LogOptions) -> String {
        String::from_utf8(Writer::new(o).render(&tail(lines.to_vec(), o.tail_lines))).unwrap()
    }

    #[test]
    fn records_parse() {
        let r = parse_record(b"2026-11-22T00:00:02.5Z stderr P a b").unwrap();
        assert_eq!(r, Record { time: t("2026-11-22T00:00:02.5Z"), stream: "stderr", partial: true, content: b"a b" });
        assert!(parse_record(b"2026-11-22T00:00:02.5Z stdin F x").is_none());
        assert!(parse_record(b"yesterday stdout F x").is_none());
        assert_eq!(parse_record(b"2026-11-22T00:00:02Z stdout F").unwrap().content, b"");
    }

    #[test]
    fn partial_records_join_and_keep_the_first_time() {
        let lines = all(LOG);
        let texts: Vec<&[u8]> = lines.iter().map(|l| l.content.as_slice()).collect();
        assert_eq!(texts, [&b"one\n"[..], b"two\n", b"three\n", b"\n"]);
        assert_eq!(lines[1].time, t("2026-11-22T00:00:02.5Z"));
    }

    #[test]
    fn joiner_keeps_unfinished_records_across_reads() {
        let mut j = Joiner::default();
        let (a, b) = LOG.split_at(50);
        let mut lines = j.push(a.as_bytes());
        lines.extend(j.push(b.as_bytes()));
        assert_eq!(lines, all(LOG));
        // A partial line with no continuation yet is not emitted.
        assert!(j.push(b"2026-11-22T00:00:05Z stdout P half").is_empty());
        assert!(j.push(b"\n").is_empty());
        assert_eq!(j.push(b"2026-11-22T00:00:06Z stdout F done\n")[0].content, b"halfdone\n");
    }

    #[test]
    fn options_tail_since_timestamps_limit() {
        let lines = all(LOG);
        let now = t("2026-11-22T00:00:04Z");
        let o = |q: &str| LogOptions::parse(Some(q), now).unwrap();
        assert_eq!(text(&lines, &o("")), "one\ntwo\nthree\n\n");
        assert_eq!(text(&lines, &o("tailLines=2")), "three\n\n");
        assert_eq!(text(&lines, &o("tailLines=0")), "");
        assert_eq!(text(&lines, &o("tailLines=10")), "one\ntwo\nthree\n\n");
        assert_eq!(text(&lines, &o("sinceTime=2026-11-22T00:00:02Z")), "two\nthree\n\n");
        assert_eq!(text(&lines, &o("sinceSeconds=1")), "three\n\n");
        assert_eq!(text(&lines, &o("limitBytes=6")), "one\ntw");
        assert_eq!(
            text(&lines, &o("timestamps=true&tailLines=1")),
            "2026-11-22T00:00:04.000000000Z \n"
        );
        assert_eq!(
            text(&lines, &o("timestamps=1&limitBytes=40")),
            "2026-11-22T00:00:01.000000001Z one\n2026-"
        );
        let f = o("follow=true&previous=true");
        assert!(f.follow && f.previous && !f.timestamps);
    }

    #[test]
    fn bad_options_are_rejected() {
        let now = Timestamp::UNIX_EPOCH;
        for q in ["tailLines=x", "tailLines=-1", "limitBytes=0", "sinceSeconds=0", "follow=maybe", "sinceTime=now"] {
            assert!(LogOptions::parse(Some(q), now).is_err(), "{q}");
        }
        let e = LogOptions::parse(Some("sinceSeconds=1&sinceTime=2026-11-22T00:00:02Z"), now).unwrap_err();
        assert_eq!(e, "at most one of sinceTime or sinceSeconds may be specified");
    }
}
