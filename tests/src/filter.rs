//! Choosing cases by op, type, name and size.

use tessera_core::{DType, Result};

use crate::case::Case;

/// Which cases to run. The default runs every case, large ones included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Op names (`MUL_MAT`, case-insensitive); empty: every op.
    pub ops: Vec<String>,
    /// Types; a case runs when it involves one of them. Empty: every type.
    pub types: Vec<DType>,
    /// A substring of the case name; empty: any.
    pub name: String,
    /// Skip the cases marked large (for slow devices).
    pub skip_large: bool,
}

impl Filter {
    /// Every case.
    pub fn all() -> Filter {
        Filter::default()
    }

    /// Every case of these comma-separated ops (`"MUL_MAT,add"`).
    pub fn ops(list: &str) -> Filter {
        Filter {
            ops: split(list).map(|s| s.to_ascii_uppercase()).collect(),
            ..Filter::default()
        }
    }

    /// Adds comma-separated type names (`"q4_0,f16"`); an unknown name is an error.
    pub fn with_types(mut self, list: &str) -> Result<Filter> {
        for s in split(list) {
            self.types.push(DType::from_name(s)?);
        }
        Ok(self)
    }

    /// Whether `case` is selected.
    pub fn matches(&self, case: &Case) -> bool {
        (self.ops.is_empty() || self.ops.iter().any(|o| o.eq_ignore_ascii_case(case.op())))
            && (self.types.is_empty() || self.types.iter().any(|t| case.types().contains(t)))
            && (self.name.is_empty() || case.name().contains(&self.name))
            && !(self.skip_large && case.is_large())
    }
}

fn split(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::cases;

    #[test]
    fn filters_select_by_op_type_name_and_size() {
        let all = cases();
        let mm = Filter::ops("mul_mat");
        assert!(all
            .iter()
            .filter(|c| mm.matches(c))
            .all(|c| c.op() == "MUL_MAT"));
        let q = Filter::ops("MUL_MAT,GET_ROWS")
            .with_types("q4_K")
            .expect("a known type");
        let picked: Vec<_> = all.iter().filter(|c| q.matches(c)).collect();
        assert!(picked.len() > 10);
        assert!(picked.iter().all(|c| c.types().contains(&DType::Q4_K)));
        assert!(Filter::all().with_types("q9_9").is_err());
        let small = Filter {
            skip_large: true,
            ..Filter::all()
        };
        let large = all.iter().filter(|c| !small.matches(c)).count();
        assert!((5..=30).contains(&large), "{large} large cases");
        let named = Filter {
            name: "n=67".into(),
            ..Filter::ops("MUL_MAT")
        };
        assert!(all
            .iter()
            .filter(|c| named.matches(c))
            .all(|c| c.name().contains("n=67")));
    }
}
