//! Resource quantities ("100m", "1.5Gi", "2e3") as exact milli-units, for the scheduler's
//! resource fit and the volume binder's capacity comparison.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A parsed quantity in thousandths of the base unit (millicores, millibytes), rounded up like
/// upstream's `MilliValue`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Milli(pub i128);

impl Milli {
    /// The value in whole base units, rounded up (upstream `Value`).
    pub fn value(self) -> i128 {
        let q = self.0.div_euclid(1000);
        if self.0.rem_euclid(1000) == 0 { q } else { q + 1 }
    }
}

impl std::ops::Add for Milli {
    type Output = Milli;
    fn add(self, o: Milli) -> Milli {
        Milli(self.0.saturating_add(o.0))
    }
}

impl std::ops::AddAssign for Milli {
    fn add_assign(&mut self, o: Milli) {
        self.0 = self.0.saturating_add(o.0);
    }
}

impl std::ops::Sub for Milli {
    type Output = Milli;
    fn sub(self, o: Milli) -> Milli {
        Milli(self.0.saturating_sub(o.0))
    }
}

impl std::ops::SubAssign for Milli {
    fn sub_assign(&mut self, o: Milli) {
        self.0 = self.0.saturating_sub(o.0);
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}")]
pub struct QuantityError(pub String);

/// Parses a quantity string.
pub fn parse(s: &str) -> Result<Milli, QuantityError> {
    let err = || QuantityError(s.to_string());
    let t = s.trim();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let num_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(err());
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    // digits as an integer with a decimal exponent: value = digits * 10^exp10 * 2^exp2
    let digits: String = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(err());
    }
    let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| err())? };
    let mut exp10: i32 = -(frac_part.len() as i32);
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        other => {
            let e = other.strip_prefix('e').or_else(|| other.strip_prefix('E')).ok_or_else(err)?;
            let e: i32 = e.parse().map_err(|_| err())?;
            if !(-30..=30).contains(&e) {
                return Err(err());
            }
            exp10 += e;
        }
    }
    // milli-units: multiply by 1000
    exp10 += 3;
    let mut v = mantissa.checked_mul(1i128 << exp2).ok_or_else(err)?;
    if exp10 >= 0 {
        v = v.checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(err)?).ok_or_else(err)?;
    } else {
        let d = 10i128.checked_pow((-exp10) as u32).unwrap_or(i128::MAX);
        // round up (away from zero for positive values), as MilliValue does
        v = v / d + i128::from(v % d != 0);
    }
    Ok(Milli(if neg { -v } else { v }))
}

/// Parses an API quantity; an unparsable one counts as zero (the API server validated it).
pub fn of(q: &Quantity) -> Milli {
    parse(&q.0).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse("100m").unwrap(), Milli(100));
        assert_eq!(parse("1").unwrap(), Milli(1000));
        assert_eq!(parse("1.5").unwrap(), Milli(1500));
        assert_eq!(parse("0.1").unwrap(), Milli(100));
        assert_eq!(parse("1Ki").unwrap(), Milli(1024 * 1000));
        assert_eq!(parse("1.5Gi").unwrap(), Milli(1536 * 1024 * 1024 * 1000));
        assert_eq!(parse("128974848").unwrap(), Milli(128_974_848_000));
        assert_eq!(parse("129e6").unwrap(), Milli(129_000_000_000));
        assert_eq!(parse("123Mi").unwrap().value(), 123 * 1024 * 1024);
        assert_eq!(parse("1k").unwrap(), Milli(1_000_000));
        assert_eq!(parse("1n").unwrap(), Milli(1));
        assert_eq!(parse("1500u").unwrap(), Milli(2));
        assert_eq!(parse("-1").unwrap(), Milli(-1000));
        assert_eq!(parse("0").unwrap(), Milli(0));
        assert_eq!(parse("1.1m").unwrap().value(), 1);
        assert_eq!(parse("10Gi").unwrap().value(), 10 * (1 << 30));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "abc", "1.2.3", "Gi", "1Qi", "1e", "1e99", "--1", "."] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn orders_and_adds() {
        assert!(parse("1Gi").unwrap() > parse("1G").unwrap());
        assert_eq!(parse("500m").unwrap() + parse("0.5").unwrap(), Milli(1000));
        assert_eq!(parse("1").unwrap() - parse("250m").unwrap(), Milli(750));
    }
}
