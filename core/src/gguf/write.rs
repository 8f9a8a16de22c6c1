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
    pub(super) tensors: Vec<(GgufTensorInfo, TensorData<'a>)>,
    alignment: Option<u64>,
}

/// Writes one tensor's bytes, in order, while the file is written
/// ([`GgufWriter::add_tensor_with`]).
type TensorProducer<'a> = Box<dyn Fn(&mut dyn Write) -> Result<()> + 'a>;

/// Where a tensor's bytes come from.
pub(super) enum TensorData<'a> {
    /// Given (or borrowed) when the tensor was added.
    Bytes(Cow<'a, [u8]>),
    /// Made when the file is written.
    Produced(TensorProducer<'a>),
}

impl std::fmt::Debug for TensorData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            TensorData::Produced(_) => f.write_str("Produced"),
        }
    }
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

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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
        let info = self.tensor_info(name.into(), dtype, ne)?;
        let data = data.into();
        if info.size != data.len() as u64 {
            return Err(invalid(format!(
                "tensor '{}': {dtype} shape {ne:?} takes {} bytes but {} were given",
                info.name,
                info.size,
                data.len()
            )));
        }
        self.tensors.push((info, TensorData::Bytes(data)));
        Ok(())
    }

    /// Adds a tensor whose bytes are made while the file is written: `produce` is called once
    /// per write ([`GgufWriter::write_to`], [`GgufWriter::write_file`]), in tensor order, and
    /// must write exactly the size the type and shape give (else that write fails; a file
    /// being written with [`GgufWriter::write_file`] is then removed). Nothing of the tensor is
    /// held in memory by the writer, so files larger than memory can be made; the producer
    /// should give the same bytes every time it is called. An error it returns ends the write
    /// and is returned as it is.
    pub fn add_tensor_with(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        ne: &[u64],
        produce: impl Fn(&mut dyn Write) -> Result<()> + 'a,
    ) -> Result<()> {
        let info = self.tensor_info(name.into(), dtype, ne)?;
        self.tensors
            .push((info, TensorData::Produced(Box::new(produce))));
        Ok(())
    }

    /// Checks a new tensor's name and shape and makes its info (offset filled in when written).
    fn tensor_info(&self, name: String, dtype: DType, ne: &[u64]) -> Result<GgufTensorInfo> {
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
        Ok(GgufTensorInfo {
            name,
            dtype,
            ne: full,
            n_dims: ne.len() as u32,
            offset: 0,
            size,
        })
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: impl Write) -> Result<()> {
        self.write_inner(w, "writing GGUF")
    }

    /// Writes the file; I/O errors name `ctx`.
    fn write_inner(&self, w: impl Write, ctx: &str) -> Result<()> {
        let io = |e| Error::io(ctx, e);
        let align = self.alignment();
        let mut w = Counting { inner: w, n: 0 };
        self.write_header(&mut w).map_err(io)?;
        for (t, data) in &self.tensors {
            match data {
                TensorData::Bytes(b) => w.put(b).map_err(io)?,
                TensorData::Produced(produce) => {
                    let start = w.n;
                    produce(&mut w)?;
                    let wrote = w.n - start;
                    if wrote != t.size {
                        return Err(invalid(format!(
                            "tensor '{}': its producer wrote {wrote} bytes, but {} {:?} takes {}",
                            t.name,
                            t.dtype,
                            t.shape(),
                            t.size
                        )));
                    }
                }
            }
            w.pad_to(align).map_err(io)?;
        }
        w.inner.flush().map_err(io)
    }

    /// Writes everything before the tensor data: header, metadata, tensor infos, padding.
    fn write_header<W: Write>(&self, w: &mut Counting<W>) -> std::io::Result<()> {
        let align = self.alignment();
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
        w.pad_to(align)
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
        let ctx = format!("writing {}", tmp.display());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(|e| Error::io(ctx.clone(), e))?;
        let mut buf = std::io::BufWriter::with_capacity(1 << 20, file);
        self.write_inner(&mut buf, &ctx)?;
        let file = buf
            .into_inner()
            .map_err(|e| Error::io(ctx.clone(), e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(ctx, e))
    }
}
