//! cpy of f32 into every block type on the GPU gives the host quantizer's bytes: the GPU's
//! quantizers (the K types' scale searches above all) are bit-exact ports, so that a model
//! quantized on either side is the same file. The value-level check of every op, this cpy
//! included, is the shared suite's (tessera-conformance); this test checks the bytes. Prints
//! "skipped: <reason>" and passes when no CUDA device is present.

mod common;

use common::*;
use tessera_core::dtype::DType;
use tessera_core::Graph;

#[test]
fn quantizers_match_the_host_bit_for_bit() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(3);
    for q in DType::QUANTIZED {
        let x = rng.vec(256 * 3, -1.0, 1.0);
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[256, 3]).unwrap();
        let b = g.input("b", q, &[256, 3]).unwrap();
        let c = g.cpy(a, b).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[
                (a, to_bytes(DType::F32, &x)),
                (b, vec![0u8; q.row_size(768).unwrap()]),
            ],
            &[c],
        );
        let want = to_bytes(q, &x);
        let diff = out[0].iter().zip(&want).filter(|(a, b)| a != b).count();
        // Which fields differ says which step went wrong (super-scale, scales, quants).
        let ts = q.type_size();
        let differing = out[0]
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (o, w))| o != w);
        for (i, (o, w)) in differing.take(8) {
            eprintln!(
                "{} block {} byte {}: {o:#04x}, host {w:#04x}",
                q.name(),
                i / ts,
                i % ts
            );
        }
        // Q8_0's host quantizer may use SIMD arithmetic: allow a rare last-bit difference there.
        let dec = from_bytes(q, &out[0], 768);
        check(
            &format!("quantize f32->{} ({diff} bytes differ)", q.name()),
            &dec,
            &from_bytes(q, &want, 768),
            if q == DType::Q8_0 { 1e-6 } else { 0.0 },
        );
    }
}
