//! How long an idle model stays loaded: `keep_alive` in `models.toml` rows and `[loading]`, written
//! as Ollama writes it (`-1` forever, `0` at once, `300` seconds, or `"5m"`, `"90s"`, `"1h"`,
//! `"250ms"`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// How long a model stays loaded after its last request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepAlive {
    /// Until it is unloaded by hand, evicted for another or the table drops it.
    #[default]
    Forever,
    /// This long idle, then unloaded (`ZERO`: as soon as its last request ends).
    For(Duration),
}

impl KeepAlive {
    /// `-1`, a whole number of seconds, or a number with one of `ms`, `s`, `m`, `h`.
    pub fn parse(text: &str) -> Result<KeepAlive, String> {
        let text = text.trim();
        if text == "-1" {
            return Ok(KeepAlive::Forever);
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let value: f64 = number
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                format!("{text:?} is not -1 or a duration such as 300, \"5m\", \"1h\"")
            })?;
        let seconds = match unit.trim() {
            "" | "s" => value,
            "ms" => value / 1000.0,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            other => return Err(format!("unknown unit {other:?} (ms, s, m or h)")),
        };
        // A year is longer than any box stays up; past it the number is a mistake.
        if seconds > 365.0 * 86400.0 {
            return Err(format!(
                "{text:?} is longer than a year; -1 keeps it forever"
            ));
        }
        Ok(KeepAlive::For(Duration::from_secs_f64(seconds)))
    }

    /// Whether a model idle for `idle` has outstayed this.
    pub fn expired(&self, idle: Duration) -> bool {
        matches!(self, KeepAlive::For(limit) if idle >= *limit)
    }
}

impl fmt::Display for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepAlive::Forever => f.write_str("-1"),
            KeepAlive::For(d) if d.subsec_millis() != 0 => write!(f, "{}ms", d.as_millis()),
            KeepAlive::For(d) => write!(f, "{}s", d.as_secs()),
        }
    }
}

impl Serialize for KeepAlive {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A TOML integer (`-1`, `300`) or string (`"5m"`).
impl<'de> Deserialize<'de> for KeepAlive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeepAlive;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("-1, a number of seconds, or a duration such as \"5m\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeepAlive, E> {
                KeepAlive::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeepAlive, E> {
                KeepAlive::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeepAlive, E> {
                KeepAlive::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_spellings_parse_and_nonsense_is_refused() {
        let secs = |s: u64| KeepAlive::For(Duration::from_secs(s));
        assert_eq!(KeepAlive::parse("-1"), Ok(KeepAlive::Forever));
        assert_eq!(KeepAlive::parse("0"), Ok(secs(0)));
        assert_eq!(KeepAlive::parse("300"), Ok(secs(300)));
        assert_eq!(KeepAlive::parse("5m"), Ok(secs(300)));
        assert_eq!(KeepAlive::parse("1h"), Ok(secs(3600)));
        assert_eq!(
            KeepAlive::parse("250ms"),
            Ok(KeepAlive::For(Duration::from_millis(250)))
        );
        for bad in ["", "-2", "5 days", "1e9", "NaN", "9999999h", "m"] {
            assert!(KeepAlive::parse(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(secs(0).expired(Duration::ZERO));
        assert!(!secs(5).expired(Duration::from_secs(4)));
        assert!(!KeepAlive::Forever.expired(Duration::MAX));
        assert_eq!(secs(300).to_string(), "300s");
        let from: KeepAlive = toml::from_str::<toml::Value>("k = -1").unwrap()["k"]
            .clone()
            .try_into()
            .unwrap();
        assert_eq!(from, KeepAlive::Forever);
    }
}
