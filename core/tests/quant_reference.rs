//! The newer quant types against ggml: for each type, core/tests/data/quants/<type>.gguf holds
//! random rows, ggml's quantization of them and ggml's dequantization of that
//! (scripts/reference/make_quant_references.py). Dequantizing must give ggml's floats bit for
//! bit; where tessera quantizes the type, it must give ggml's bytes.

use tessera_core::gguf::GgufFile;
use tessera_core::quant::{
    can_quantize, dequantize_row, quantize_row, quantize_row_imatrix, requires_imatrix, vec_dot,
    vec_dot_type,
};
use tessera_core::DType;

/// The reference file of `dtype`.
fn open(dtype: DType) -> GgufFile {
    let path = format!(
        "{}/tests/data/quants/{}.gguf",
        env!("CARGO_MANIFEST_DIR"),
        dtype.name()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The f32 values of tensor `name`.
fn floats(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.dtype, DType::F32);
    f.tensor_data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn every_new_type_matches_ggml() {
    for dtype in DType::QUANTIZED_IQ {
        let f = open(dtype);
        let q = f.tensor("quant").unwrap();
        assert_eq!(q.dtype, dtype, "the file's tensor type");
        let n = q.ne[0] as usize;
        let rows = q.ne[1] as usize;
        let bytes = f.tensor_data(q);
        let input = floats(&f, "input");
        let want = floats(&f, "dequant");
        let row_bytes = dtype.row_size(n).unwrap();
        let mut got = vec![0f32; n];
        let mut ours = vec![0u8; row_bytes];
        for r in 0..rows {
            let qr = &bytes[r * row_bytes..(r + 1) * row_bytes];
            dequantize_row(dtype, qr, &mut got).unwrap();
            for (j, (g, w)) in got.iter().zip(&want[r * n..(r + 1) * n]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{dtype} row {r} value {j}: {g} vs {w}"
                );
            }
            let x = &input[r * n..(r + 1) * n];
            if can_quantize(dtype) {
                quantize_row(dtype, x, &mut ours).unwrap();
                let bs = dtype.type_size();
                for (b, (o, t)) in ours.chunks(bs).zip(qr.chunks(bs)).enumerate() {
                    assert_eq!(o, t, "{dtype} row {r} block {b}: quantized bytes differ");
                }
            } else {
                let e = quantize_row(dtype, x, &mut ours).unwrap_err();
                assert!(e.to_string().contains(dtype.name()), "{e}");
            }
            // The reference dot product against 8-bit activations agrees with the f32 one.
            let yt = vec_dot_type(dtype);
            let mut y8 = vec![0u8; yt.row_size(n).unwrap()];
            quantize_row(yt, x, &mut y8).unwrap();
            let mut yd = vec![0f32; n];
            dequantize_row(yt, &y8, &mut yd).unwrap();
            let exact: f64 = got
                .iter()
                .zip(&yd)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let norm: f64 = got
                .iter()
                .zip(&yd)
                .map(|(&a, &b)| f64::from((a * b).abs()))
                .sum();
            let dot = f64::from(vec_dot(dtype, n, qr, &y8));
            assert!(
                (dot - exact).abs() <= 1e-5 * norm.max(1e-30),
                "{dtype}: dot {dot} vs {exact}"
            );
        }
    }
}

/// The lattice types whose ggml quantizer needs an importance matrix (IQ1_S, IQ2_XXS, IQ2_XS)
/// are refused by name; IQ1_M, IQ2_S and the IQ3 types are written.
#[test]
fn lattice_types_refuse_quantizing_by_name() {
    for dtype in DType::QUANTIZED_IQ {
        let refused = matches!(dtype.name(), "iq1_s" | "iq2_xxs" | "iq2_xs");
        assert_eq!(can_quantize(dtype), !refused, "{dtype}");
    }
    assert!(DType::QUANTIZED.iter().all(|&t| can_quantize(t)));
}

/// The lattice quantizers against ggml on varied rows (normal with per-32 scales, uniform,
/// heavy-tailed, tiny, with a zero sub-block, with outliers):
/// core/tests/data/quants/lattice_quant.gguf
/// (scripts/reference/make_lattice_quant_references.py). Every type tessera writes must give
/// ggml's bytes; the others are refused.
#[test]
fn lattice_quantizers_match_ggml() {
    let path = format!(
        "{}/tests/data/quants/lattice_quant.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let input = floats(&f, "input");
    let imatrix = floats(&f, "imatrix");
    let n = f.tensor("input").unwrap().ne[0] as usize;
    let mut checked = std::collections::BTreeSet::new();
    for dtype in DType::QUANTIZED_IQ {
        let Ok(q) = f.tensor(&format!("quant_{}", dtype.name())) else {
            continue;
        };
        assert_eq!(q.dtype, dtype);
        let want = f.tensor_data(q);
        let row_bytes = dtype.row_size(n).unwrap();
        let mut ours = vec![0u8; row_bytes];
        for (r, x) in input.chunks_exact(n).enumerate() {
            if requires_imatrix(dtype) {
                assert!(quantize_row(dtype, x, &mut ours).is_err(), "{dtype}");
                if quantize_row_imatrix(dtype, x, &imatrix, &mut ours).is_err() {
                    continue;
                }
            } else {
                quantize_row(dtype, x, &mut ours).unwrap();
            }
            checked.insert(dtype);
            let bs = dtype.type_size();
            let theirs = &want[r * row_bytes..(r + 1) * row_bytes];
            for (b, (o, t)) in ours.chunks(bs).zip(theirs.chunks(bs)).enumerate() {
                assert_eq!(o, t, "{dtype} row {r} block {b}: quantized bytes differ");
            }
        }
    }
    assert_eq!(checked.len(), 7, "lattice types checked: {checked:?}");
}
