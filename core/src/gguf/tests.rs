//! Tests of the GGUF reader and writer: round trips, every kind of damage, the real model.

use super::write::TensorData;
use super::*;

/// The bytes a writer holds for a tensor (tests add only byte tensors to the writers they
/// inspect).
fn held<'a>(d: &'a TensorData<'a>) -> &'a [u8] {
    match d {
        TensorData::Bytes(b) => b,
        TensorData::Produced(_) => panic!("a produced tensor holds no bytes"),
    }
}

/// A small valid file: metadata of every type (nested arrays included) and three tensors.
fn sample_writer() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("a.u8", 7u8).unwrap();
    w.add_metadata("a.i8", -7i8).unwrap();
    w.add_metadata("a.u16", 700u16).unwrap();
    w.add_metadata("a.i16", -700i16).unwrap();
    w.add_metadata("a.u32", 70_000u32).unwrap();
    w.add_metadata("a.i32", -70_000i32).unwrap();
    w.add_metadata("a.u64", 1u64 << 40).unwrap();
    w.add_metadata("a.i64", -(1i64 << 40)).unwrap();
    w.add_metadata("a.f32", 1.5f32).unwrap();
    w.add_metadata("a.f64", -2.25f64).unwrap();
    w.add_metadata("a.bool", true).unwrap();
    w.add_metadata("a.strs", vec!["x", "yz", ""]).unwrap();
    w.add_metadata("a.i32s", vec![1i32, -2, 3]).unwrap();
    w.add_metadata("a.f32s", vec![0.5f32, 1.0]).unwrap();
    w.add_metadata("a.nested", vec![vec![1u8, 2], vec![], vec![3]])
        .unwrap();
    w.add_metadata("a.empty", GgufValue::Array(vec![])).unwrap();
    let f32_data: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("w.f32", DType::F32, &[4, 2], f32_data)
        .unwrap();
    let q: Vec<u8> = (0..36u8).collect();
    w.add_tensor("w.q4_0", DType::Q4_0, &[32, 2], q).unwrap();
    w.add_tensor("w.i32", DType::I32, &[3], vec![9u8; 12])
        .unwrap();
    w
}

fn sample() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

/// Builds raw files field by field, for damage the writer would refuse to make.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A tensor info.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len().next_multiple_of(32), 0);
        self.0.resize(self.0.len() + n, 0xab);
        self
    }
}

/// Parses `bytes`, expecting an error whose message holds every one of `parts`.
fn expect_err(bytes: Vec<u8>, parts: &[&str]) {
    let e = match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("expected an error containing {parts:?}"),
        Err(e) => e.to_string(),
    };
    for p in parts {
        assert!(e.contains(p), "error '{e}' does not contain '{p}'");
    }
}

#[test]
fn gguf_round_trip_bytes() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.metadata, w.metadata);
    assert_eq!(f.tensors.len(), 3);
    for (t, (wt, data)) in f.tensors.iter().zip(&w.tensors) {
        assert_eq!(t.name, wt.name);
        assert_eq!(t.dtype, wt.dtype);
        assert_eq!(t.ne, wt.ne);
        assert_eq!(t.n_dims, wt.n_dims);
        assert_eq!(t.size, held(data).len() as u64);
        assert_eq!(t.offset % 32, 0);
        assert_eq!(f.tensor_data(t), held(data));
    }
    let q = f.tensor("w.q4_0").unwrap();
    assert_eq!(
        (q.dtype, q.shape(), q.n_elements(), q.size),
        (DType::Q4_0, &[32, 2][..], 64, 36)
    );
    assert_eq!(f.tensor("w.i32").unwrap().shape(), &[3]);
    // Writing what was read gives the same bytes.
    let mut w2 = GgufWriter::new();
    for (k, v) in &f.metadata {
        w2.add_metadata(k.clone(), v.clone()).unwrap();
    }
    for t in &f.tensors {
        w2.add_tensor(t.name.clone(), t.dtype, t.shape(), f.tensor_data(t))
            .unwrap();
    }
    assert_eq!(w2.to_bytes().unwrap(), sample());
}

#[test]
fn gguf_getters() {
    let f = GgufFile::from_bytes(sample()).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("a.u32").unwrap(), 70_000);
    assert_eq!(f.get_u32("a.u8").unwrap(), 7);
    assert_eq!(f.get_u64("a.u64").unwrap(), 1 << 40);
    assert_eq!(f.get_i32("a.i16").unwrap(), -700);
    assert_eq!(f.get_f32("a.f32").unwrap(), 1.5);
    assert_eq!(f.get_f32("a.f64").unwrap(), -2.25);
    assert!(f.get_bool("a.bool").unwrap());
    assert_eq!(f.get_str_array("a.strs").unwrap(), ["x", "yz", ""]);
    assert_eq!(f.get_i32_array("a.i32s").unwrap(), [1, -2, 3]);
    assert_eq!(f.get_f32_array("a.f32s").unwrap(), [0.5, 1.0]);
    assert_eq!(f.get("a.i64").and_then(GgufValue::as_i64), Some(-(1 << 40)));
    assert_eq!(
        f.get("a.nested")
            .and_then(GgufValue::as_array)
            .map(<[_]>::len),
        Some(3)
    );
    assert!(f.get_i32_array("a.empty").unwrap().is_empty());
    let e = f.get_u32("no.such.key").unwrap_err().to_string();
    assert!(e.contains("'no.such.key'") && e.contains("missing"), "{e}");
    let e = f.get_u32("a.i32").unwrap_err().to_string();
    assert!(e.contains("'a.i32'") && e.contains("i32"), "{e}");
    let e = f.get_str_array("a.i32s").unwrap_err().to_string();
    assert!(
        e.contains("'a.i32s'") && e.contains("array of 3 i32"),
        "{e}"
    );
    let e = f.tensor("nope").unwrap_err().to_string();
    assert!(e.contains("no tensor named 'nope'"), "{e}");
}

#[test]
fn gguf_round_trip_file_and_alignment() {
    let dir = std::env::temp_dir().join(format!("tessera-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let mut w = sample_writer();
    w.add_metadata(ALIGNMENT_KEY, 64u32).unwrap();
    w.write_file(&path).unwrap();
    // Writing again over an existing file replaces it.
    w.write_file(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["model.gguf"], "temporary files left behind");
    let f = GgufFile::open(&path).unwrap();
    assert!(f.bytes().is_mapped());
    assert_eq!(f.path(), path.display().to_string());
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_offset % 64, 0);
    for (t, (_, data)) in f.tensors.iter().zip(&w.tensors) {
        assert_eq!(t.offset % 64, 0);
        assert_eq!(f.tensor_data(t), held(data));
    }
    let shared = f.mapping();
    let t = f.tensor("w.f32").unwrap();
    let start = (f.data_offset + t.offset) as usize;
    assert_eq!(&shared[start..start + 8], &[0, 0, 0, 0, 0, 0, 0x80, 0x3f]);
    drop(f);
    assert_eq!(shared.len() as u64, std::fs::metadata(&path).unwrap().len());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gguf_produced_tensors() {
    // A produced tensor writes the same file as one given as bytes.
    let f32_data: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let calls = std::cell::Cell::new(0);
    let mut given = GgufWriter::new();
    given
        .add_tensor("a", DType::F32, &[4, 2], f32_data.clone())
        .unwrap();
    given
        .add_tensor("b", DType::F32, &[4, 2], f32_data.clone())
        .unwrap();
    let mut produced = GgufWriter::new();
    produced
        .add_tensor("a", DType::F32, &[4, 2], f32_data.clone())
        .unwrap();
    produced
        .add_tensor_with("b", DType::F32, &[4, 2], |w| {
            calls.set(calls.get() + 1);
            // In two pieces, as a streaming producer writes.
            w.write_all(&f32_data[..12])
                .map_err(|e| Error::io("test", e))?;
            w.write_all(&f32_data[12..])
                .map_err(|e| Error::io("test", e))
        })
        .unwrap();
    assert!(produced
        .add_tensor_with("b", DType::F32, &[4], |_| Ok(()))
        .is_err());
    assert_eq!(produced.to_bytes().unwrap(), given.to_bytes().unwrap());
    assert_eq!(calls.get(), 1);

    // A producer that writes the wrong size, or fails, fails the write and leaves no file.
    let dir = std::env::temp_dir().join(format!("tessera-gguf-produced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.gguf");
    let mut short = GgufWriter::new();
    short
        .add_tensor_with("s", DType::F32, &[4], |w| {
            w.write_all(&[0; 12]).map_err(|e| Error::io("test", e))
        })
        .unwrap();
    let e = short.write_file(&path).unwrap_err().to_string();
    assert!(e.contains("'s'") && e.contains("wrote 12 bytes"), "{e}");
    let mut failing = GgufWriter::new();
    failing
        .add_tensor_with("f", DType::F32, &[4], |_| {
            Err(Error::Invalid("no data".into()))
        })
        .unwrap();
    let e = failing.write_file(&path).unwrap_err().to_string();
    assert_eq!(e, "no data");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "files left behind"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gguf_writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u32).unwrap();
    assert!(w.add_metadata("k", 2u32).is_err());
    let mixed = GgufValue::Array(vec![GgufValue::U8(1), GgufValue::I8(1)]);
    assert!(w.add_metadata("mixed", mixed).is_err());
    assert!(w.add_metadata(ALIGNMENT_KEY, 48u32).is_err());
    assert!(w.add_metadata(ALIGNMENT_KEY, 64u64).is_err());
    let mut deep = GgufValue::Array(vec![]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = GgufValue::Array(vec![deep]);
    }
    assert!(w.add_metadata("deep", deep).is_err());
    assert!(w.add_tensor("t", DType::F32, &[2], vec![0u8; 7]).is_err());
    assert!(w.add_tensor("t", DType::Q4_0, &[16], vec![0u8; 9]).is_err());
    assert!(w
        .add_tensor("t", DType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .is_err());
    assert!(w
        .add_tensor("t", DType::F32, &[u64::MAX, 2], vec![])
        .is_err());
    w.add_tensor("t", DType::F32, &[1], vec![0u8; 4]).unwrap();
    assert!(w.add_tensor("t", DType::F32, &[1], vec![0u8; 4]).is_err());
}

#[test]
fn gguf_bad_magic() {
    let mut b = sample();
    b[..4].copy_from_slice(b"GGML");
    expect_err(b, &["bad magic", "GGML", "at byte 0"]);
}

#[test]
fn gguf_versions() {
    let mut b = sample();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::from_bytes(b).unwrap().version, 2);
    let mut b = sample();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_err(b, &["version 1 is not supported", "at byte 4"]);
    let mut b = sample();
    b[4..8].copy_from_slice(&4u32.to_le_bytes());
    expect_err(b, &["unknown GGUF version 4", "at byte 4"]);
    let mut b = sample();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_err(b, &["big-endian"]);
}

#[test]
fn gguf_counts_past_end() {
    expect_err(
        Raw::header(3, 0, 1 << 40).0,
        &["key/value count", "cannot fit", "at byte 16"],
    );
    expect_err(
        Raw::header(3, u64::MAX, 0).0,
        &["tensor count", "cannot fit", "at byte 8"],
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("arr")
        .u32(GgufType::Array.id())
        .u32(GgufType::U64.id())
        .u64(1 << 50);
    expect_err(r.0, &["'arr'", "array length", "cannot fit"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("arr")
        .u32(GgufType::Array.id())
        .u32(GgufType::U32.id())
        .u64(3)
        .u32(1)
        .u32(2);
    expect_err(
        r.0,
        &["'arr'", "array length (of u32) 3 cannot fit", "at byte 43"],
    );
    // The count fits the bytes left, but the second string does not.
    let mut r = Raw::header(3, 0, 1);
    r.str("arr")
        .u32(GgufType::Array.id())
        .u32(GgufType::String.id())
        .u64(2)
        .str("abcdefghijkl");
    expect_err(
        r.0,
        &[
            "'arr'",
            "length of string value needs 8 bytes",
            "at byte 71",
        ],
    );
}

#[test]
fn gguf_string_lengths_past_end() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(b"key and some more bytes");
    expect_err(r.0, &["metadata #0", "key has length", "at byte 24"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("s")
        .u32(GgufType::String.id())
        .u64(100)
        .bytes(b"short");
    expect_err(r.0, &["'s'", "string value has length 100", "at byte 37"]);
    let mut r = Raw::header(3, 1, 0);
    r.u64(1 << 62).bytes(&[0; 40]);
    expect_err(r.0, &["tensor info #0", "tensor name has length"]);
}

#[test]
fn gguf_tensor_data_out_of_range() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 0).data(31);
    expect_err(r.0, &["'t'", "runs past the end of the file", "at byte 24"]);
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, u64::MAX - 31).data(32);
    expect_err(r.0, &["'t'", "runs past the end"]);
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 0).data(32);
    assert_eq!(GgufFile::from_bytes(r.0).unwrap().tensors[0].size, 32);
}

#[test]
fn gguf_misaligned_tensor_data() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 4).data(64);
    expect_err(
        r.0,
        &["'t'", "data offset 4 is not a multiple of the alignment 32"],
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(ALIGNMENT_KEY).u32(GgufType::U32.id()).u32(24);
    expect_err(r.0, &[ALIGNMENT_KEY, "power of two"]);
    let mut r = Raw::header(3, 0, 1);
    r.str(ALIGNMENT_KEY).u32(GgufType::U32.id()).u32(0);
    expect_err(r.0, &[ALIGNMENT_KEY, "power of two"]);
}

#[test]
fn gguf_unknown_types() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 4, 0).data(64);
    expect_err(r.0, &["'t'", "unknown tensor type id 4"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    expect_err(r.0, &["'k'", "unknown value type id 13", "at byte 33"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(GgufType::Array.id()).u32(99).u64(0);
    expect_err(r.0, &["'k'", "unknown array element type id 99"]);
}

#[test]
fn gguf_shape_overflow() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1 << 32, 1 << 32, 1 << 32, 1], 0, 0)
        .data(64);
    expect_err(r.0, &["'t'", "more than i64::MAX elements", "at byte 24"]);
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[u64::MAX], 0, 0).data(64);
    expect_err(r.0, &["'t'", "larger than i64::MAX"]);
    // Elements fit in i64 but bytes do not.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1 << 31, 1 << 31], 27, 0).data(64);
    expect_err(r.0, &["'t'", "overflows"]);
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[33], DType::Q4_0.gguf_id(), 0).data(64);
    expect_err(
        r.0,
        &["'t'", "not a whole number of 32-element q4_0 blocks"],
    );
}

#[test]
fn gguf_too_many_dims() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(64);
    expect_err(r.0, &["'t'", "n_dims is 5", "at byte 33"]);
}

#[test]
fn gguf_duplicates() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32).data(64);
    expect_err(
        r.0,
        &["tensor info #1 't'", "duplicate tensor name", "tensor #0"],
    );
    let mut r = Raw::header(3, 0, 2);
    r.str("k")
        .u32(GgufType::U8.id())
        .bytes(&[1])
        .str("k")
        .u32(GgufType::U8.id())
        .bytes(&[2]);
    expect_err(r.0, &["metadata #1 'k'", "duplicate key"]);
}

#[test]
fn gguf_bad_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(GgufType::Bool.id()).bytes(&[2]);
    expect_err(r.0, &["'b'", "bool value is 2"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("s")
        .u32(GgufType::String.id())
        .u64(2)
        .bytes(&[0xc3, 0x28]);
    expect_err(r.0, &["'s'", "not valid UTF-8"]);
    // Arrays nested past the limit, with a huge claimed depth that would overflow the stack.
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(GgufType::Array.id());
    for _ in 0..10_000 {
        r.u32(GgufType::Array.id()).u64(1);
    }
    expect_err(r.0, &["'deep'", "nested deeper than"]);
}

#[test]
fn gguf_truncated_at_every_offset() {
    let b = sample();
    assert!(GgufFile::from_bytes(b.clone()).is_ok());
    // The last tensor's data padding is optional; every cut before its data ends is an error.
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    let end = f
        .tensors
        .iter()
        .map(|t| f.data_offset + t.offset + t.size)
        .max()
        .unwrap();
    for n in 0..end as usize {
        let e = GgufFile::from_bytes(b[..n].to_vec()).expect_err("truncated file parsed");
        assert!(e.to_string().contains("at byte"), "{e}");
    }
}

#[test]
fn gguf_byte_flips_never_panic() {
    let b = sample();
    for i in 0..b.len() {
        for v in [0x00, 0xff, 0x80, 0x01] {
            let mut c = b.clone();
            c[i] = v;
            if let Ok(f) = GgufFile::from_bytes(c) {
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.size);
                }
            }
        }
    }
}

#[test]
fn gguf_smollm2_model_when_present() {
    let path = std::path::Path::new("/root/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        println!("skipped: {} is absent", path.display());
        return;
    }
    let f = GgufFile::open(path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(f.metadata.len(), 33);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, 1_785_664);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(f.get_str_array("tokenizer.ggml.merges").unwrap()[0], "Ġ t");
    let check = |name: &str, dtype, shape: &[u64], offset, size| {
        let t = f.tensor(name).unwrap();
        assert_eq!(
            (t.dtype, t.shape(), t.offset, t.size),
            (dtype, shape, offset, size),
            "{name}"
        );
        assert_eq!(f.tensor_data(t).len() as u64, size);
    };
    check(
        "token_embd.weight",
        DType::Q8_0,
        &[576, 49152],
        0,
        30_081_024,
    );
    check(
        "blk.0.attn_norm.weight",
        DType::F32,
        &[576],
        30_081_024,
        2304,
    );
    check(
        "blk.0.ffn_down.weight",
        DType::Q4_1,
        &[1536, 576],
        30_083_328,
        552_960,
    );
    check(
        "blk.0.attn_k.weight",
        DType::Q4_1,
        &[576, 192],
        31_744_512,
        69_120,
    );
    assert!(f.bytes().is_mapped());
    assert_eq!(f.bytes().len(), 98_362_432);
}
