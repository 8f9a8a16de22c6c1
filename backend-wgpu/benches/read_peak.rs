//! The read bandwidth one dispatch gets through this path, apart from any op: dispatches that
//! only read a buffer the size of the mat-vec benchmark's largest Q4_0 weights (m=4096,
//! k=14336: 33.0 MB) with 16-byte loads and fold it into one word, 8 buffers rotated in a pass
//! as `mat_vec`'s `bench_model_sizes` rotates its weights (a barrier between dispatches, which
//! write one buffer), over several workgroup counts and sizes, loads in flight per invocation,
//! and with the buffer bound read-write (as tessera binds every buffer) or read-only. It is the
//! ceiling a mat-vec of that size can reach here: `cargo bench -p tessera-wgpu --bench read_peak`
//! (harness-less: `main` runs it; arguments are ignored).

#[path = "peak_shaders/mod.rs"]
mod peak_shaders;
#[path = "raw/mod.rs"]
mod raw;

use peak_shaders::read::{shader, CASES};

/// Bytes of each buffer: the Q4_0 weights of a 4096 x 14336 mat-vec.
const BYTES: u64 = 4096 * 14336 / 32 * 18;
/// Buffers rotated through in a pass (264 MB: well past the H200's 50 MB L2).
const ROTATED: usize = 8;
/// Passes timed per case (the median is taken).
const PASSES: usize = 25;

fn main() {
    let Some((device, queue)) = raw::open(wgpu::Features::TIMESTAMP_QUERY) else {
        return;
    };
    let bufs: Vec<wgpu::Buffer> = (0..ROTATED)
        .map(|i| {
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: BYTES,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let words: Vec<u32> = (0..BYTES / 4)
                .map(|w| (w as u32).wrapping_mul(2654435761) ^ i as u32)
                .collect();
            queue.write_buffer(&b, 0, bytemuck::cast_slice(&words));
            b
        })
        .collect();
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4 * 1024 * 4224,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for &(groups, wg, unroll, read_only) in CASES {
        let secs = time(
            &device,
            &queue,
            &shader(wg, unroll, read_only),
            &bufs,
            &out,
            groups,
        );
        println!(
            "read {groups} x {wg}, {unroll} loads in flight, {}: {:.2} us, {:.0} GB/s",
            if read_only { "read-only" } else { "read-write" },
            secs * 1e6,
            BYTES as f64 / secs / 1e9
        );
    }
}

/// The median GPU seconds per dispatch (timestamp queries at the beginning and end of each
/// pass, over its [`ROTATED`] dispatches) of [`PASSES`] passes, each one dispatch of
/// `source`'s `main` over `groups` workgroups per buffer in `bufs` (binding 0; `out` binding 1).
fn time(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    bufs: &[wgpu::Buffer],
    out: &wgpu::Buffer,
    groups: u32,
) -> f64 {
    let pipeline = raw::pipeline(device, source);
    let binds: Vec<wgpu::BindGroup> = bufs
        .iter()
        .map(|b| {
            device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: b.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: out.as_entire_binding(),
                    },
                ],
            })
        })
        .collect();
    let n = PASSES as u32;
    let set = device.create_query_set(&wgpu::QuerySetDescriptor {
        label: None,
        ty: wgpu::QueryType::Timestamp,
        count: 2 * n,
    });
    let buffer = |usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: u64::from(2 * n) * 8,
            usage,
            mapped_at_creation: false,
        })
    };
    let resolve = buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
    let read = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
    let mut enc = device.create_command_encoder(&Default::default());
    for i in 0..n {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &set,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            }),
        });
        pass.set_pipeline(&pipeline);
        for bind in &binds {
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        }
    }
    enc.resolve_query_set(&set, 0..2 * n, &resolve, 0);
    enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, u64::from(2 * n) * 8);
    queue.submit([enc.finish()]);
    read.slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(
        &read
            .slice(..)
            .get_mapped_range()
            .expect("mapped timestamps")[..],
    );
    let period = f64::from(queue.get_timestamp_period()) * 1e-9;
    let mut times: Vec<f64> = ticks
        .chunks_exact(2)
        .map(|p| p[1].saturating_sub(p[0]) as f64 * period / bufs.len() as f64)
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
