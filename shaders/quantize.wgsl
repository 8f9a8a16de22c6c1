// Block quantization into dst (included by the families that write quantized blocks: cpy
// and set_rows). The quantizers are ggml's reference ones, as core/src/quant has them:
// Q4_0 and Q5_0 scale by the value of largest magnitude, Q4_1 and Q5_1 by min and max, Q8_0 by
// the largest magnitude with halfway cases rounded to even. Blocks need not be word aligned:
// bytes go through put_byte (dst is atomic for quantized types).

// The 32 values of the block being quantized.
var<private> xs: array<f32, 32>;

// Writes f16 bits h at byte b.
fn put_half(b: u32, h: u32) {
    put_byte(b, h & 0xffu);
    put_byte(b + 1u, h >> 8u);
}

// 1 / d, or 0 when d is 0.
fn inverse(d: f32) -> f32 {
    return select(0.0, 1.0 / d, d != 0.0);
}

// Quantizes xs into a block of type t at byte b.
fn quantize_block(t: u32, b: u32) {
    var amax = 0.0;
    var vmax = 0.0;
    var lo = xs[0];
    var hi = xs[0];
    for (var j = 0u; j < 32u; j++) {
        let v = xs[j];
        if amax < abs(v) {
            amax = abs(v);
            vmax = v;
        }
        lo = min(lo, v);
        hi = max(hi, v);
    }
    switch t {
        case 8u: {
            let d = amax / 127.0;
            let id = inverse(d);
            put_half(b, f16_bits(d));
            for (var j = 0u; j < 32u; j++) {
                put_byte(b + 2u + j, u32(i32(round(xs[j] * id))) & 0xffu);
            }
        }
        case 2u, 6u: {
            let levels = select(8.0, 16.0, t == 6u);
            let d = vmax / -levels;
            let id = inverse(d);
            put_half(b, f16_bits(d));
            var qh = 0u;
            let qs = select(2u, 6u, t == 6u);
            for (var j = 0u; j < 16u; j++) {
                let top = select(15u, 31u, t == 6u);
                let q0 = min(u32(max(xs[j] * id + levels + 0.5, 0.0)), top);
                let q1 = min(u32(max(xs[j + 16u] * id + levels + 0.5, 0.0)), top);
                put_byte(b + qs + j, (q0 & 15u) | ((q1 & 15u) << 4u));
                qh |= ((q0 >> 4u) << j) | ((q1 >> 4u) << (j + 16u));
            }
            if t == 6u {
                for (var k = 0u; k < 4u; k++) {
                    put_byte(b + 2u + k, qh >> (8u * k));
                }
            }
        }
        case 3u, 7u: {
            let top = select(15u, 31u, t == 7u);
            let d = (hi - lo) / f32(top);
            let id = inverse(d);
            put_half(b, f16_bits(d));
            put_half(b + 2u, f16_bits(lo));
            var qh = 0u;
            let qs = select(4u, 8u, t == 7u);
            for (var j = 0u; j < 16u; j++) {
                let q0 = min(u32(max((xs[j] - lo) * id + 0.5, 0.0)), top);
                let q1 = min(u32(max((xs[j + 16u] - lo) * id + 0.5, 0.0)), top);
                put_byte(b + qs + j, (q0 & 15u) | ((q1 & 15u) << 4u));
                qh |= ((q0 >> 4u) << j) | ((q1 >> 4u) << (j + 16u));
            }
            if t == 7u {
                for (var k = 0u; k < 4u; k++) {
                    put_byte(b + 4u + k, qh >> (8u * k));
                }
            }
        }
        default: {}
    }
}
