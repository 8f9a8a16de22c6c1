//! Reading a crate's documented environment variables, one way for every crate.
//!
//! Settings are typed: each backend takes an options struct (`CudaOptions`, `WgpuOptions`,
//! `MetaOptions`, `CpuOptions`) when its device or backend is made, and `Default` is the tuned
//! default. Each of those structs has one `from_env()` that reads its crate's few variables
//! through the functions below and nothing else; library code reads the environment nowhere
//! else. The rules, the same for every variable:
//!
//! - unset, or set to the empty string: the default (`None` here);
//! - a switch takes `0`, `1`, `false` or `true` (any ASCII case, surrounding blanks ignored);
//! - a number or a word is parsed as its type says;
//! - anything else is an error that names the variable, its value and what it should be, so a
//!   typo is never silently read as "off".

use std::str::FromStr;

use crate::error::{Error, Result};

/// The raw value of `name`: `None` when unset or empty; an error when it is not unicode.
fn raw(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::Invalid(format!(
            "environment variable {name} is not valid unicode"
        ))),
    }
}

/// The error for a variable whose value is not what it should be.
fn bad(name: &str, value: &str, what: &str) -> Error {
    Error::Invalid(format!(
        "environment variable {name}={value:?} is not {what}"
    ))
}

/// `value` of variable `name` as a switch: `0`/`false` or `1`/`true`.
pub fn parse_switch(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        _ => Err(bad(name, value, "a switch (0, 1, false or true)")),
    }
}

/// `value` of variable `name` as a `T` (`what` says what it should be, e.g. "a number of
/// splits").
pub fn parse_value<T: FromStr>(name: &str, value: &str, what: &str) -> Result<T> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| bad(name, value, what))
}

/// `value` of variable `name` as one of `words` (pairs of a word and its value; ASCII case
/// and surrounding blanks ignored).
pub fn parse_word<T: Copy>(name: &str, value: &str, words: &[(&str, T)]) -> Result<T> {
    let v = value.trim();
    words
        .iter()
        .find(|(w, _)| w.eq_ignore_ascii_case(v))
        .map(|&(_, t)| t)
        .ok_or_else(|| {
            let list: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
            bad(name, value, &format!("one of {}", list.join(", ")))
        })
}

/// The switch `name` from the environment (see the module's rules).
pub fn env_switch(name: &str) -> Result<Option<bool>> {
    raw(name)?.map(|v| parse_switch(name, &v)).transpose()
}

/// The value `name` from the environment as a `T` (see the module's rules).
pub fn env_value<T: FromStr>(name: &str, what: &str) -> Result<Option<T>> {
    raw(name)?.map(|v| parse_value(name, &v, what)).transpose()
}

/// The word `name` from the environment, one of `words` (see the module's rules).
pub fn env_word<T: Copy>(name: &str, words: &[(&str, T)]) -> Result<Option<T>> {
    raw(name)?.map(|v| parse_word(name, &v, words)).transpose()
}

/// A path from the environment (`None` when unset or empty).
pub fn env_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::{parse_switch, parse_value, parse_word};

    #[test]
    fn switches_take_four_words_and_refuse_the_rest() {
        assert!(!parse_switch("X", "0").unwrap());
        assert!(!parse_switch("X", " FALSE ").unwrap());
        assert!(parse_switch("X", "1").unwrap());
        assert!(parse_switch("X", "true").unwrap());
        let e = parse_switch("EXAMPLE_X", "no").unwrap_err().to_string();
        assert!(e.contains("EXAMPLE_X") && e.contains("\"no\""), "{e}");
    }

    #[test]
    fn values_and_words_parse_or_name_the_variable() {
        assert_eq!(parse_value::<usize>("X", " 8 ", "a count").unwrap(), 8);
        let e = parse_value::<usize>("EXAMPLE_N", "-1", "a count").unwrap_err();
        assert!(e.to_string().contains("EXAMPLE_N"));
        let words = [("host", 1), ("peer", 2)];
        assert_eq!(parse_word("X", " HOST ", &words).unwrap(), 1);
        let e = parse_word("EXAMPLE_W", "hots", &words)
            .unwrap_err()
            .to_string();
        assert!(e.contains("host, peer"), "{e}");
    }
}
