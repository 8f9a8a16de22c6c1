//! Automatic split ratios: each part's share follows its measured mat-vec throughput, limited
//! by its share of the free memory.

use std::sync::Arc;
use std::time::Instant;

use tessera_core::backend::Device;
use tessera_core::dtype::DType;
use tessera_core::error::Result;
use tessera_core::graph::Graph;

/// Rows and columns of the benchmark's f16 weight (8 MiB: large enough to stream from memory,
/// small enough to take milliseconds).
const BENCH_DIM: usize = 2048;
/// Timed runs after one warm-up.
const BENCH_RUNS: usize = 4;

/// Bytes of weights per second a device streams through a mat-vec (f16 weights, f32 vector).
pub fn measure_matvec(dev: &dyn Device) -> Result<f64> {
    let mut g = Graph::new();
    let w = g.new_tensor(DType::F16, &[BENCH_DIM, BENCH_DIM])?;
    let x = g.new_tensor(DType::F32, &[BENCH_DIM, 1])?;
    let y = g.mul_mat(w, x)?;
    let bt = dev.buffer_type();
    let align = bt.alignment().max(1);
    let up = |n: usize| n.div_ceil(align) * align;
    let w_bytes = g.get(w).nbytes();
    let x_off = up(w_bytes);
    let y_off = up(x_off + g.get(x).nbytes());
    let buf = bt.alloc(y_off + g.get(y).nbytes())?;
    buf.clear(0)?;
    g.bind(w, buf.clone(), 0)?;
    g.bind(x, buf.clone(), x_off)?;
    g.bind(y, buf, y_off)?;
    let mut b = dev.new_backend()?;
    b.compute(&g, &[y])?;
    b.synchronize()?;
    let t = Instant::now();
    for _ in 0..BENCH_RUNS {
        b.compute(&g, &[y])?;
    }
    b.synchronize()?;
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    Ok((w_bytes * BENCH_RUNS) as f64 / secs)
}

/// Shares proportional to `speed`, each at most its share of `free` memory, the excess moved to
/// parts with room (water filling). Without memory figures the speed shares stand.
pub fn water_fill(speed: &[f64], free: &[f64]) -> Vec<f64> {
    let n = speed.len();
    let total_free: f64 = free.iter().sum();
    let caps: Vec<f64> = if total_free > 0.0 {
        free.iter().map(|f| f / total_free).collect()
    } else {
        vec![1.0; n]
    };
    let mut share = vec![0.0; n];
    let mut fixed = vec![false; n];
    loop {
        let left = 1.0 - (0..n).filter(|&j| fixed[j]).map(|j| share[j]).sum::<f64>();
        let speed_left: f64 = (0..n)
            .filter(|&j| !fixed[j])
            .map(|j| speed[j].max(0.0))
            .sum();
        let open = (0..n).filter(|&j| !fixed[j]).count();
        let mut capped = false;
        for j in (0..n).filter(|&j| !fixed[j]) {
            share[j] = if speed_left > 0.0 {
                left * speed[j].max(0.0) / speed_left
            } else {
                left / open as f64
            };
        }
        for j in 0..n {
            if !fixed[j] && share[j] > caps[j] + 1e-12 {
                share[j] = caps[j];
                fixed[j] = true;
                capped = true;
            }
        }
        if !capped || fixed.iter().all(|&f| f) {
            return share;
        }
    }
}

/// Each part's measured mat-vec throughput in bytes per second (measured once per distinct
/// device: two parts with one name and description share a figure). A part that is itself a
/// meta device (a tensor-parallel group) counts as the sum of its parts: each streams its
/// slice of the weights at its own speed.
pub fn measure_speeds(parts: &[Arc<dyn Device>]) -> Result<Vec<f64>> {
    let mut seen: Vec<(String, f64)> = Vec::new();
    let mut speed = Vec::with_capacity(parts.len());
    for p in parts {
        let key = format!("{}|{}", p.name(), p.description());
        let s = match seen.iter().find(|(k, _)| *k == key) {
            Some((_, s)) => *s,
            None => {
                let s = match crate::MetaDevice::from_device(p.as_ref()) {
                    Some(group) => group.speeds()?.iter().sum(),
                    None => measure_matvec(p.as_ref())?,
                };
                log::debug!(
                    "auto split: {} streams {:.1} GB/s in a mat-vec",
                    p.name(),
                    s / 1e9
                );
                seen.push((key, s));
                s
            }
        };
        speed.push(s);
    }
    Ok(speed)
}

/// Split ratios for `parts` from their measured `speed` ([`measure_speeds`]) and their free
/// memory.
pub fn auto_ratios(parts: &[Arc<dyn Device>], speed: &[f64]) -> Vec<f64> {
    if parts.len() <= 1 {
        return vec![1.0; parts.len()];
    }
    let free: Vec<f64> = parts.iter().map(|p| p.memory().free as f64).collect();
    water_fill(speed, &free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_filling_caps_by_memory() {
        let s = water_fill(&[3.0, 1.0], &[0.0, 0.0]);
        assert!((s[0] - 0.75).abs() < 1e-9 && (s[1] - 0.25).abs() < 1e-9);
        // The fast part has only 40% of the memory: it takes 40%, the rest goes to the other.
        let s = water_fill(&[9.0, 1.0], &[4.0, 6.0]);
        assert!(
            (s[0] - 0.4).abs() < 1e-9 && (s[1] - 0.6).abs() < 1e-9,
            "{s:?}"
        );
        let s = water_fill(&[1.0, 1.0], &[8.0, 8.0]);
        assert!((s[0] - 0.5).abs() < 1e-9);
    }
}
