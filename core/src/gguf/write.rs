//! The GGUF writer.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    align_up, tensor_size, GgufTensorInfo, GgufType, GgufValue, ALIGNMENT_KEY, DEFAULT_ALIGNMENT,
    GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, WRITE_VERSION,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Builds a GGUF file (version 3): metadata in the order added, then tensor infos, then each
/// tensor's data padded to the alignment.
///
/// Every input is checked when added, so writing fails only on I/O. Tensor data is borrowed
/// where it can be (`&'a [u8]`), so a file can be rewritten from a mapping without copying.
/// Adding the key `general.alignment` (a u32 power of two) sets the alignment; the default
/// is 32.
#[derive(Debug, Default)]
pub struct GgufWriter<'a> {
    pub(super) metadata: Vec<(String, GgufValue)>,
    pub(super) tensors: Vec<(GgufTensorInfo, Cow<'a, [u8]>)>,
    alignment: Option<u64>,
}

fn invalid(reason: String) -> Error {
    Error::Gguf {
        path: "<writer>".to_string(),
        reason,
    }
}

/// Checks that a value can be written and read back: arrays hold one type and nest at most
/// [`MAX_ARRAY_DEPTH`] deep.
fn check_value(key: &str, v: &GgufValue, depth: u32) -> Result<()> {
    let GgufValue::Array(items) = v else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(invalid(format!(
            "metadata '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
        )));
    }
    let Some(first) = items.first() else {
        return Ok(());
    };
    let ty = first.value_type();
    for (i, item) in items.iter().enumerate() {
        if item.value_type() != ty {
            return Err(invalid(format!(
                "metadata '{key}': array element {i} is {}, but element 0 is {ty} (GGUF arrays \
                 hold one type)",
                item.value_type()
            )));
        }
        check_value(key, item, depth + 1)?;
    }
    Ok(())
}

/// A writer that counts the bytes written, for padding.
struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Counting<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.n += bytes.len() as u64;
        Ok(())
    }

    fn put_str(&mut self, s: &str) -> std::io::Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn pad_to(&mut self, align: u64) -> std::io::Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut pad = align_up(self.n, align).map_or(0, |e| e - self.n);
        while pad > 0 {
            let k = pad.min(ZEROS.len() as u64);
            self.put(&ZEROS[..k as usize])?;
            pad -= k;
        }
        Ok(())
    }

    /// Writes a value's payload (not its type tag).
    fn put_value(&mut self, v: &GgufValue) -> std::io::Result<()> {
        match v {
            GgufValue::U8(x) => self.put(&x.to_le_bytes()),
            GgufValue::I8(x) => self.put(&x.to_le_bytes()),
            GgufValue::U16(x) => self.put(&x.to_le_bytes()),
            GgufValue::I16(x) => self.put(&x.to_le_bytes()),
            GgufValue::U32(x) => self.put(&x.to_le_bytes()),
            GgufValue::I32(x) => self.put(&x.to_le_bytes()),
            GgufValue::U64(x) => self.put(&x.to_le_bytes()),
            GgufValue::I64(x) => self.put(&x.to_le_bytes()),
            GgufValue::F32(x) => self.put(&x.to_le_bytes()),
            GgufValue::F64(x) => self.put(&x.to_le_bytes()),
            GgufValue::Bool(x) => self.put(&[u8::from(*x)]),
            GgufValue::String(s) => self.put_str(s),
            GgufValue::Array(items) => {
                let ty = items.first().map_or(GgufType::U8, GgufValue::value_type);
                self.put(&ty.id().to_le_bytes())?;
                self.put(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|i| self.put_value(i))
            }
        }
    }
}

/// A distinct suffix for each temporary file this process makes.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl<'a> GgufWriter<'a> {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The alignment the file will use.
    pub fn alignment(&self) -> u64 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Adds a metadata pair. Errors on a duplicate key, an array mixing types or nested too
    /// deep, or a `general.alignment` that is not a u32 power of two.
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<GgufValue>,
    ) -> Result<()> {
        let key = key.into();
        let value = value.into();
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(invalid(format!("duplicate metadata key '{key}'")));
        }
        check_value(&key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            match value {
                GgufValue::U32(a) if a.is_power_of_two() => self.alignment = Some(a.into()),
                _ => {
                    return Err(invalid(format!(
                        "{ALIGNMENT_KEY} must be a u32 power of two, not {value:?}"
                    )))
                }
            }
        }
        self.metadata.push((key, value));
        Ok(())
    }

    /// Adds a tensor: `ne` is its shape in GGUF order (`ne[0]` contiguous, at most 4 dims) and
    /// `data` its bytes, which must be exactly the size the type and shape give.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        ne: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let name = name.into();
        let data = data.into();
        if self.tensors.iter().any(|(t, _)| t.name == name) {
            return Err(invalid(format!("duplicate tensor name '{name}'")));
        }
        if ne.len() > MAX_DIMS {
            return Err(invalid(format!(
                "tensor '{name}': {} dimensions, at most {MAX_DIMS} allowed",
                ne.len()
            )));
        }
        let mut full = [1u64; 4];
        full[..ne.len()].copy_from_slice(ne);
        let size =
            tensor_size(dtype, &full).map_err(|r| invalid(format!("tensor '{name}': {r}")))?;
        if size != data.len() as u64 {
            return Err(invalid(format!(
                "tensor '{name}': {dtype} shape {ne:?} takes {size} bytes but {} were given",
                data.len()
            )));
        }
        let info = GgufTensorInfo {
            name,
            dtype,
            ne: full,
            n_dims: ne.len() as u32,
            offset: 0,
            size,
        };
        self.tensors.push((info, data));
        Ok(())
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: impl Write) -> Result<()> {
        self.write_inner(w)
            .map_err(|e| Error::io("writing GGUF", e))
    }

    fn write_inner(&self, w: impl Write) -> std::io::Result<()> {
        let align = self.alignment();
        let mut w = Counting { inner: w, n: 0 };
        w.put(&GGUF_MAGIC)?;
        w.put(&WRITE_VERSION.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            w.put_str(k)?;
            w.put(&v.value_type().id().to_le_bytes())?;
            w.put_value(v)?;
        }
        let mut offset = 0u64;
        for (t, _) in &self.tensors {
            w.put_str(&t.name)?;
            w.put(&t.n_dims.to_le_bytes())?;
            for d in t.shape() {
                w.put(&d.to_le_bytes())?;
            }
            w.put(&t.dtype.gguf_id().to_le_bytes())?;
            w.put(&offset.to_le_bytes())?;
            offset = align_up(offset + t.size, align).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "tensor data size overflow",
                )
            })?;
        }
        w.pad_to(align)?;
        for (_, data) in &self.tensors {
            w.put(data)?;
            w.pad_to(align)?;
        }
        w.inner.flush()
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    /// Writes the file to `path` atomically: into a temporary file in the same directory, synced,
    /// then renamed over `path`. On failure the temporary file is removed and `path` is untouched.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let name = path.file_name().ok_or_else(|| Error::Gguf {
            path: path.display().to_string(),
            reason: "not a file path".into(),
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp: PathBuf = path.with_file_name(tmp_name);
        let result = self.write_temp(&tmp).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|e| {
                Error::io(
                    format!("renaming {} to {}", tmp.display(), path.display()),
                    e,
                )
            })
        });
        if result.is_err() {
            // Best effort: the temporary file may not exist (creation failed).
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn write_temp(&self, tmp: &Path) -> Result<()> {
        let ctx = || format!("writing {}", tmp.display());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| Error::io(ctx(), e))?;
        let mut buf = std::io::BufWriter::new(file);
        self.write_inner(&mut buf)
            .map_err(|e| Error::io(ctx(), e))?;
        let file = buf
            .into_inner()
            .map_err(|e| Error::io(ctx(), e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(ctx(), e))
    }
}
