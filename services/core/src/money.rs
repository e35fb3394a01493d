//! Money as integer micro-USD. Prices and budgets are entered as JSON numbers in USD (up to
//! six decimals) and shown the same way; inside the system they are exact integers, so spend
//! never accumulates float error.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An amount of USD held as integer micro-USD (1 USD = 1,000,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Usd(pub i64);

pub const MICROS_PER_USD: i64 = 1_000_000;

impl Usd {
    pub fn micros(self) -> i64 {
        self.0
    }

    /// Parses a plain decimal (`"2.5"`, `"10"`, `"0.000001"`) into micro-USD, refusing more than
    /// six decimals, exponents and signs other than a leading `-`.
    pub fn parse_decimal(text: &str) -> Result<Usd, String> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !all_digits(whole) || !all_digits(frac) || (digits.contains('.') && frac.is_empty()) {
            return Err(format!("{text:?} is not a plain decimal amount"));
        }
        if frac.len() > 6 {
            return Err(format!("{text} has more than 6 decimals (the smallest unit is 0.000001 USD)"));
        }
        let whole: i64 = whole.parse().map_err(|_| format!("{text} is too large"))?;
        let frac_micros: i64 = format!("{frac:0<6}").parse().unwrap_or(0);
        let micros = whole
            .checked_mul(MICROS_PER_USD)
            .and_then(|w| w.checked_add(frac_micros))
            .filter(|m| *m <= 1_000_000_000 * MICROS_PER_USD)
            .ok_or_else(|| format!("{text} is too large (at most 1,000,000,000 USD)"))?;
        Ok(Usd(if negative { -micros } else { micros }))
    }

    /// The decimal rendering with no trailing zeros: `Usd(2_500_000)` → `"2.5"`.
    pub fn to_decimal(self) -> String {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let whole = abs / MICROS_PER_USD as u64;
        let frac = abs % MICROS_PER_USD as u64;
        if frac == 0 {
            format!("{sign}{whole}")
        } else {
            let frac = format!("{frac:06}");
            format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
        }
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // A JSON number, as entered. The decimal text round-trips exactly through f64 for
        // amounts with at most 6 decimals below 1e9.
        let value: f64 = self.to_decimal().parse().map_err(serde::ser::Error::custom)?;
        s.serialize_f64(value)
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(d)?;
        // serde_json prints the shortest text that reads back as the same f64, which is the
        // text the user typed for any amount with at most 6 decimals.
        let text = if let Some(f) = number.as_f64().filter(|_| number.is_f64()) {
            if !f.is_finite() {
                return Err(serde::de::Error::custom("amount must be finite"));
            }
            let shortest = serde_json::Number::from_f64(f).map(|n| n.to_string()).unwrap_or_default();
            expand_exponent(&shortest)
                .ok_or_else(|| serde::de::Error::custom(format!("{shortest} is not a plain decimal amount")))?
        } else {
            number.to_string()
        };
        Usd::parse_decimal(&text).map_err(serde::de::Error::custom)
    }
}

/// serde_json renders tiny or huge floats with an exponent (`1e-6`); turn the small ones back
/// into plain decimals so `0.000001` is accepted and `1e-7` is refused for having 7 decimals.
fn expand_exponent(text: &str) -> Option<String> {
    let Some((mantissa, exp)) = text.split_once(['e', 'E']) else {
        return Some(text.to_string());
    };
    let exp: i32 = exp.parse().ok()?;
    if !(-12..=12).contains(&exp) {
        return None;
    }
    let negative = mantissa.starts_with('-');
    let mantissa = mantissa.trim_start_matches('-');
    let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{frac}");
    let point = whole.len() as i32 + exp;
    let plain = if point <= 0 {
        format!("0.{}{}", "0".repeat((-point) as usize), digits)
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at_checked(point as usize).unwrap_or((&digits, ""));
        format!("{whole}.{fraction}")
    };
    Some(if negative { format!("-{plain}") } else { plain })
}

impl utoipa::PartialSchema for Usd {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Number)
            .description(Some("USD amount, at most 6 decimals"))
            .into()
    }
}
impl utoipa::ToSchema for Usd {}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json(s: &str) -> Result<Usd, String> {
        serde_json::from_str::<Usd>(s).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_user_amounts_exactly() {
        let cases = [
            ("2.5", 2_500_000),
            ("10", 10_000_000),
            ("0.15", 150_000),
            ("0.000001", 1),
            ("1e-6", 1),
            ("500.0", 500_000_000),
            ("123456.789012", 123_456_789_012),
            ("0", 0),
        ];
        for (json, micros) in cases {
            assert_eq!(from_json(json), Ok(Usd(micros)), "{json}");
        }
    }

    #[test]
    fn refuses_sub_micro_and_non_numbers() {
        for bad in ["0.0000001", "\"2.5\"", "1e30", "true", "null"] {
            assert!(from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips_as_the_same_number() {
        for json in ["2.5", "10", "0.15", "0.000001", "123456.789012"] {
            let usd = from_json(json).unwrap();
            let back = serde_json::to_string(&usd).unwrap();
            assert_eq!(from_json(&back), Ok(usd), "{json} -> {back}");
        }
        assert_eq!(Usd(2_500_000).to_decimal(), "2.5");
        assert_eq!(Usd(-1).to_decimal(), "-0.000001");
    }
}
