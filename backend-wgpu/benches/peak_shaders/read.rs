//! The read-bandwidth shaders of the `read_peak` bench.

/// The cases: (workgroups, invocations per workgroup, 16-byte loads in flight per invocation,
/// bound read-only).
pub const CASES: &[(u32, u32, u32, bool)] = &[
    (128, 1024, 1, false),
    (128, 1024, 2, false),
    (132, 1024, 1, false),
    (132, 1024, 2, false),
    (132, 1024, 4, false),
    (264, 1024, 1, false),
    (264, 1024, 2, false),
    (528, 512, 1, false),
    (1056, 256, 1, false),
    (1056, 256, 2, false),
    (2112, 256, 1, false),
    (4224, 128, 1, false),
    (1056, 256, 2, true),
    (132, 1024, 2, true),
];

/// The shader of one case: each invocation reads the 16-byte words i, i + T, ... (T: all
/// invocations of the dispatch), `unroll` at a time, folds them with xor and stores the result
/// only where it equals a value no input here gives (so that no load can be dropped).
pub fn shader(wg: u32, unroll: u32, read_only: bool) -> String {
    let access = if read_only { "read" } else { "read_write" };
    let mut loads = String::new();
    let mut fold = String::new();
    for u in 0..unroll {
        loads += &format!("let v{u} = src[i + {u}u * t];\n");
        fold += &format!("acc ^= v{u};\n");
    }
    format!(
        r#"@group(0) @binding(0) var<storage, {access}> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {{
    let t = n.x * {wg}u;
    let len = arrayLength(&src);
    var acc = vec4<u32>(0u);
    var i = g.x;
    for (; i + {last}u * t < len; i += {unroll}u * t) {{
        {loads}
        {fold}
    }}
    for (; i < len; i += t) {{
        acc ^= src[i];
    }}
    if (acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u {{
        out[g.x] = 1u;
    }}
}}
"#,
        last = unroll - 1
    )
}
