//! Value types for detector settings that validate themselves as they are read, so that a
//! detector's settings struct is its own schema: deserializing it is validating it, and
//! serializing it is printing it (`check-config`).
//!
//! Guarantees: a value of these types is always in range; each rejects a bad value with a
//! message that says what is allowed and what it got (the config names the key).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A threshold: a number > 0, or `"off"`. Not 0: a level at 0 would fire at every
/// session's first event (a cap's count, a detector's streak is never below it), which
/// nobody means; `"off"` is how a level is turned off.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Threshold(pub Option<f64>);

impl Threshold {
    pub fn get(self) -> Option<f64> {
        self.0
    }
}

impl Serialize for Threshold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(v) => s.serialize_f64(v),
            None => s.serialize_str("off"),
        }
    }
}

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Threshold, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Threshold;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number > 0 or \"off\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Threshold, E> {
                if v.is_finite() && v > 0.0 {
                    Ok(Threshold(Some(v)))
                } else if v == 0.0 {
                    Err(E::custom(
                        "must be a number > 0 or \"off\", got 0 (which would fire at every \
                         session's first event; \"off\" turns a level off)",
                    ))
                } else {
                    Err(E::custom(format!(
                        "must be a number > 0 or \"off\", got {v}"
                    )))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Threshold, E> {
                self.visit_f64(v as f64)
            }
            // `false` is off too: YAML 1.1 (Helm's values) reads an unquoted `off` so.
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Threshold, E> {
                if v {
                    Err(E::custom(
                        "must be a number > 0 or \"off\" (or false), got true",
                    ))
                } else {
                    Ok(Threshold(None))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Threshold, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Threshold, E> {
                if v == "off" {
                    Ok(Threshold(None))
                } else {
                    Err(E::custom(format!(
                        "must be a number > 0 or \"off\", got \"{v}\""
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A whole number in `MIN..=MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Bounded<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Bounded<MIN, MAX> {
    /// `value`, which must be in range (for defaults; checked in tests).
    pub const fn new(value: u64) -> Self {
        assert!(value >= MIN && value <= MAX, "default out of range");
        Bounded(value)
    }

    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl<'de, const MIN: u64, const MAX: u64> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if v < MIN as i64 || v as u64 > MAX {
            return Err(de::Error::custom(format!("must be {MIN}..={MAX}, got {v}")));
        }
        Ok(Bounded(v as u64))
    }
}

/// A share in (0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Share(f64);

impl Share {
    /// `value`, which must be in (0, 1] (for defaults; checked in tests).
    pub const fn new(value: f64) -> Share {
        assert!(value > 0.0 && value <= 1.0, "default out of range");
        Share(value)
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Share, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(de::Error::custom(format!("must be in (0, 1], got {v}")));
        }
        Ok(Share(v))
    }
}

/// A fraction in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Fraction(f64);

impl Fraction {
    /// `value`, which must be in [0, 1] (for defaults; checked in tests).
    pub const fn new(value: f64) -> Fraction {
        assert!(value >= 0.0 && value <= 1.0, "default out of range");
        Fraction(value)
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fraction, D::Error> {
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(de::Error::custom(format!("must be in [0, 1], got {v}")));
        }
        Ok(Fraction(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read<T: serde::de::DeserializeOwned>(toml_value: &str) -> Result<T, String> {
        let t: toml::Table = toml::from_str(&format!("v = {toml_value}")).unwrap();
        T::deserialize(t["v"].clone()).map_err(|e| e.to_string())
    }

    #[test]
    fn thresholds_take_numbers_and_off() {
        assert_eq!(read::<Threshold>("3"), Ok(Threshold(Some(3.0))));
        assert_eq!(read::<Threshold>("2.5"), Ok(Threshold(Some(2.5))));
        assert_eq!(read::<Threshold>("\"off\""), Ok(Threshold(None)));
        // Helm's YAML reads an unquoted `off` as false.
        assert_eq!(read::<Threshold>("false"), Ok(Threshold(None)));
        assert!(read::<Threshold>("true").unwrap_err().contains("got true"));
        assert!(read::<Threshold>("-1").unwrap_err().contains("got -1"));
        // 0 would fire at every session's first event: "off" is how to turn a level off.
        for zero in ["0", "0.0"] {
            let err = read::<Threshold>(zero).unwrap_err();
            assert!(err.contains("got 0 (") && err.contains("\"off\""), "{err}");
        }
        assert!(read::<Threshold>("\"no\"")
            .unwrap_err()
            .contains("got \"no\""));
    }

    #[test]
    fn bounded_and_share_reject_out_of_range_values() {
        assert_eq!(read::<Bounded<1, 64>>("64").map(|b| b.get()), Ok(64));
        assert!(read::<Bounded<1, 64>>("65")
            .unwrap_err()
            .contains("must be 1..=64, got 65"));
        assert!(read::<Bounded<1, 64>>("0").is_err());
        assert_eq!(read::<Share>("1").map(|s| s.get()), Ok(1.0));
        assert!(read::<Share>("0").unwrap_err().contains("(0, 1]"));
        assert!(read::<Share>("1.5").is_err());
    }

    #[test]
    fn they_print_as_they_are_read() {
        let v = toml::Value::try_from(Threshold(None)).unwrap();
        assert_eq!(v.as_str(), Some("off"));
        let v = toml::Value::try_from(Bounded::<1, 64>::new(8)).unwrap();
        assert_eq!(v.as_integer(), Some(8));
    }
}
