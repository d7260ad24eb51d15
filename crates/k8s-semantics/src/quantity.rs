//! resource.Quantity, exactly: "100m", "1.5Gi", "129e6", "-2k". A parsed quantity is an
//! integer mantissa with a power of ten (binary suffixes are folded into the mantissa), so
//! sums, comparisons and scaling never go through floating point.
//!
//! - [`Quantity::scaled`] is upstream's ScaledValue: value × scale, rounded up (toward +∞);
//!   [`Quantity::value`] (scale 1) and [`Quantity::milli`] (scale 1000) are Value/MilliValue.
//! - [`Milli`] is a value in thousandths for arithmetic (the scheduler's resource fit, the
//!   agent's admission, the volume binder's capacity comparison).
//! - [`Quantity::canonical`] is Quantity.String(): "1024Mi" -> "1Gi", "1000" -> "1k",
//!   "0.5" -> "500m", values finer than a nano rounded up to whole nanos.

use std::fmt;

/// A quantity that does not parse, with upstream's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}")]
pub struct QuantityError(pub String);

/// The suffix family a quantity was written in (its canonical form keeps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

/// A parsed quantity: `mantissa` × 10^`exp10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    pub mantissa: i128,
    pub exp10: i32,
    pub format: Format,
}

/// The most digits a mantissa may have (i128 holds 38; binary suffixes multiply by up to 2^60).
const MAX_DIGITS: usize = 19;

impl Quantity {
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let err = || QuantityError(text.to_string());
        let t = text.trim();
        let (negative, rest) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(end);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(err());
        }
        let (format, dec_exp, bin_exp): (Format, i32, u32) = match suffix {
            "" => (Format::DecimalSI, 0, 0),
            "n" => (Format::DecimalSI, -9, 0),
            "u" => (Format::DecimalSI, -6, 0),
            "m" => (Format::DecimalSI, -3, 0),
            "k" => (Format::DecimalSI, 3, 0),
            "M" => (Format::DecimalSI, 6, 0),
            "G" => (Format::DecimalSI, 9, 0),
            "T" => (Format::DecimalSI, 12, 0),
            "P" => (Format::DecimalSI, 15, 0),
            "E" => (Format::DecimalSI, 18, 0),
            "Ki" => (Format::BinarySI, 0, 10),
            "Mi" => (Format::BinarySI, 0, 20),
            "Gi" => (Format::BinarySI, 0, 30),
            "Ti" => (Format::BinarySI, 0, 40),
            "Pi" => (Format::BinarySI, 0, 50),
            "Ei" => (Format::BinarySI, 0, 60),
            s => {
                let e = s.strip_prefix(['e', 'E']).ok_or_else(err)?;
                let e: i32 = e.parse().map_err(|_| err())?;
                if !(-30..=30).contains(&e) {
                    return Err(err());
                }
                (Format::DecimalExponent, e, 0)
            }
        };
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        // trailing zeros of the fraction do not count toward the limit
        let significant = digits.trim_end_matches('0');
        if significant.len() > MAX_DIGITS + 9 {
            return Err(err());
        }
        let mut mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err())?
        };
        mantissa = mantissa.checked_mul(1i128 << bin_exp).ok_or_else(err)?;
        if negative {
            mantissa = -mantissa;
        }
        let exp10 = dec_exp - i32::try_from(frac_part.len()).map_err(|_| err())?;
        Ok(Quantity {
            mantissa,
            exp10,
            format,
        })
    }

    /// Upstream's ScaledValue: the quantity times `scale`, rounded up (toward +∞); None when
    /// it does not fit.
    pub fn scaled(&self, scale: i128) -> Option<i128> {
        let n = self.mantissa.checked_mul(scale)?;
        if self.exp10 >= 0 {
            n.checked_mul(10i128.checked_pow(self.exp10.unsigned_abs())?)
        } else {
            let d = 10i128.checked_pow(self.exp10.unsigned_abs())?;
            Some(n.div_euclid(d) + i128::from(n.rem_euclid(d) != 0))
        }
    }

    /// Whole units, rounded up (upstream's Value).
    pub fn value(&self) -> Option<i128> {
        self.scaled(1)
    }

    /// Thousandths, rounded up (upstream's MilliValue).
    pub fn milli(&self) -> Option<i128> {
        self.scaled(1000)
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// The canonical text upstream prints (Quantity.String()).
    pub fn canonical(&self) -> String {
        self.canonical_checked()
            .unwrap_or_else(|| format!("{}e{}", self.mantissa, self.exp10))
    }

    fn canonical_checked(&self) -> Option<String> {
        let mut mantissa = self.mantissa;
        let mut exp = self.exp10;
        // values finer than a nano are rounded up (away from zero) to whole nanos
        if exp < -9 {
            let divisor = 10i128.checked_pow(u32::try_from(-9 - exp).ok()?)?;
            let (q, r) = (mantissa / divisor, mantissa % divisor);
            mantissa = if r == 0 { q } else { q + mantissa.signum() };
            exp = -9;
        }
        let mut format = self.format;
        if format == Format::BinarySI {
            // |value| < 1024 and non-integers print as decimal; integers in powers of 1024
            let integer = if exp >= 0 {
                mantissa.checked_mul(10i128.checked_pow(u32::try_from(exp).ok()?)?)
            } else {
                let divisor = 10i128.checked_pow(u32::try_from(-exp).ok()?)?;
                (mantissa % divisor == 0).then(|| mantissa / divisor)
            };
            let small = match integer {
                Some(v) => v.abs() < 1024,
                None => {
                    let divisor = 10i128.checked_pow(u32::try_from(-exp).ok()?)?;
                    mantissa.abs() < 1024i128.checked_mul(divisor)?
                }
            };
            match integer {
                Some(mut v) if !small => {
                    let mut power = 0usize;
                    while v != 0 && v % 1024 == 0 && power < 6 {
                        v /= 1024;
                        power += 1;
                    }
                    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
                    return Some(format!("{v}{suffix}"));
                }
                _ => format = Format::DecimalSI,
            }
        }
        if mantissa == 0 {
            return Some("0".into());
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp += 1;
        }
        match exp.rem_euclid(3) {
            1 => {
                mantissa = mantissa.checked_mul(10)?;
                exp -= 1;
            }
            2 => {
                mantissa = mantissa.checked_mul(100)?;
                exp -= 2;
            }
            _ => {}
        }
        let suffix = match (format, exp) {
            (_, 0) => String::new(),
            (Format::DecimalExponent, e) => format!("e{e}"),
            (_, -9) => "n".into(),
            (_, -6) => "u".into(),
            (_, -3) => "m".into(),
            (_, 3) => "k".into(),
            (_, 6) => "M".into(),
            (_, 9) => "G".into(),
            (_, 12) => "T".into(),
            (_, 15) => "P".into(),
            (_, 18) => "E".into(),
            (_, e) => format!("e{e}"),
        };
        Some(format!("{mantissa}{suffix}"))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// A value in thousandths of the base unit (millicores, millibytes), rounded up like
/// upstream's MilliValue; saturating arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Milli(pub i128);

impl Milli {
    /// The value in whole base units, rounded up (upstream's Value).
    pub fn value(self) -> i128 {
        let q = self.0.div_euclid(1000);
        if self.0.rem_euclid(1000) == 0 {
            q
        } else {
            q + 1
        }
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

impl std::iter::Sum for Milli {
    fn sum<I: Iterator<Item = Milli>>(iter: I) -> Milli {
        iter.fold(Milli(0), |a, b| a + b)
    }
}

/// Parses `text` into thousandths (rounded up).
/// A byte count as upstream's `resource.NewQuantity(n, resource.BinarySI)` prints it (what
/// provisioners put in a PV's capacity): `67108864` -> `64Mi`, `1000` -> `1k`.
pub fn binary_si(bytes: i64) -> String {
    Quantity {
        mantissa: i128::from(bytes),
        exp10: 0,
        format: Format::BinarySI,
    }
    .canonical()
}

pub fn parse_milli(text: &str) -> Result<Milli, QuantityError> {
    let q = Quantity::parse(text)?;
    q.milli()
        .map(Milli)
        .ok_or_else(|| QuantityError(text.to_string()))
}

/// `text` times `scale`, rounded up (see [`Quantity::scaled`]); None when it does not parse
/// or fit.
pub fn scaled(text: &str, scale: i128) -> Option<i128> {
    Quantity::parse(text).ok()?.scaled(scale)
}

/// Whether two quantity texts have the same value ("1" and "1000m"); false when either does
/// not parse.
pub fn same_value(a: &str, b: &str) -> bool {
    match (Quantity::parse(a), Quantity::parse(b)) {
        (Ok(a), Ok(b)) => a.value_eq(&b),
        _ => false,
    }
}

impl Quantity {
    /// Exact equality of values, whatever their notation.
    pub fn value_eq(&self, other: &Quantity) -> bool {
        let e = self.exp10.min(other.exp10);
        let lift = |q: &Quantity| -> Option<i128> {
            q.mantissa
                .checked_mul(10i128.checked_pow((q.exp10 - e).unsigned_abs())?)
        };
        match (lift(self), lift(other)) {
            (Some(a), Some(b)) => a == b,
            // too far apart to line up: equal only when both are zero
            _ => self.mantissa == 0 && other.mantissa == 0,
        }
    }
}

/// The canonical form of `text`; None when it does not parse.
pub fn canonical(text: &str) -> Option<String> {
    Quantity::parse(text)
        .ok()
        .and_then(|q| q.canonical_checked())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    #[test]
    fn byte_counts_print_as_binary_si() {
        assert_eq!(binary_si(64 << 20), "64Mi");
        assert_eq!(binary_si(1 << 30), "1Gi");
        assert_eq!(binary_si(1536 << 20), "1536Mi");
        assert_eq!(
            binary_si(1000),
            "1k",
            "below 1024 upstream falls back to decimal SI"
        );
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(314572800), "300Mi");
    }

    use super::*;

    #[test]
    fn milli_values_of_the_usual_forms() {
        for (text, want) in [
            ("100m", 100),
            ("1", 1000),
            ("1.5", 1500),
            ("0.1", 100),
            ("1Ki", 1024 * 1000),
            ("1.5Gi", 1536 * 1024 * 1024 * 1000),
            ("128974848", 128_974_848_000),
            ("129e6", 129_000_000_000),
            ("1k", 1_000_000),
            ("1n", 1),
            ("1500u", 2),
            ("-1", -1000),
            ("0", 0),
            ("+2", 2000),
            (".5", 500),
            ("5.", 5000),
            ("1E3", 1_000_000),
            ("0.000000000001", 1),
        ] {
            assert_eq!(parse_milli(text).unwrap(), Milli(want), "{text}");
        }
        assert_eq!(parse_milli("123Mi").unwrap().value(), 123 * 1024 * 1024);
        assert_eq!(parse_milli("1.1m").unwrap().value(), 1);
        assert_eq!(scaled("10Gi", 1), Some(10 * (1 << 30)));
        assert_eq!(scaled("1.5", 1), Some(2), "Value rounds up");
        assert_eq!(scaled("-1.5", 1), Some(-1), "toward +inf");
        assert_eq!(scaled("250m", 1024), Some(256));
    }

    #[test]
    fn garbage_is_refused_with_upstreams_message() {
        for bad in [
            "", "abc", "1.2.3", "Gi", "1Qi", "1e", "1e99", "--1", ".", "1 Gi", "1ki", "1e3Gi",
        ] {
            let e = Quantity::parse(bad).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("quantities must match the regular expression"),
                "{bad}"
            );
        }
    }

    #[test]
    fn canonical_forms_as_upstream_prints_them() {
        for (input, want) in [
            ("1024Mi", "1Gi"),
            ("1000", "1k"),
            ("1.5Gi", "1536Mi"),
            ("0.5", "500m"),
            ("100m", "100m"),
            ("1e3", "1e3"),
            ("12e2", "1200"),
            ("1500m", "1500m"),
            ("0", "0"),
            ("512Ki", "512Ki"),
            ("1023", "1023"),
            ("100Mi", "100Mi"),
            ("0.5Gi", "512Mi"),
            ("1.5", "1500m"),
            ("1n", "1n"),
            ("0.1n", "1n"),
            ("-1", "-1"),
            ("2G", "2G"),
        ] {
            assert_eq!(canonical(input).as_deref(), Some(want), "{input}");
        }
        assert_eq!(canonical("abc"), None);
    }

    #[test]
    fn values_compare_across_notations() {
        assert!(same_value("1", "1000m"));
        assert!(same_value("1Gi", "1073741824"));
        assert!(same_value("1k", "1e3"));
        assert!(same_value("0", "0Gi"));
        assert!(!same_value("1", "999999999n"));
        assert!(!same_value("1", "x"));
    }

    #[test]
    fn sums_and_order_are_exact() {
        let a: Milli = ["100m", "200m", "0.7"]
            .iter()
            .map(|t| parse_milli(t).unwrap())
            .sum();
        assert_eq!(a, Milli(1000));
        assert!(parse_milli("1Gi").unwrap() > parse_milli("1G").unwrap());
        assert_eq!(
            parse_milli("1").unwrap() - parse_milli("250m").unwrap(),
            Milli(750)
        );
        // 0.1 + 0.2 is exactly 0.3 here (it is not in f64)
        assert_eq!(
            parse_milli("0.1").unwrap() + parse_milli("0.2").unwrap(),
            parse_milli("0.3").unwrap()
        );
    }
}
