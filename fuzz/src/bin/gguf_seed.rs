//! Writes the seed corpus of the `gguf_read` fuzz target: small valid files made by
//! `GgufWriter`. Usage: `cargo run --bin gguf_seed -- corpus/gguf_read`.

use std::path::PathBuf;

use tessera_core::gguf::{GgufValue, GgufWriter, ALIGNMENT_KEY};
use tessera_core::{DType, Result};

/// A file with metadata of every value type and tensors of a plain and a quantized type.
fn rich(alignment: Option<u32>) -> Result<Vec<u8>> {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.add_metadata(ALIGNMENT_KEY, a)?;
    }
    w.add_metadata("general.architecture", "llama")?;
    w.add_metadata("u8", 1u8)?;
    w.add_metadata("i8", -1i8)?;
    w.add_metadata("u16", 2u16)?;
    w.add_metadata("i16", -2i16)?;
    w.add_metadata("u32", 3u32)?;
    w.add_metadata("i32", -3i32)?;
    w.add_metadata("u64", 4u64)?;
    w.add_metadata("i64", -4i64)?;
    w.add_metadata("f32", 0.5f32)?;
    w.add_metadata("f64", 0.25f64)?;
    w.add_metadata("bool", true)?;
    w.add_metadata("tokens", vec!["a", "bc"])?;
    w.add_metadata("types", vec![1i32, 3])?;
    w.add_metadata("nested", vec![vec![1u8], vec![]])?;
    w.add_metadata("empty", GgufValue::Array(vec![]))?;
    w.add_tensor("f32", DType::F32, &[2, 2], vec![1u8; 16])?;
    w.add_tensor("q4_0", DType::Q4_0, &[32], vec![2u8; 18])?;
    w.add_tensor("f16", DType::F16, &[1, 1, 1, 3], vec![3u8; 6])?;
    w.to_bytes()
}

fn main() -> Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "corpus/gguf_read".into()),
    );
    std::fs::create_dir_all(&dir)
        .map_err(|e| tessera_core::Error::io(dir.display().to_string(), e))?;
    let mut tiny = GgufWriter::new();
    tiny.add_tensor("t", DType::F32, &[1], vec![0u8; 4])?;
    let seeds = [
        ("rich.gguf", rich(None)?),
        ("rich_align64.gguf", rich(Some(64))?),
        ("tiny.gguf", tiny.to_bytes()?),
        ("empty.gguf", GgufWriter::new().to_bytes()?),
    ];
    for (name, bytes) in seeds {
        let path = dir.join(name);
        std::fs::write(&path, bytes)
            .map_err(|e| tessera_core::Error::io(path.display().to_string(), e))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
