//! The cooperative-matrix throughput this adapter gives through naga's WGSL front end, apart
//! from any mat-mat: loops of 16 x 16 x 16 f16 products summed in f32, with the fragments held
//! in registers, loaded from workgroup memory every step (as the tiled mat-mat's inner loop),
//! and with a workgroup barrier every two steps. It says how far the mat-mat's loading and
//! staging keep it from what the tensor cores give through this path:
//! `cargo bench -p tessera-wgpu --bench coop_peak` (harness-less: `main` runs it; arguments
//! are ignored).

#[path = "peak_shaders/mod.rs"]
mod peak_shaders;
#[path = "raw/mod.rs"]
mod raw;

use std::time::Instant;

use peak_shaders::coop::{shader, CASES, GROUPS, STEPS};

fn main() {
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
