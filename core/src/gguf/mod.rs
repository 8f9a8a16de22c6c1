//! GGUF files: reading (memory-mapped) and writing.
//!
//! # The format (little-endian throughout)
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count x   (key: string, value_type: u32, value)
//! tensor_count x (name: string, n_dims: u32, ne: n_dims x u64, type: u32, offset: u64)
//! padding to `general.alignment` (default 32)
//! data section: each tensor at data start + its offset (a multiple of the alignment)
//! ```
//!
//! A string is a u64 byte length followed by UTF-8 bytes (no terminator). An array value is an
//! element type (u32), a u64 count and the elements; arrays may nest. Versions 2 and 3 share this
//! layout (version 3 only allowed big-endian files, which tessera does not read); version 1 used
//! 32-bit counts and is rejected.
//!
//! # Reading hostile input
//!
//! [`GgufFile`] parses with bounds checks everywhere and never panics: every count is checked
//! against the bytes left before anything is reserved, every string length is capped by the bytes
//! left, shapes use checked arithmetic, array nesting is limited to [`MAX_ARRAY_DEPTH`], and each
//! tensor's data must be aligned and lie inside the file. Every error is an
//! [`Error::Gguf`] naming the file, what is wrong and the byte offset where
//! it was found. Once [`GgufFile::open`] succeeds, [`GgufFile::tensor_data`] is a plain slice of
//! the mapping: nothing is copied.
//!
//! Memory use while parsing is linear in the metadata size: a hostile file can make the parsed
//! metadata at most a few tens of times larger than the bytes it occupies (an array of N one-byte
//! values becomes N [`GgufValue`]s), never more.

mod read;
mod write;

#[cfg(test)]
mod tests;

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};

pub use write::GgufWriter;

/// The GGUF magic, the first four bytes of every file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of the data section and of each tensor's data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The metadata key that sets the alignment (a u32 power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The deepest nesting of arrays the reader accepts (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;

/// The version [`GgufWriter`] writes.
pub const WRITE_VERSION: u32 = 3;

/// The type tag of a metadata value, with its GGUF id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufType {
    /// u8 (id 0).
    U8,
    /// i8 (id 1).
    I8,
    /// u16 (id 2).
    U16,
    /// i16 (id 3).
    I16,
    /// u32 (id 4).
    U32,
    /// i32 (id 5).
    I32,
    /// f32 (id 6).
    F32,
    /// bool, one byte 0 or 1 (id 7).
    Bool,
    /// UTF-8 string with a u64 length (id 8).
    String,
    /// Array: element type, u64 count, elements (id 9).
    Array,
    /// u64 (id 10).
    U64,
    /// i64 (id 11).
    I64,
    /// f64 (id 12).
    F64,
}

impl GgufType {
    /// The type with a GGUF value type id, if there is one.
    pub const fn from_id(id: u32) -> Option<GgufType> {
        Some(match id {
            0 => GgufType::U8,
            1 => GgufType::I8,
            2 => GgufType::U16,
            3 => GgufType::I16,
            4 => GgufType::U32,
            5 => GgufType::I32,
            6 => GgufType::F32,
            7 => GgufType::Bool,
            8 => GgufType::String,
            9 => GgufType::Array,
            10 => GgufType::U64,
            11 => GgufType::I64,
            12 => GgufType::F64,
            _ => return None,
        })
    }

    /// The GGUF value type id.
    pub const fn id(self) -> u32 {
        match self {
            GgufType::U8 => 0,
            GgufType::I8 => 1,
            GgufType::U16 => 2,
            GgufType::I16 => 3,
            GgufType::U32 => 4,
            GgufType::I32 => 5,
            GgufType::F32 => 6,
            GgufType::Bool => 7,
            GgufType::String => 8,
            GgufType::Array => 9,
            GgufType::U64 => 10,
            GgufType::I64 => 11,
            GgufType::F64 => 12,
        }
    }

    /// A short lower-case name ("u32", "string", "array").
    pub const fn name(self) -> &'static str {
        match self {
            GgufType::U8 => "u8",
            GgufType::I8 => "i8",
            GgufType::U16 => "u16",
            GgufType::I16 => "i16",
            GgufType::U32 => "u32",
            GgufType::I32 => "i32",
            GgufType::F32 => "f32",
            GgufType::Bool => "bool",
            GgufType::String => "string",
            GgufType::Array => "array",
            GgufType::U64 => "u64",
            GgufType::I64 => "i64",
            GgufType::F64 => "f64",
        }
    }

    /// The fewest bytes a value of this type takes in a file (an empty string or array for the
    /// variable-size types). Used to bound counts by the bytes left.
    pub const fn min_encoded_size(self) -> u64 {
        match self {
            GgufType::U8 | GgufType::I8 | GgufType::Bool => 1,
            GgufType::U16 | GgufType::I16 => 2,
            GgufType::U32 | GgufType::I32 | GgufType::F32 => 4,
            GgufType::U64 | GgufType::I64 | GgufType::F64 | GgufType::String => 8,
            GgufType::Array => 12,
        }
    }
}

impl std::fmt::Display for GgufType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
///
/// Arrays hold values of one type (the format stores one element type per array); an array's
/// elements may themselves be arrays. The typed getters convert between integer widths when
/// the value fits, so a key written as u64 by one converter and u32 by another reads the same.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// u8.
    U8(u8),
    /// i8.
    I8(i8),
    /// u16.
    U16(u16),
    /// i16.
    I16(i16),
    /// u32.
    U32(u32),
    /// i32.
    I32(i32),
    /// u64.
    U64(u64),
    /// i64.
    I64(i64),
    /// f32.
    F32(f32),
    /// f64.
    F64(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values of one type. An empty array is written with element type u8.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value's type tag.
    pub fn value_type(&self) -> GgufType {
        match self {
            GgufValue::U8(_) => GgufType::U8,
            GgufValue::I8(_) => GgufType::I8,
            GgufValue::U16(_) => GgufType::U16,
            GgufValue::I16(_) => GgufType::I16,
            GgufValue::U32(_) => GgufType::U32,
            GgufValue::I32(_) => GgufType::I32,
            GgufValue::U64(_) => GgufType::U64,
            GgufValue::I64(_) => GgufType::I64,
            GgufValue::F32(_) => GgufType::F32,
            GgufValue::F64(_) => GgufType::F64,
            GgufValue::Bool(_) => GgufType::Bool,
            GgufValue::String(_) => GgufType::String,
            GgufValue::Array(_) => GgufType::Array,
        }
    }

    /// The value as an i128 when it is an integer of any width (bools are not integers).
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value of any width that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer value of any width that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// An integer value of any width that fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_integer().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer value of any width that fits in i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_integer().and_then(|v| i32::try_from(v).ok())
    }

    /// An f32 value, or an f64 value rounded to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An f32 or f64 value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value's elements.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and the length of an array.
    fn describe(&self) -> String {
        match self {
            GgufValue::Array(a) => match a.first() {
                Some(e) => format!("array of {} {}", a.len(), e.value_type()),
                None => "empty array".to_string(),
            },
            v => v.value_type().name().to_string(),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl From<$t> for GgufValue {
            fn from(v: $t) -> Self {
                GgufValue::$v(v)
            }
        })*
    };
}

value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String);

impl From<&str> for GgufValue {
    fn from(v: &str) -> Self {
        GgufValue::String(v.to_string())
    }
}

impl<T: Into<GgufValue>> From<Vec<T>> for GgufValue {
    fn from(v: Vec<T>) -> Self {
        GgufValue::Array(v.into_iter().map(Into::into).collect())
    }
}

/// One tensor's entry in the file: name, type, shape and where its data is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The tensor's name (unique in the file).
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape in GGUF / ggml order (`ne[0]` is the contiguous dimension), padded with 1.
    pub ne: [u64; 4],
    /// How many dimensions the file gives (0 to 4).
    pub n_dims: u32,
    /// Where its data starts, relative to the start of the data section.
    pub offset: u64,
    /// Its data size in bytes.
    pub size: u64,
}

impl GgufTensorInfo {
    /// The number of elements (the product of `ne`; saturates rather than overflows, which
    /// cannot happen for an info read from a file).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().fold(1u64, |a, &b| a.saturating_mul(b))
    }

    /// The dimensions the file gives: `ne[..n_dims]`.
    pub fn shape(&self) -> &[u64] {
        self.ne.get(..self.n_dims as usize).unwrap_or(&self.ne)
    }
}

/// The data size of a tensor, or why it has none: `ne[0]` must be a whole number of blocks, the
/// element count must fit in i64 (as ggml requires), and the byte size must fit in u64.
pub(crate) fn tensor_size(dtype: DType, ne: &[u64; 4]) -> std::result::Result<u64, String> {
    let mut n: u64 = 1;
    for &d in ne {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("shape {ne:?} has more than i64::MAX elements"))?;
    }
    let bs = dtype.block_size() as u64;
    let blocks = ne[0] / bs;
    if blocks * bs != ne[0] {
        return Err(format!(
            "ne[0] = {} is not a whole number of {bs}-element {dtype} blocks",
            ne[0]
        ));
    }
    let row = blocks
        .checked_mul(dtype.type_size() as u64)
        .ok_or_else(|| format!("row size of shape {ne:?} overflows"))?;
    ne[1..]
        .iter()
        .try_fold(row, |a, &b| a.checked_mul(b))
        .ok_or_else(|| format!("byte size of {dtype} shape {ne:?} overflows"))
}

/// Rounds `x` up to a multiple of `align` (a power of two), or None on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    x.checked_add(mask).map(|v| v & !mask)
}

/// The bytes of a GGUF file, shared: a memory mapping or an in-memory buffer.
///
/// Cloning is cheap (a reference count). A CPU buffer can hold a clone and use
/// `&bytes[file.data_offset + info.offset..][..info.size]` as a tensor's storage without copying;
/// the mapping stays alive as long as any clone does. A mapping starts on a page boundary, so
/// data aligned in the file is aligned in memory; an in-memory buffer has only the allocator's
/// alignment.
#[derive(Clone)]
pub struct GgufBytes(Storage);

#[derive(Clone)]
enum Storage {
    Mapped(Arc<memmap2::Mmap>),
    Owned(Arc<[u8]>),
}

impl GgufBytes {
    /// Whether the bytes are a memory mapping of a file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Storage::Mapped(_))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Storage::Mapped(m) => m,
            Storage::Owned(b) => b,
        }
    }
}

impl Deref for GgufBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for GgufBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for GgufBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "GgufBytes({kind}, {} bytes)", self.len())
    }
}

/// A parsed GGUF file: its metadata and tensor infos, over the file's bytes (mapped, not copied).
#[derive(Debug)]
pub struct GgufFile {
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata key/value pairs, in file order (keys are unique).
    pub metadata: Vec<(String, GgufValue)>,
    /// The tensor infos, in file order (names are unique).
    pub tensors: Vec<GgufTensorInfo>,
    /// The alignment of the data section and of each tensor's offset.
    pub alignment: u64,
    /// Where the data section starts, from the start of the file.
    pub data_offset: u64,
    bytes: GgufBytes,
    path: String,
}

impl GgufFile {
    /// Maps the file at `path` and parses it. Tensor data stays in the mapping.
    ///
    /// The file must not be changed by anyone while it is mapped (see [`memmap2::Mmap`]); model
    /// files are read-only in practice.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file =
            std::fs::File::open(path).map_err(|e| Error::io(format!("opening {name}"), e))?;
        // SAFETY: the mapping is read-only and private to this process; we rely on the file not
        // being truncated or rewritten while mapped, as every mmap-based model loader does, and
        // document it on this function.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::io(format!("mapping {name}"), e))?;
        let bytes = GgufBytes(Storage::Mapped(Arc::new(map)));
        read::parse(bytes, name)
    }

    /// Parses a GGUF file held in memory (tests, fuzzing, downloads). Errors name `<memory>`.
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Result<GgufFile> {
        read::parse(
            GgufBytes(Storage::Owned(bytes.into())),
            "<memory>".to_string(),
        )
    }

    /// The path the file was opened from (`<memory>` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &GgufBytes {
        &self.bytes
    }

    /// A shared handle on the file's bytes, for a buffer that wraps tensor data without copying.
    pub fn mapping(&self) -> GgufBytes {
        self.bytes.clone()
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn err(&self, reason: String) -> Error {
        Error::Gguf {
            path: self.path.clone(),
            reason,
        }
    }

    /// The value of a key that must be present.
    pub fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key)
            .ok_or_else(|| self.err(format!("metadata key '{key}' is missing")))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a GgufValue) -> Option<T>,
    ) -> Result<T> {
        let v = self.require(key)?;
        f(v).ok_or_else(|| {
            self.err(format!(
                "metadata key '{key}' is {}, expected {want}",
                v.describe()
            ))
        })
    }

    /// A u32 (or any integer value that fits in u32).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "an integer that fits in u32", GgufValue::as_u32)
    }

    /// A u64 (or any integer value that fits in u64).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an integer that fits in u64", GgufValue::as_u64)
    }

    /// An i32 (or any integer value that fits in i32).
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.typed(key, "an integer that fits in i32", GgufValue::as_i32)
    }

    /// An f32 (or an f64, rounded).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "f32", GgufValue::as_f32)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "bool", GgufValue::as_bool)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "string", GgufValue::as_str)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.typed(key, "array of strings", |v| {
            v.as_array()?.iter().map(GgufValue::as_str).collect()
        })
    }

    /// An array of integers that fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "array of integers that fit in i32", |v| {
            v.as_array()?.iter().map(GgufValue::as_i32).collect()
        })
    }

    /// An array of f32 (or f64, rounded).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.typed(key, "array of f32", |v| {
            v.as_array()?.iter().map(GgufValue::as_f32).collect()
        })
    }

    /// The info of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<&GgufTensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| self.err(format!("no tensor named '{name}'")))
    }

    /// The bytes of a tensor of this file, straight from the mapping (bounds were checked when
    /// the file was opened). An info that does not describe data inside this file (one from
    /// another file, or edited) gives an empty slice.
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|s| Some((s, s.checked_add(info.size)?)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?));
        range.and_then(|r| self.bytes.get(r)).unwrap_or_default()
    }
}
