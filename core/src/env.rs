//! Settings read from environment variables (the `TESSERA_*` switches for measuring and
//! tuning): a value that does not parse is reported with a warning and the default kept, so a
//! typo never stops a run.

use std::str::FromStr;

/// The value of the environment variable `name` as a `T`: `None` when it is unset, or, with a
/// warning that says what it should be (`what`, e.g. "a number of splits"), when it is not one.
pub fn setting<T: FromStr>(name: &str, what: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    parse_setting(name, &v, what)
}

/// The value that `v` names among `names` (pairs of a word and its value), ignoring
/// surrounding whitespace and ASCII case: the parser of a setting that takes one of a few words.
pub fn named<T: Copy>(v: &str, names: &[(&str, T)]) -> Option<T> {
    let v = v.trim();
    names
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(v))
        .map(|&(_, t)| t)
}

/// [`setting`] of the value `v` of variable `name`.
fn parse_setting<T: FromStr>(name: &str, v: &str, what: &str) -> Option<T> {
    let parsed = v.trim().parse::<T>().ok();
    if parsed.is_none() {
        log::warn!("{name}={v} is not {what}; using the default");
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::{named, parse_setting};

    #[test]
    fn settings_parse_or_fall_back() {
        assert_eq!(parse_setting::<usize>("X", " 8 ", "a count"), Some(8));
        assert_eq!(parse_setting::<usize>("X", "eight", "a count"), None);
        assert_eq!(parse_setting::<usize>("X", "-1", "a count"), None);
    }

    #[test]
    fn words_name_values_in_any_case() {
        let names = [("", 0), ("on", 1), ("early", 2)];
        assert_eq!(named(" EARLY ", &names), Some(2));
        assert_eq!(named("", &names), Some(0));
        assert_eq!(named("off", &names), None);
    }
}
