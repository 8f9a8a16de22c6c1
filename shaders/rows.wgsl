// get_rows and set_rows (op family "rows").
//
// get_rows: one invocation per element of dst [n, m, d2, d3]: row idx[i1, i2, i3] of src0
// (any type T0; quantized rows dequantized), written as f32 (raw words for i32: OP 1).
// set_rows: one invocation per element of src0 (the f32 rows b): written to dst row
// idx[i1, i2 % ., i3 % .] (i32 or i64 indices: T1), converted to DT.
// set_rows into a quantized dst (OP 3, QDST): one invocation per QK-value block of src0.
// Defines: OP 0 get_rows, 1 get_rows raw words, 2 set_rows, 3 quantizing set_rows; QUANT:
// T0 is quantized. Params: u.x: invocations.

const OP: u32 = {{OP}}u;

// The row index stored at byte b of src1 (i32, or the low word of an i64), clamped below
// `rows`: an index out of range reads or writes the last row rather than outside the tensor.
fn index1(b: u32, rows: u32) -> u32 {
    return min(src1[b >> 2u], rows - 1u);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
#if QDST
    let c = coords(i * QK, P.s0.ne);
    let r = index1(P.off.z + c.y * P.s1.nb.x + (c.z % P.s1.ne.y) * P.s1.nb.y + (c.w % P.s1.ne.z) * P.s1.nb.z, P.d.ne.y);
    for (var j = 0u; j < QK; j++) {
        xs[j] = ld0(P.off.y + at(c, P.s0.nb) + j * P.s0.nb.x);
    }
    quantize_block(DT, P.off.x + r * P.d.nb.y + c.z * P.d.nb.z + c.w * P.d.nb.w + (c.x / QK) * P.d.nb.x);
#else
    if OP == 2u {
        let c = coords(i, P.s0.ne);
        let ib = P.off.z + c.y * P.s1.nb.x + (c.z % P.s1.ne.y) * P.s1.nb.y + (c.w % P.s1.ne.z) * P.s1.nb.z;
        let r = index1(ib, P.d.ne.y);
        st(P.off.x + at(vec4<u32>(c.x, r, c.z, c.w), P.d.nb), ld0(P.off.y + at(c, P.s0.nb)));
        return;
    }
    let c = coords(i, P.d.ne);
    let r = index1(P.off.z + c.y * P.s1.nb.x + c.z * P.s1.nb.y + c.w * P.s1.nb.z, P.s0.ne.y);
    let row = P.off.y + r * P.s0.nb.y + c.z * P.s0.nb.z + c.w * P.s0.nb.w;
    let db = P.off.x + at(c, P.d.nb);
#if QUANT
    st(db, dq(T0, row, c.x));
#else
    if OP == 1u {
        put_word(db >> 2u, src0[(row + c.x * 4u) >> 2u]);
    } else {
        st(db, ld0(row + c.x * P.s0.nb.x));
    }
#endif
#endif
}
