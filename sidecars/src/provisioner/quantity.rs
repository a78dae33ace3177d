//! Kubernetes resource quantities as bytes, the way apimachinery reads and
//! writes them: `Quantity::Value()` (rounded up to a whole byte) and
//! `NewQuantity(bytes, BinarySI).String()` (what upstream puts into the PV).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Why a quantity cannot be read as a byte count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a quantity")]
    Syntax(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} does not fit into 64 bits")]
    Overflow(String),
}

/// The quantity in bytes, rounded up to a whole byte like `Quantity.Value()`.
///
/// Grammar (apimachinery): `<sign>?<digits>[.<digits>]` followed by a binary
/// suffix (`Ki Mi Gi Ti Pi Ei`), a decimal one (`n u m "" k M G T P E`) or a
/// decimal exponent (`e3`, `E-2`).
pub fn to_bytes(q: &Quantity) -> Result<i64, QuantityError> {
    parse_bytes(q.0.trim())
}

fn parse_bytes(s: &str) -> Result<i64, QuantityError> {
    let syntax = || QuantityError::Syntax(s.to_string());
    let overflow = || QuantityError::Overflow(s.to_string());

    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(syntax());
    }

    // value = mantissa * 1024^bin * 10^(dec - frac_len)
    let (bin, dec): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let body = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            (0, digits.parse::<i64>().map_err(|_| overflow())?)
        }
        _ => return Err(syntax()),
    };

    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(overflow)?;
    }
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative(s.to_string()));
    }
    let frac_len = i64::try_from(frac_part.len()).map_err(|_| overflow())?;
    let mut value = mantissa
        .checked_mul(1024u128.pow(bin))
        .ok_or_else(overflow)?;
    // An exponent near i64::MIN minus the fraction's digits does not fit:
    // that is a scale below any divisor, as is every scale past 10^38.
    let scale = dec.checked_sub(frac_len).unwrap_or(i64::MIN);
    if scale >= 0 {
        if value != 0 {
            let factor = u32::try_from(scale)
                .ok()
                .and_then(|e| 10u128.checked_pow(e))
                .ok_or_else(overflow)?;
            value = value.checked_mul(factor).ok_or_else(overflow)?;
        }
    } else {
        // Round up, as `Value()` does.
        value = match u32::try_from(scale.unsigned_abs())
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
        {
            Some(divisor) => value.div_ceil(divisor),
            // More than 38 fractional digits: anything non-zero is below one byte.
            None => u128::from(value != 0),
        };
    }
    i64::try_from(value).map_err(|_| overflow())
}

/// `resource.NewQuantity(bytes, resource.BinarySI).String()`: the canonical
/// form upstream writes into `PV.spec.capacity` (`1Gi`, `1536`, `1k`, `0`).
pub fn from_bytes(bytes: i64) -> Quantity {
    if bytes == 0 {
        return Quantity("0".into());
    }
    if bytes.unsigned_abs() < 1024 {
        // apimachinery switches to DecimalSI below 1024 ("avoids rounding and
        // hopefully confusion"): 1000 is "1k", everything else stays plain.
        return Quantity(if bytes % 1000 == 0 {
            format!("{}k", bytes / 1000)
        } else {
            bytes.to_string()
        });
    }
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut exp = 0;
    while exp < SUFFIXES.len() - 1 && value % 1024 == 0 {
        value /= 1024;
        exp += 1;
    }
    Quantity(format!("{value}{}", SUFFIXES[exp]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_value() {
        let cases: &[(&str, Result<i64, QuantityError>)] = &[
            ("0", Ok(0)),
            ("1", Ok(1)),
            ("1Ki", Ok(1024)),
            ("5Gi", Ok(5 << 30)),
            ("1Ei", Ok(1 << 60)),
            ("1.5Gi", Ok(1_610_612_736)),
            ("1G", Ok(1_000_000_000)),
            ("500M", Ok(500_000_000)),
            ("1k", Ok(1000)),
            ("1e3", Ok(1000)),
            ("1E6", Ok(1_000_000)),
            ("12e-1", Ok(2)),
            // Value() rounds up to a whole byte.
            ("100m", Ok(1)),
            ("1500m", Ok(2)),
            ("0.1", Ok(1)),
            ("1n", Ok(1)),
            (".5Ki", Ok(512)),
            ("2.", Ok(2)),
            ("+3", Ok(3)),
            ("-0", Ok(0)),
            ("-1Gi", Err(QuantityError::Negative("-1Gi".into()))),
            ("", Err(QuantityError::Syntax(String::new()))),
            ("Gi", Err(QuantityError::Syntax("Gi".into()))),
            ("1GB", Err(QuantityError::Syntax("1GB".into()))),
            ("1.2.3", Err(QuantityError::Syntax("1.2.3".into()))),
            ("1e", Err(QuantityError::Syntax("1e".into()))),
            ("8Ei", Err(QuantityError::Overflow("8Ei".into()))),
            ("1e30", Err(QuantityError::Overflow("1e30".into()))),
        ];
        for (s, want) in cases {
            assert_eq!(to_bytes(&Quantity((*s).into())), *want, "{s:?}");
        }
    }

    #[test]
    fn extreme_exponents_are_answers_not_panics() {
        let cases: &[(&str, Result<i64, QuantityError>)] = &[
            // Far below a byte: rounds up to one, like any other fraction.
            ("1e-9223372036854775808", Ok(1)),
            ("1.5e-9223372036854775808", Ok(1)),
            ("0e-9223372036854775808", Ok(0)),
            (
                "1e9223372036854775807",
                Err(QuantityError::Overflow("1e9223372036854775807".into())),
            ),
            ("0e9223372036854775807", Ok(0)),
        ];
        for (s, want) in cases {
            assert_eq!(to_bytes(&Quantity((*s).into())), *want, "{s:?}");
        }
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        const SUFFIXES: [(&str, i128); 17] = [
            ("", 1),
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("Pi", 1 << 50),
            ("Ei", 1 << 60),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
            ("P", 1_000_000_000_000_000),
            ("E", 1_000_000_000_000_000_000),
            ("e0", 1),
            ("e3", 1_000),
            ("E6", 1_000_000),
            ("e+9", 1_000_000_000),
        ];

        proptest! {
            #[test]
            fn never_panics(s in ".*") {
                let _ = to_bytes(&Quantity(s));
            }

            #[test]
            fn never_panics_on_quantity_like_input(
                s in "[+-]?[0-9]{0,45}(\\.[0-9]{0,45})?([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,22})?"
            ) {
                if let Ok(bytes) = to_bytes(&Quantity(s)) {
                    prop_assert!(bytes >= 0);
                }
            }

            #[test]
            fn canonical_form_round_trips(bytes in 0i64..=i64::MAX) {
                prop_assert_eq!(to_bytes(&from_bytes(bytes)), Ok(bytes));
            }

            #[test]
            fn integer_with_suffix_is_exact(n in 0i64..1_000_000_000, i in 0usize..SUFFIXES.len()) {
                let (suffix, factor) = SUFFIXES[i];
                let text = format!("{n}{suffix}");
                let want = i128::from(n) * factor;
                let got = to_bytes(&Quantity(text.clone()));
                match i64::try_from(want) {
                    Ok(want) => prop_assert_eq!(got, Ok(want), "{}", text),
                    Err(_) => prop_assert_eq!(got, Err(QuantityError::Overflow(text.clone()))),
                }
            }

            #[test]
            fn milli_rounds_up_to_a_byte(n in 0i64..1_000_000_000_000) {
                let got = to_bytes(&Quantity(format!("{n}m")));
                prop_assert_eq!(got, Ok((n + 999) / 1000));
            }
        }
    }

    #[test]
    fn formats_binary_si() {
        let cases: &[(i64, &str)] = &[
            (0, "0"),
            (1, "1"),
            (512, "512"),
            (1000, "1k"),
            (1023, "1023"),
            (1024, "1Ki"),
            (1536, "1536"),
            (5000, "5000"),
            (1 << 30, "1Gi"),
            (3 << 20, "3Mi"),
            (5 << 30, "5Gi"),
            (1 << 62, "4Ei"),
            (1_000_000_000, "1000000000"),
        ];
        for (bytes, want) in cases {
            assert_eq!(from_bytes(*bytes).0, *want, "{bytes}");
            assert_eq!(
                to_bytes(&from_bytes(*bytes)),
                Ok(*bytes),
                "round trip {bytes}"
            );
        }
    }
}
