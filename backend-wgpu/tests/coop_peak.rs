//! The cooperative-matrix throughput this adapter gives through naga's WGSL front end, apart
//! from any mat-mat: loops of 16 x 16 x 16 f16 products summed in f32, with the fragments held
//! in registers, loaded from workgroup memory every step (as the tiled mat-mat's inner loop),
//! and with a workgroup barrier every two steps. It says how far the mat-mat's loading and
//! staging keep it from what the tensor cores give through this path:
//! `cargo test --release -p tessera-wgpu --test coop_peak -- --ignored --nocapture`.

mod raw;

use std::time::Instant;

/// Workgroups of the dispatch (several per SM on a large GPU) and steps of each subgroup.
const GROUPS: u32 = 1056;
const STEPS: u32 = 4096;

/// The cases: (load, barrier, acc) as [`shader`] takes them.
const CASES: [(bool, bool, u32); 5] = [
    (false, false, 4),
    (false, false, 8),
    (true, false, 4),
    (true, false, 8),
    (true, true, 8),
];

/// The shader of one case: `load` loads the fragments from workgroup memory every step (else
/// once, before the loop); `barrier` adds a workgroup barrier every two steps; `acc` is 4
/// (a 32 x 32 part per subgroup) or 8 (64 x 32) accumulators.
fn shader(load: bool, barrier: bool, acc: u32) -> String {
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

#[test]
#[ignore]
fn bench_coop_peak() {
    let Some((device, queue)) =
        raw::open(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
    else {
        return;
    };
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: u64::from(GROUPS) * 8 * 2048 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for (load, barrier, acc) in CASES {
        let secs = time(&device, &queue, &shader(load, barrier, acc), &out, GROUPS);
        let flops = f64::from(GROUPS) * 8.0 * f64::from(acc) * f64::from(STEPS) * 8192.0;
        println!(
            "coop load={load} barrier={barrier} acc={acc}: {:.3} ms, {:.1} TFLOP/s",
            secs * 1e3,
            flops / secs / 1e12
        );
    }
}

/// The median seconds of 6 runs of `source`'s `main` over `groups` workgroups with `out` bound
/// to binding 0 (each run submitted and waited for).
fn time(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    out: &wgpu::Buffer,
    groups: u32,
) -> f64 {
    let pipeline = raw::pipeline(device, source);
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: out.as_entire_binding(),
        }],
    });
    let mut times = Vec::new();
    for _ in 0..6 {
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        }
        let t = Instant::now();
        queue.submit([enc.finish()]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[2]
}

/// Every case's shader is valid WGSL for naga with cooperative matrices and f16 (no GPU needed).
#[test]
fn coop_shaders_validate() {
    for (load, barrier, acc) in CASES {
        let src = shader(load, barrier, acc);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SHADER_FLOAT16;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }
}
