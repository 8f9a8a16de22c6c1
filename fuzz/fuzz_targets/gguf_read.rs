//! Fuzzes the GGUF reader: any bytes must parse or give an error, never panic, and every tensor
//! of a file that parses must have its whole data inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut sum = 0u8;
    for t in &file.tensors {
        let bytes = file.tensor_data(t);
        assert_eq!(
            bytes.len() as u64,
            t.size,
            "tensor '{}' data is not its size",
            t.name
        );
        sum = bytes.iter().fold(sum, |a, &b| a.wrapping_add(b));
        assert!(t.offset % file.alignment == 0);
        assert!(file.tensor(&t.name).is_ok());
    }
    for (k, v) in &file.metadata {
        assert!(file.get(k).is_some());
        let _ = (
            v.as_u64(),
            v.as_f32(),
            v.as_str(),
            v.as_array().map(<[_]>::len),
        );
    }
    std::hint::black_box(sum);
});
