//! Results: one [`CaseResult`] per case and a [`Summary`] that prints them.

use std::fmt;

/// What became of one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// The output matched the reference.
    Passed,
    /// It did not (the reason says how), or the device failed.
    Failed(String),
    /// The device (or the reference) cannot run it, or is absent; never counted as passed.
    Skipped(String),
}

/// The result of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// The case's name, `OP(k=v,...)`.
    pub name: String,
    /// The op's upper-case name.
    pub op: String,
    /// Passed, failed or skipped.
    pub status: Status,
    /// The error measured, where the case got that far.
    pub nmse: Option<f64>,
    /// The largest error allowed.
    pub threshold: f64,
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  {}: ", self.name)?;
        match &self.status {
            Status::Passed => write!(f, "OK")?,
            Status::Failed(why) => write!(f, "FAIL ({why})")?,
            Status::Skipped(why) => return write!(f, "skipped ({why})"),
        }
        if let Some(e) = self.nmse {
            write!(f, " [nmse {e:.3e} <= {:.1e}]", self.threshold)?;
        }
        Ok(())
    }
}

/// All results of one run of the suite on one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// The device under test.
    pub device: String,
    /// What it was compared with.
    pub reference: String,
    /// One per case, in table order.
    pub results: Vec<CaseResult>,
}

impl Summary {
    /// The summary for a device that is not present: one skipped entry naming it.
    pub fn absent(device: &str, why: &str) -> Summary {
        Summary {
            device: device.to_string(),
            reference: String::new(),
            results: vec![CaseResult {
                name: format!("device {device}"),
                op: String::new(),
                status: Status::Skipped(format!("absent: {why}")),
                nmse: None,
                threshold: 0.0,
            }],
        }
    }

    fn count(&self, f: impl Fn(&Status) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.status)).count()
    }

    /// Cases that passed.
    pub fn passed(&self) -> usize {
        self.count(|s| *s == Status::Passed)
    }

    /// Cases that failed.
    pub fn failed(&self) -> usize {
        self.count(|s| matches!(s, Status::Failed(_)))
    }

    /// Cases skipped.
    pub fn skipped(&self) -> usize {
        self.count(|s| matches!(s, Status::Skipped(_)))
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.status, Status::Failed(_)))
    }

    /// The last line: `N passed, M failed, K skipped`.
    pub fn totals(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device {} vs {}", self.device, self.reference)?;
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        writeln!(f, "{}", self.totals())
    }
}
