//! The cooperative-matrix throughput this adapter gives through naga's WGSL front end, apart
//! from any mat-mat: loops of 16 x 16 x 16 f16 products summed in f32, with the fragments held
//! in registers, loaded from workgroup memory every step (as the tiled mat-mat's inner loop),
//! and with a workgroup barrier every two steps. It says how far the mat-mat's loading and
//! staging keep it from what the tensor cores give through this path:
//! `cargo test --release -p tessera-wgpu --test coop_peak -- --ignored --nocapture`.

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
    let mut loads = String::new();
    for (i, n) in ["a0", "a1", "a2", "a3"]
        .iter()
        .enumerate()
        .take((acc / 2) as usize)
    {
        loads += &frag(n, "T", &format!("(sm + {}u) * 40u + k", 16 * i));
    }
    loads += &frag("b0", "", "sn * 40u + k");
    loads += &frag("b1", "", "(sn + 16u) * 40u + k");
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
        (String::new(), loads)
    } else {
        (loads.replace("k]", "0u]"), String::new())
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

/// A plain f16 x f16 GEMM on cooperative matrices (c[n][m] = sum over k of a[m][k] b[n][k], f32
/// sums), m, n multiples of 128 and k of 32: 128 x 128 tiles of 8 subgroups (64 x 32 each),
/// k-steps of 32 staged in double-buffered padded workgroup tiles, each invocation loading two
/// 16-byte chunks of each operand a step (the next step's while this one is multiplied).
/// `stage` 0: chunks stored as 8 f16 each; 1: the same, but the loads go to registers only
/// (tiles keep their first contents: the cost of staging without the global loads' wait).
fn gemm_shader(m: u32, n: u32, k: u32, stage: u32, bf32: bool, opts: &str) -> String {
    let bf32 = u32::from(bf32);
    let quad = u32::from(opts.contains("quad"));
    let s = format!(
        r#"enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bf: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> aq: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const M: u32 = {m}u;
const N: u32 = {n}u;
const K: u32 = {k}u;
const STAGE: u32 = {stage}u;
const BF32: u32 = {bf32}u;
const QUAD: u32 = {quad}u;
var<workgroup> ta: array<f16, 10240>;
var<workgroup> tb: array<f16, 10240>;
fn put(t: u32, o: u32, v: vec4<u32>) {{
    let h0 = vec2<f16>(unpack2x16float(v.x));
    let h1 = vec2<f16>(unpack2x16float(v.y));
    let h2 = vec2<f16>(unpack2x16float(v.z));
    let h3 = vec2<f16>(unpack2x16float(v.w));
    if t == 0u {{
        ta[o] = h0.x; ta[o + 1u] = h0.y; ta[o + 2u] = h1.x; ta[o + 3u] = h1.y;
        ta[o + 4u] = h2.x; ta[o + 5u] = h2.y; ta[o + 6u] = h3.x; ta[o + 7u] = h3.y;
    }} else {{
        tb[o] = h0.x; tb[o + 1u] = h0.y; tb[o + 2u] = h1.x; tb[o + 3u] = h1.y;
        tb[o + 4u] = h2.x; tb[o + 5u] = h2.y; tb[o + 6u] = h3.x; tb[o + 7u] = h3.y;
    }}
}}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {{
    let m0 = wg.x * 128u;
    let n0 = wg.y * 128u;
    let row = li / 4u;
    let ch = li % 4u;
    let ga = ((m0 + row) * K + ch * 8u) / 8u;
    let gb = ((n0 + row) * K + ch * 8u) / 8u;
    let so = row * 40u + ch * 8u;
    var pa0 = vec4<u32>();
    var pa1 = vec4<u32>();
    // quads of src0: rows li / 8 + 32 p, 4 values at 4 (li % 8).
    let gq = ((m0 + li / 8u) * K + (li % 8u) * 4u) / 4u;
    var pq: array<vec2<u32>, 4>;
    if QUAD == 1u {{
        for (var p = 0u; p < 4u; p++) {{ pq[p] = aq[gq + 8u * K * p]; }}
    }} else {{
        pa0 = a[ga];
        pa1 = a[ga + 8u * K];
    }}
    var pb0 = vec4<u32>();
    var pb1 = vec4<u32>();
    // f32 columns: rows li / 8 + 32 p, 4 values at 4 (li % 8).
    let gf = ((n0 + li / 8u) * K + (li % 8u) * 4u) / 4u;
    let sf = (li / 8u) * 40u + (li % 8u) * 4u;
    var pf: array<vec4<f32>, 4>;
    if BF32 == 1u {{
        for (var p = 0u; p < 4u; p++) {{ pf[p] = bf[gf + 8u * K * p]; }}
    }} else {{
        pb0 = b[gb];
        pb1 = b[gb + 8u * K];
    }}
    let sg = li / 32u;
    let sm = (sg % 2u) * 64u;
    let sn = (sg / 2u) * 32u;
    var c00: coop_mat16x16<f32, C>;
    var c01: coop_mat16x16<f32, C>;
    var c10: coop_mat16x16<f32, C>;
    var c11: coop_mat16x16<f32, C>;
    var c20: coop_mat16x16<f32, C>;
    var c21: coop_mat16x16<f32, C>;
    var c30: coop_mat16x16<f32, C>;
    var c31: coop_mat16x16<f32, C>;
    var acc = vec4<u32>();
    for (var k0 = 0u; k0 < K; k0 += 32u) {{
        let o = ((k0 / 32u) % 2u) * 5120u;
        if STAGE == 0u || k0 < 64u {{
            if QUAD == 1u {{
                for (var p = 0u; p < 4u; p++) {{
                    let h = vec4<f16>(vec4<f32>(unpack2x16float(pq[p].x), unpack2x16float(pq[p].y)));
                    let t = o + sf + 1280u * p;
                    ta[t] = h.x; ta[t + 1u] = h.y; ta[t + 2u] = h.z; ta[t + 3u] = h.w;
                }}
            }} else {{
                put(0u, o + so, pa0);
                put(0u, o + so + 2560u, pa1);
            }}
            if BF32 == 1u {{
                for (var p = 0u; p < 4u; p++) {{
                    let h = vec4<f16>(pf[p]);
                    let t = o + sf + 1280u * p;
                    tb[t] = h.x; tb[t + 1u] = h.y; tb[t + 2u] = h.z; tb[t + 3u] = h.w;
                }}
            }} else {{
                put(1u, o + so, pb0);
                put(1u, o + so + 2560u, pb1);
            }}
        }} else {{
            acc ^= pa0 ^ pa1 ^ pb0 ^ pb1 ^ bitcast<vec4<u32>>(pf[0]) ^ pq[0].xyxy;
        }}
        workgroupBarrier();
        if k0 + 32u < K {{
            let q = (k0 + 32u) / 8u;
            if QUAD == 1u {{
                for (var p = 0u; p < 4u; p++) {{ pq[p] = aq[gq + 8u * K * p + 2u * q]; }}
            }} else {{
                pa0 = a[ga + q];
                pa1 = a[ga + 8u * K + q];
            }}
            if BF32 == 1u {{
                for (var p = 0u; p < 4u; p++) {{ pf[p] = bf[gf + 8u * K * p + 2u * q]; }}
            }} else {{
                pb0 = b[gb + q];
                pb1 = b[gb + 8u * K + q];
            }}
        }}
        for (var kk = 0u; kk < 32u; kk += 16u) {{
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&ta[o + sm * 40u + kk], 40u);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&ta[o + (sm + 16u) * 40u + kk], 40u);
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&ta[o + (sm + 32u) * 40u + kk], 40u);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&ta[o + (sm + 48u) * 40u + kk], 40u);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&tb[o + sn * 40u + kk], 40u);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&tb[o + (sn + 16u) * 40u + kk], 40u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
        }}
    }}
    let base = (n0 + sn) * M + m0 + sm;
    coopStore(c00, &c[base], M);
    coopStore(c01, &c[base + 16u * M], M);
    coopStore(c10, &c[base + 16u], M);
    coopStore(c11, &c[base + 16u * M + 16u], M);
    coopStore(c20, &c[base + 32u], M);
    coopStore(c21, &c[base + 16u * M + 32u], M);
    coopStore(c30, &c[base + 48u], M);
    coopStore(c31, &c[base + 16u * M + 48u], M);
    if all(acc == vec4<u32>(1u, 2u, 3u, 4u)) {{
        c[0] = 0.0;
    }}
}}
"#
    );
    let mut s = s;
    if opts.contains("rw") {
        s = s.replace("var<storage, read> ", "var<storage, read_write> ");
    }
    if opts.contains("uk") {
        s = s.replace(
            &format!("const K: u32 = {k}u;"),
            "@group(0) @binding(4) var<uniform> U: vec4<u32>;",
        );
        s = s.replace(
            "    let m0 = wg.x * 128u;",
            "    let K = U.x;\n    let m0 = wg.x * 128u;",
        );
    }
    s
}

#[test]
#[ignore]
fn bench_coop_peak() {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc.with_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    let Some(adapter) = adapters.into_iter().find(|a| {
        a.features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
    }) else {
        println!("skipped: no adapter with cooperative matrices and f16");
        return;
    };
    println!("adapter: {}", adapter.get_info().name);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: None,
        required_features: wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16,
        required_limits: adapter.limits(),
        // SAFETY: a benchmark of the experimental feature itself, on shaders naga validates.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .expect("device");
    let out = buffer(&device, u64::from(GROUPS) * 8 * 2048 * 4, None);
    for (load, barrier, acc) in CASES {
        let secs = time(
            &device,
            &queue,
            &shader(load, barrier, acc),
            &[&out],
            (GROUPS, 1),
        );
        let flops = f64::from(GROUPS) * 8.0 * f64::from(acc) * f64::from(STEPS) * 8192.0;
        println!(
            "coop load={load} barrier={barrier} acc={acc}: {:.3} ms, {:.1} TFLOP/s",
            secs * 1e3,
            flops / secs / 1e12
        );
    }
    for (m, n, k) in [
        (4096u32, 4096u32, 4096u32),
        (8192, 8192, 8192),
        (4096, 512, 14336),
        (14336, 512, 4096),
    ] {
        let av: Vec<half::f16> = (0..m * k)
            .map(|i| {
                half::f16::from_f32(((i.wrapping_mul(2654435761) >> 20) % 200) as f32 / 100.0 - 1.0)
            })
            .collect();
        let bv: Vec<f32> = (0..n * k)
            .map(|i| ((i.wrapping_mul(40503) >> 7) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let bh: Vec<half::f16> = bv.iter().map(|&v| half::f16::from_f32(v)).collect();
        let a = buffer(&device, 0, Some(bytemuck::cast_slice(&av)));
        let b = buffer(&device, 0, Some(bytemuck::cast_slice(&bh)));
        let bf = buffer(&device, 0, Some(bytemuck::cast_slice(&bv)));
        let c = buffer(&device, u64::from(m) * u64::from(n) * 4, None);
        let u = buffer(&device, 0, Some(bytemuck::cast_slice(&[k, 0, 0, 0])));
        for (stage, bf32, opts) in [
            (0, true, ""),
            (0, true, "rw"),
            (0, true, "uk"),
            (0, true, "quad"),
            (0, true, "rw uk quad"),
        ] {
            let mut binds = vec![&a, &b, &c, &bf];
            if opts.contains("uk") {
                binds.push(&u);
            }
            let secs = time(
                &device,
                &queue,
                &gemm_shader(m, n, k, stage, bf32, opts),
                &binds,
                (m / 128, n / 128),
            );
            let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
            println!(
                "coop gemm f16 x {} m={m} n={n} k={k} {opts}: {:.3} ms, {:.1} TFLOP/s",
                if bf32 { "f32" } else { "f16" },
                secs * 1e3,
                flops / secs / 1e12
            );
            if stage == 0 {
                let got: Vec<f32> = read(&device, &queue, &c, u64::from(m) * u64::from(n) * 4);
                let mut worst = 0f64;
                for (i, j) in [
                    (0u32, 0u32),
                    (1, 2),
                    (127, 128),
                    (m - 1, n - 1),
                    (m / 3, n / 7),
                    (77, n - 5),
                ] {
                    let want: f64 = (0..k)
                        .map(|x| {
                            f64::from(av[(i * k + x) as usize].to_f32())
                                * f64::from(bh[(j * k + x) as usize].to_f32())
                        })
                        .sum();
                    let g = f64::from(got[(j * m + i) as usize]);
                    worst = worst.max((g - want).abs() / (1.0 + want.abs()));
                }
                println!("  worst relative error at 6 points {worst:.2e}");
                assert!(worst < 1e-3, "the GEMM computes something else");
            }
        }
    }
}

/// A storage buffer of `size` bytes, or holding `data`.
fn buffer(device: &wgpu::Device, size: u64, data: Option<&[u8]>) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC;
    match data {
        Some(d) => device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: d,
            usage,
        }),
        None => device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: false,
        }),
    }
}

/// The contents of `buf`'s first `size` bytes as f32s.
fn read(device: &wgpu::Device, queue: &wgpu::Queue, buf: &wgpu::Buffer, size: u64) -> Vec<f32> {
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, 0, &staging, 0, size);
    queue.submit([enc.finish()]);
    staging
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let view = staging.slice(..).get_mapped_range().expect("mapped");
    let v = bytemuck::cast_slice(&view).to_vec();
    v
}

/// The median seconds of 6 runs of `source`'s `main` over `groups` workgroups, bound to
/// `buffers` in order (each run submitted and waited for).
fn time(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    buffers: &[&wgpu::Buffer],
    groups: (u32, u32),
) -> f64 {
    // SAFETY: the benchmark's shaders index only within their arrays (checked by reading them).
    let module = unsafe {
        device.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(source.into()),
            },
            wgpu::ShaderRuntimeChecks::unchecked(),
        )
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .chain((buffers.len() > 1).then_some(&buffers[0]))
        .enumerate()
        .map(|(i, b)| (if i == buffers.len() { 5 } else { i }, b))
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let mut times = Vec::new();
    for _ in 0..6 {
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, 1);
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
    let sources = CASES.iter().map(|&(l, b, a)| shader(l, b, a)).chain([
        gemm_shader(256, 256, 64, 0, false, ""),
        gemm_shader(256, 256, 64, 1, true, "rw uk quad"),
    ]);
    for src in sources {
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }
}
