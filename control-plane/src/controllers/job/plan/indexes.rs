//! Completion indexes of Indexed Jobs as ordered, merged intervals, in the text form of
//! `status.completedIndexes` / `status.failedIndexes` and `successPolicy` rules
//! (`"1,3-5,7"`; two neighbours are written `"3,4"`, as upstream does).

use std::collections::BTreeSet;
use std::fmt;

/// Closed interval of indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub first: u32,
    pub last: u32,
}

/// Sorted, non-overlapping, non-adjacent intervals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Indexes(Vec<Interval>);

impl Indexes {
    /// Parses the text form, ignoring corrupted intervals and everything at or past
    /// `completions` (upstream `parseIndexesFromString`).
    pub fn parse(text: &str, completions: u32) -> Indexes {
        let mut out: Vec<Interval> = Vec::new();
        if text.is_empty() {
            return Indexes(out);
        }
        for part in text.split(',') {
            let mut limits = part.split('-');
            let Some(Ok(first)) = limits.next().map(str::parse::<u32>) else { continue };
            if first >= completions {
                break;
            }
            let last = match limits.next() {
                Some(l) => match l.parse::<u32>() {
                    Ok(l) => l.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            if last < first {
                continue;
            }
            out.push(Interval { first, last });
        }
        // normalise whatever order the text had
        Indexes(merge(out))
    }

    /// The indexes of a set.
    pub fn from_set(set: &BTreeSet<u32>) -> Indexes {
        Indexes(merge(set.iter().map(|&i| Interval { first: i, last: i }).collect()))
    }

    /// This set with more indexes.
    pub fn with(&self, more: impl IntoIterator<Item = u32>) -> Indexes {
        let mut all = self.0.clone();
        all.extend(more.into_iter().map(|i| Interval { first: i, last: i }));
        Indexes(merge(all))
    }

    /// The union of two sets.
    pub fn union(&self, other: &Indexes) -> Indexes {
        let mut all = self.0.clone();
        all.extend(other.0.iter().copied());
        Indexes(merge(all))
    }

    pub fn total(&self) -> usize {
        self.0.iter().map(|i| (i.last - i.first) as usize + 1).sum()
    }

    pub fn has(&self, ix: u32) -> bool {
        self.0.iter().any(|i| i.first <= ix && ix <= i.last)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn intervals(&self) -> &[Interval] {
        &self.0
    }

    /// How many indexes of `self` are also in `other`.
    pub fn overlap(&self, other: &Indexes) -> usize {
        let mut n = 0;
        for a in &self.0 {
            for b in &other.0 {
                let lo = a.first.max(b.first);
                let hi = a.last.min(b.last);
                if lo <= hi {
                    n += (hi - lo) as usize + 1;
                }
            }
        }
        n
    }

    /// The first `count` indexes below `completions` that are not in the set.
    pub fn first_missing(&self, count: usize, completions: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut candidate = 0u32;
        for iv in &self.0 {
            while candidate < completions && out.len() < count && candidate < iv.first {
                out.push(candidate);
                candidate += 1;
            }
            candidate = candidate.max(iv.last.saturating_add(1));
        }
        while candidate < completions && out.len() < count {
            out.push(candidate);
            candidate += 1;
        }
        out
    }
}

fn merge(mut all: Vec<Interval>) -> Vec<Interval> {
    all.sort_by_key(|i| (i.first, i.last));
    let mut out: Vec<Interval> = Vec::with_capacity(all.len());
    for iv in all {
        match out.last_mut() {
            Some(last) if iv.first <= last.last.saturating_add(1) => last.last = last.last.max(iv.last),
            _ => out.push(iv),
        }
    }
    out
}

impl fmt::Display for Indexes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, iv) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}", iv.first)?;
            if iv.last == iv.first + 1 {
                write!(f, ",{}", iv.last)?;
            } else if iv.last > iv.first {
                write!(f, "-{}", iv.last)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_as_upstream_writes_it() {
        let ix = Indexes::parse("0,1,3-5,7", 10);
        assert_eq!(ix.to_string(), "0,1,3-5,7");
        assert_eq!(ix.total(), 6);
        assert!(ix.has(4) && !ix.has(2) && !ix.has(6));
        assert_eq!(Indexes::parse("1-2", 10).to_string(), "1,2");
        assert_eq!(ix.with([2, 6]).to_string(), "0-7");
    }

    #[test]
    fn parse_drops_corrupt_and_out_of_range_parts() {
        assert_eq!(Indexes::parse("0,x,2-y,3-9,12", 5).to_string(), "0,3,4");
        assert_eq!(Indexes::parse("7", 5).total(), 0);
        assert!(Indexes::parse("", 5).is_empty());
    }

    #[test]
    fn first_missing_skips_the_set() {
        let ix = Indexes::parse("1,3-4", 10);
        assert_eq!(ix.first_missing(3, 10), vec![0, 2, 5]);
        assert_eq!(ix.first_missing(10, 6), vec![0, 2, 5]);
        assert!(ix.first_missing(0, 6).is_empty());
    }

    #[test]
    fn overlap_counts_common_indexes() {
        let a = Indexes::parse("0-4,8", 10);
        let b = Indexes::parse("3-8", 10);
        assert_eq!(a.overlap(&b), 3);
        assert_eq!(a.union(&b).to_string(), "0-8");
    }
}
