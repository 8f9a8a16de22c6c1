//! The cooperative-matrix shaders of the `coop_peak` bench.

/// Workgroups of the dispatch (several per SM on a large GPU) and steps of each subgroup.
pub const GROUPS: u32 = 1056;
pub const STEPS: u32 = 4096;

/// The cases: (load, barrier, acc) as [`shader`] takes them.
pub const CASES: [(bool, bool, u32); 5] = [
    (false, false, 4),
    (false, false, 8),
    (true, false, 4),
    (true, false, 8),
    (true, true, 8),
];

/// The shader of one case: `load` loads the fragments from workgroup memory every step (else
/// once, before the loop); `barrier` adds a workgroup barrier every two steps; `acc` is 4
/// (a 32 x 32 part per subgroup) or 8 (64 x 32) accumulators.
pub fn shader(load: bool, barrier: bool, acc: u32) -> String {
    let frag = |name: &str, t: &str, off: &str| {
        format!(
            "let {name} = coopLoad{t}<coop_mat16x16<f16, {}>>(&{}[{off}], 40u);",
            if t == "T" { "A" } else { "B" },
            if t == "T" { "ta" } else { "tb" }
        )
    };
    // The fragment loads of one step at k offset `k` (a WGSL expression).
    let loads = |k: &str| {
        let mut l = String::new();
        for (i, n) in ["a0", "a1", "a2", "a3"]
            .iter()
            .enumerate()
            .take((acc / 2) as usize)
        {
            l += &frag(n, "T", &format!("(sm + {}u) * 40u + {k}", 16 * i));
        }
        l += &frag("b0", "", &format!("sn * 40u + {k}"));
        l += &frag("b1", "", &format!("(sn + 16u) * 40u + {k}"));
        l
    };
    let mut decl = String::new();
    let mut mma = String::new();
    let mut store = String::new();
    for a in 0..acc / 2 {
        for b in 0..2 {
            decl += &format!("var c{a}{b}: coop_mat16x16<f32, C>;\n");
            mma += &format!("c{a}{b} = coopMultiplyAdd(a{a}, b{b}, c{a}{b});\n");
            store += &format!(
                "coopStore(c{a}{b}, &out[(wg.x * 8u + sg) * 2048u + {}u], 16u);\n",
                256 * (2 * a + b)
            );
        }
    }
    let (outer, inner) = if load {
        (String::new(), loads("k"))
    } else {
        (loads("0u"), String::new())
    };
    let sync = if barrier {
        "if (i & 1u) == 1u { workgroupBarrier(); }"
    } else {
        ""
    };
    format!(
        r#"enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> ta: array<f16, 5120>;
var<workgroup> tb: array<f16, 5120>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {{
    for (var i = li; i < 5120u; i += 256u) {{
        ta[i] = f16(f32(i % 13u) * 0.01);
        tb[i] = f16(f32(i % 7u) * 0.01);
    }}
    workgroupBarrier();
    let sg = li / 32u;
    let sm = (sg % 2u) * 64u;
    let sn = (sg / 2u) * 32u;
    {decl}
    {outer}
    for (var i = 0u; i < {STEPS}u; i++) {{
        let k = (i & 1u) * 16u;
        {inner}
        {mma}
        {sync}
    }}
    {store}
}}
"#
    )
}
