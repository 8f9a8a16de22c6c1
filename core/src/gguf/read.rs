//! The GGUF parser: a bounds-checked cursor over the file's bytes.

use std::collections::HashMap;

use super::{
    align_up, tensor_size, GgufBytes, GgufFile, GgufTensorInfo, GgufType, GgufValue, ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The fewest bytes a key/value pair takes: key length, value type, a one-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// The fewest bytes a tensor info takes: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// A read position in the file. `pos <= buf.len()` always holds.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a str,
    /// What is being read (a key, a tensor info), for error messages.
    ctx: String,
}

impl<'a> Cursor<'a> {
    fn err(&self, at: usize, what: impl std::fmt::Display) -> Error {
        let ctx = if self.ctx.is_empty() {
            String::new()
        } else {
            format!("{}: ", self.ctx)
        };
        Error::Gguf {
            path: self.path.to_string(),
            reason: format!("{ctx}{what} (at byte {at})"),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let at = self.pos;
        let slice = at
            .checked_add(n)
            .and_then(|end| self.buf.get(at..end))
            .ok_or_else(|| {
                self.err(
                    at,
                    format!(
                        "{what} needs {n} bytes but the file ends after {} (file is {} bytes)",
                        self.remaining(),
                        self.buf.len()
                    ),
                )
            })?;
        self.pos = at + n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in the bytes left,
    /// and returns the count as usize (safe to reserve). `at` is where the count was read.
    fn check_count(&self, count: u64, min_size: u64, what: &str, at: usize) -> Result<usize> {
        let left = self.remaining() as u64;
        match count.checked_mul(min_size) {
            Some(need) if need <= left => usize::try_from(count)
                .map_err(|_| self.err(at, format!("{what} {count} does not fit in memory"))),
            _ => Err(self.err(
                at,
                format!(
                    "{what} {count} cannot fit: each takes at least {min_size} bytes and only \
                     {left} bytes are left"
                ),
            )),
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(&format!("length of {what}"))?;
        let left = self.remaining() as u64;
        if len > left {
            return Err(self.err(
                at,
                format!("{what} has length {len} but only {left} bytes are left in the file"),
            ));
        }
        // len <= remaining <= usize::MAX, so the conversion cannot fail.
        let n = usize::try_from(len).map_err(|_| self.err(at, "string length overflow"))?;
        let bytes = self.take(n, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| {
            self.err(
                at + 8 + e.valid_up_to(),
                format!("{what} is not valid UTF-8"),
            )
        })
    }

    fn value_type(&mut self, what: &str) -> Result<GgufType> {
        let at = self.pos;
        let id = self.u32(what)?;
        GgufType::from_id(id)
            .ok_or_else(|| self.err(at, format!("unknown {what} id {id} (known: 0 to 12)")))
    }

    /// Reads one value of type `ty`; `depth` is how many arrays enclose it.
    fn value(&mut self, ty: GgufType, depth: u32) -> Result<GgufValue> {
        Ok(match ty {
            GgufType::U8 => GgufValue::U8(self.u8("u8 value")?),
            GgufType::I8 => GgufValue::I8(i8::from_le_bytes(self.array("i8 value")?)),
            GgufType::U16 => GgufValue::U16(self.u16("u16 value")?),
            GgufType::I16 => GgufValue::I16(i16::from_le_bytes(self.array("i16 value")?)),
            GgufType::U32 => GgufValue::U32(self.u32("u32 value")?),
            GgufType::I32 => GgufValue::I32(i32::from_le_bytes(self.array("i32 value")?)),
            GgufType::U64 => GgufValue::U64(self.u64("u64 value")?),
            GgufType::I64 => GgufValue::I64(i64::from_le_bytes(self.array("i64 value")?)),
            GgufType::F32 => GgufValue::F32(f32::from_le_bytes(self.array("f32 value")?)),
            GgufType::F64 => GgufValue::F64(f64::from_le_bytes(self.array("f64 value")?)),
            GgufType::Bool => {
                let at = self.pos;
                match self.u8("bool value")? {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => return Err(self.err(at, format!("bool value is {b}, not 0 or 1"))),
                }
            }
            GgufType::String => GgufValue::String(self.string("string value")?),
            GgufType::Array => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(
                        at,
                        format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
                    ));
                }
                let elem = self.value_type("array element type")?;
                let count_at = self.pos;
                let count = self.u64("array length")?;
                let n = self.check_count(
                    count,
                    elem.min_encoded_size(),
                    &format!("array length (of {elem})"),
                    count_at,
                )?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
        })
    }
}

/// Reads the header and checks the magic and version.
fn header(c: &mut Cursor<'_>) -> Result<u32> {
    let magic = c.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(c.err(
            0,
            format!(
                "bad magic \"{}\", expected \"GGUF\" (not a GGUF file)",
                magic.escape_ascii()
            ),
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(c.err(4, "GGUF version 1 is not supported (only versions 2 and 3)")),
        v if matches!(v.swap_bytes(), 1..=3) => Err(c.err(
            4,
            format!(
                "version {v} reads as {} byte-swapped: a big-endian file, which is not \
                 supported (only little-endian)",
                v.swap_bytes()
            ),
        )),
        v => Err(c.err(4, format!("unknown GGUF version {v} (supported: 2 and 3)"))),
    }
}

/// The alignment given by `general.alignment`, or the default.
fn alignment(c: &Cursor<'_>, metadata: &[(String, GgufValue)]) -> Result<u64> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_u32() {
        Some(a) if a.is_power_of_two() => Ok(a.into()),
        _ => Err(Error::Gguf {
            path: c.path.to_string(),
            reason: format!("{ALIGNMENT_KEY} is {v:?}, expected a u32 power of two"),
        }),
    }
}

/// Reads one tensor info; `index` is its position in the file.
fn tensor_info(c: &mut Cursor<'_>, index: usize) -> Result<GgufTensorInfo> {
    c.ctx = format!("tensor info #{index}");
    let start = c.pos;
    let name = c.string("tensor name")?;
    c.ctx = format!("tensor info #{index} '{name}'");
    let dims_at = c.pos;
    let n_dims = c.u32("n_dims")?;
    if n_dims as usize > MAX_DIMS {
        return Err(c.err(
            dims_at,
            format!("n_dims is {n_dims}, at most {MAX_DIMS} allowed"),
        ));
    }
    let mut ne = [1u64; 4];
    for (d, slot) in ne.iter_mut().take(n_dims as usize).enumerate() {
        let at = c.pos;
        let v = c.u64("dimension")?;
        if v > i64::MAX as u64 {
            return Err(c.err(at, format!("ne[{d}] = {v} is larger than i64::MAX")));
        }
        *slot = v;
    }
    let type_at = c.pos;
    let id = c.u32("tensor type")?;
    let dtype = DType::from_gguf_id(id)
        .map_err(|_| c.err(type_at, format!("unknown tensor type id {id}")))?;
    let offset = c.u64("tensor data offset")?;
    let size = tensor_size(dtype, &ne).map_err(|reason| c.err(start, reason))?;
    Ok(GgufTensorInfo {
        name,
        dtype,
        ne,
        n_dims,
        offset,
        size,
    })
}

/// Parses a whole file.
pub(super) fn parse(bytes: GgufBytes, path: String) -> Result<GgufFile> {
    let buf = bytes.as_slice();
    let mut c = Cursor {
        buf,
        pos: 0,
        path: &path,
        ctx: String::new(),
    };
    let version = header(&mut c)?;
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata key/value count")?;
    let n_kv = c.check_count(kv_count, MIN_KV_SIZE, "metadata key/value count", 16)?;
    let n_tensors = c.check_count(tensor_count, MIN_TENSOR_INFO_SIZE, "tensor count", 8)?;

    let mut metadata: Vec<(String, GgufValue)> = Vec::with_capacity(n_kv);
    let mut keys: HashMap<String, usize> = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        c.ctx = format!("metadata #{i}");
        let key_at = c.pos;
        let key = c.string("key")?;
        c.ctx = format!("metadata #{i} '{key}'");
        if let Some(prev) = keys.get(&key) {
            return Err(c.err(
                key_at,
                format!("duplicate key (first given by metadata #{prev})"),
            ));
        }
        let ty = c.value_type("value type")?;
        let value = c.value(ty, 0)?;
        keys.insert(key.clone(), i);
        metadata.push((key, value));
    }
    c.ctx.clear();
    let alignment = alignment(&c, &metadata)?;

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut info_at = Vec::with_capacity(n_tensors);
    let mut names: HashMap<String, usize> = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let at = c.pos;
        let info = tensor_info(&mut c, i)?;
        if let Some(prev) = names.get(&info.name) {
            return Err(c.err(
                at,
                format!("duplicate tensor name (first given by tensor #{prev})"),
            ));
        }
        names.insert(info.name.clone(), i);
        tensors.push(info);
        info_at.push(at);
    }
    c.ctx.clear();

    let infos_end = c.pos as u64;
    let data_offset = align_up(infos_end, alignment)
        .ok_or_else(|| c.err(c.pos, "data section offset overflows"))?;
    let file_len = buf.len() as u64;
    for (i, (t, &at)) in tensors.iter().zip(&info_at).enumerate() {
        c.ctx = format!("tensor info #{i} '{}'", t.name);
        if t.offset % alignment != 0 {
            return Err(c.err(
                at,
                format!(
                    "data offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                ),
            ));
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        match end {
            Some(e) if e <= file_len => {}
            _ => {
                return Err(c.err(
                    at,
                    format!(
                        "data ({} bytes at data offset {}, data section starts at byte \
                         {data_offset}) runs past the end of the file ({file_len} bytes)",
                        t.size, t.offset
                    ),
                ))
            }
        }
    }
    Ok(GgufFile {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        bytes,
        path,
    })
}
