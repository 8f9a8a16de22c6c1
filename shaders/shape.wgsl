// concat, repeat, pad, diag_mask_inf and arange (op family "shape").
//
// One invocation per element of dst. Defines: OP 0 concat (u.y: the axis), 1 repeat,
// 2 pad, 3 diag_mask_inf (u.y: n_past), 4 arange (f.x: start, f.y: step).
// RAW: the type is i32 and values are moved as words. Params: u.x: element count.

const OP: u32 = {{OP}}u;

// Moves the element at byte b of src0 (which = 0) or src1 to byte db of dst.
fn move_to(db: u32, which: u32, b: u32) {
#if RAW
    if which == 1u {
        put_word(db >> 2u, src1[b >> 2u]);
    } else {
        put_word(db >> 2u, src0[b >> 2u]);
    }
#else
    if which == 1u {
        st(db, ld1(b));
    } else {
        st(db, ld0(b));
    }
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = linear(wg, nwg, li);
    if i >= P.u.x {
        return;
    }
    let c = coords(i, P.d.ne);
    let db = P.off.x + at(c, P.d.nb);
    switch OP {
        case 0u: {
            let ax = P.u.y;
            if c[ax] < P.s0.ne[ax] {
                move_to(db, 0u, P.off.y + at(c, P.s0.nb));
            } else {
                var c1 = c;
                c1[ax] -= P.s0.ne[ax];
                move_to(db, 1u, P.off.z + at(c1, P.s1.nb));
            }
        }
        case 1u: {
            move_to(db, 0u, P.off.y + at(c % P.s0.ne, P.s0.nb));
        }
        case 2u: {
            if all(c < P.s0.ne) {
                st(db, ld0(P.off.y + at(c, P.s0.nb)));
            } else {
                st(db, 0.0);
            }
        }
        case 3u: {
            if c.x > P.u.y + c.y {
                st(db, bitcast<f32>(0xff800000u));
            } else {
                st(db, ld0(P.off.y + at(c, P.s0.nb)));
            }
        }
        default: {
            st(db, P.f.x + f32(i) * P.f.y);
        }
    }
}
