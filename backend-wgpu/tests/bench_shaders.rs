//! The shaders of the `read_peak` and `coop_peak` benches are valid WGSL for naga (no GPU
//! needed), so that the benches build shaders a GPU accepts.

#[path = "../benches/peak_shaders/mod.rs"]
mod peak_shaders;

use peak_shaders::{coop, read};

/// Every case's shader is valid WGSL for naga (no GPU needed).
#[test]
fn read_shaders_validate() {
    for &(_, wg, unroll, read_only) in read::CASES {
        let src = read::shader(wg, unroll, read_only);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }
}

/// Every case's shader is valid WGSL for naga with cooperative matrices and f16 (no GPU needed).
#[test]
fn coop_shaders_validate() {
    for (load, barrier, acc) in coop::CASES {
        let src = coop::shader(load, barrier, acc);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SHADER_FLOAT16;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }
}
