//! The peer-memory all-reduce group: per rank a signal block and two receive areas (each two
//! slots of one region per rank) that every rank's GPU writes into (peer access enabled between
//! every pair of GPUs), and the one-shot kernels of `kernels/allreduce.cu` that sum through
//! them: `all_reduce_small_f32` (no flags: the small area starts empty and is polled value by
//! value) for tensors up to 256 KiB, and `all_reduce_f32` (flags between the ranks) for larger
//! ones, in up to 256 blocks (more blocks keep more link writes in flight), sending f32 values,
//! or f16 ones with [`crate::CudaOptions::peer_f16`].
//!
//! The kernel needs no host step between the ranks, so it runs inside each rank's CUDA graph
//! ([`tessera_core::Op::AllReduce`] nodes, encoded by `ops::comm`) as well as on its own
//! ([`PeerGroup::launch`]).

use std::sync::Arc;

use cudarc::driver::sys;
use tessera_core::{Error, Result};

use crate::cmd::{Cmd, KParams, TArg};
use crate::driver::DeviceShared;
use crate::kernels::Build;

/// Most ranks of a group (`AR_MAX_RANKS` in kernels/peer.cuh).
pub(crate) const MAX_RANKS: usize = 8;
/// Most blocks of one launch (`AR_MAX_BLOCKS`): the kernel with flags takes up to that many,
/// since more blocks keep more link writes in flight for large tensors (a prompt's).
const MAX_BLOCKS: usize = 256;
/// Threads per block.
const THREADS: u32 = 512;
/// Elements a block handles at least before another block is added.
const PER_BLOCK: usize = 16 * 1024;
/// Values per chunk of the small-tensor kernels (`AR_SMALL_CHUNK`): each chunk has its own call
/// count, and all_reduce_small_f32 one block per chunk (its blocks wait on NVLink latency, not
/// bandwidth).
const SMALL_CHUNK: usize = 2048;
/// Float4s each thread of all_reduce_small_norm_f32 holds (`AR_NORM_VEC`).
const NORM_VEC: usize = 2;
/// Bytes of one region of the small receive area: the largest tensor the small kernel sums.
const SMALL_REGION: usize = 256 << 10;
/// The bit pattern of an empty value in the small area (`AR_EMPTY`, -0.0).
const EMPTY: u32 = 0x8000_0000;

/// Bytes of `struct ArSignal`: three pointer tables, the flags, the small kernel's call count
/// per block, the epoch and a counter.
const SIGNAL_BYTES: usize = 3 * MAX_RANKS * 8 + MAX_BLOCKS * MAX_RANKS * 4 + MAX_BLOCKS * 4 + 8;

// The signal block is cleared as 32-bit words; the small area's chunks each have a call count.
const _: () =
    assert!(SIGNAL_BYTES.is_multiple_of(4) && SMALL_REGION / 4 / SMALL_CHUNK <= MAX_BLOCKS);

/// One rank's memory.
struct Rank {
    dev: Arc<DeviceShared>,
    signal: u64,
    scratch: u64,
    small: u64,
}

/// The memory and peer access of one group of ranks.
pub(crate) struct PeerGroup {
    ranks: Vec<Rank>,
    /// Bytes of one region of a receive slot: the largest tensor one call can sum.
    slot_bytes: usize,
    /// Whether the kernel with flags sends f16 values (else f32).
    f16: bool,
    /// The kernels launched (the all-reduce file is the same in every build).
    build: Build,
}

/// Whether every pair of distinct GPUs among `devs` can reach each other's memory.
pub(crate) fn all_peers(devs: &[Arc<DeviceShared>]) -> Result<bool> {
    for a in devs {
        for b in devs.iter().filter(|b| b.ordinal != a.ordinal) {
            let mut ok = 0;
            // SAFETY: both device handles are valid; ok is a valid out-pointer.
            unsafe { sys::cuDeviceCanAccessPeer(&mut ok, a.ctx.cu_device(), b.ctx.cu_device()) }
                .result()
                .map_err(|e| a.err("asking for peer access", e))?;
            if ok == 0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

impl PeerGroup {
    /// A group over `devs` (in rank order; a GPU may appear more than once) whose calls sum
    /// up to `slot_bytes` bytes, sending f16 values past the small kernel where `f16`, with the
    /// kernels of `build`. The caller checked [`all_peers`].
    pub(crate) fn new(
        devs: &[Arc<DeviceShared>],
        slot_bytes: usize,
        f16: bool,
        build: Build,
    ) -> Result<PeerGroup> {
        if devs.len() > MAX_RANKS {
            return Err(Error::Invalid(format!(
                "a peer all-reduce group has at most {MAX_RANKS} ranks, not {}",
                devs.len()
            )));
        }
        for a in devs {
            a.bind()?;
            for b in devs.iter().filter(|b| b.ordinal != a.ordinal) {
                // SAFETY: b's context is valid; a's context is current.
                let r = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
                if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    continue;
                }
                r.result()
                    .map_err(|e| a.err(&format!("enabling peer access to {}", b.name), e))?;
            }
        }
        let mut group = PeerGroup {
            ranks: Vec::with_capacity(devs.len()),
            slot_bytes,
            f16,
            build,
        };
        for dev in devs {
            // Pushed before the next allocation, so that Drop frees what was made.
            group.ranks.push(Rank {
                dev: dev.clone(),
                signal: 0,
                scratch: 0,
                small: 0,
            });
            if let Some(r) = group.ranks.last_mut() {
                r.signal = alloc(dev, SIGNAL_BYTES, 0)?;
                r.scratch = alloc(dev, 2 * devs.len() * slot_bytes, 0)?;
                r.small = alloc(dev, 2 * devs.len() * SMALL_REGION, EMPTY)?;
            }
        }
        // Every rank's table: the scratch, signal and small-area addresses of all ranks; flags
        // and epochs start at zero.
        let mut table = vec![0u8; SIGNAL_BYTES];
        for (k, r) in group.ranks.iter().enumerate() {
            for (t, addr) in [r.scratch, r.signal, r.small].into_iter().enumerate() {
                let s = (t * MAX_RANKS + k) * 8;
                table[s..s + 8].copy_from_slice(&addr.to_le_bytes());
            }
        }
        for r in &group.ranks {
            r.dev.bind()?;
            // SAFETY: `signal` is SIGNAL_BYTES of device memory of this context.
            unsafe { sys::cuMemcpyHtoD_v2(r.signal, table.as_ptr().cast(), SIGNAL_BYTES) }
                .result()
                .map_err(|e| r.dev.err("writing the all-reduce table", e))?;
        }
        Ok(group)
    }

    /// Number of ranks.
    pub(crate) fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Whether the kernel with flags sends f16 values.
    pub(crate) fn f16(&self) -> bool {
        self.f16
    }

    /// The most f32 elements one call sums.
    pub(crate) fn max_elements(&self) -> usize {
        self.slot_bytes / 4
    }

    /// The kernel launch, for rank `rank`'s stream, that sums `count` f32 values at `input`
    /// over the group into `output` (the same address for an in-place sum), adding the values
    /// at `residual` where it is not 0; every address is memory of that rank's GPU. `sent`:
    /// the kernel that wrote `input` has sent it to the other ranks ([`PeerGroup::presend`]),
    /// so this one only receives.
    pub(crate) fn command(
        &self,
        rank: usize,
        output: u64,
        input: u64,
        residual: u64,
        count: usize,
        sent: bool,
    ) -> Result<Cmd> {
        if count > self.max_elements() {
            return Err(Error::Invalid(format!(
                "a peer all-reduce of {count} elements is larger than its {} scratch elements",
                self.max_elements()
            )));
        }
        let small = count * 4 <= SMALL_REGION;
        if sent && !small {
            return Err(Error::Invalid(format!(
                "a peer all-reduce of {count} elements was sent ahead, which only the small kernel takes"
            )));
        }
        let (kernel, region, blocks) = if small {
            (
                "all_reduce_small_f32",
                SMALL_REGION,
                count.div_ceil(SMALL_CHUNK),
            )
        } else {
            (
                if self.f16 {
                    "all_reduce_f32_h"
                } else {
                    "all_reduce_f32"
                },
                self.slot_bytes,
                count.div_ceil(PER_BLOCK),
            )
        };
        let mut p = self.params(rank, [output, input, residual], count, region)?;
        p.i[4] = i32::from(sent);
        let blocks = blocks.clamp(1, MAX_BLOCKS) as u32;
        self.launch(rank, kernel, blocks, THREADS, p)
    }

    /// The kernel launch, for rank `rank`'s stream, that sums one row of `count` f32 values at
    /// `input` over the group, adds `residual` (0: none) into `output`, and writes
    /// rms_norm(output) * weight into `tail.out` (and its q8_1 blocks where asked): the
    /// all-reduce and the next block's norm in one kernel. `None` where the row does not suit
    /// it (too long for one block, or for the small-tensor kernel, or not whole float4s).
    /// `sent` as for [`PeerGroup::command`].
    pub(crate) fn norm_command(
        &self,
        rank: usize,
        [output, input, residual]: [u64; 3],
        count: usize,
        tail: &NormTail,
        sent: bool,
    ) -> Result<Option<Cmd>> {
        let addrs = [output, input, residual, tail.weight, tail.out];
        let Some(threads) = norm_threads(count, &addrs) else {
            return Ok(None);
        };
        let mut p = self.params(rank, [output, input, residual], count, SMALL_REGION)?;
        p.t[3] = flat(tail.weight, count);
        p.t[4] = flat(tail.out, count);
        if let Some((qs, ds)) = tail.q8 {
            p.aux[2] = qs;
            p.aux[3] = ds;
        }
        p.f[0] = tail.eps;
        p.i[4] = i32::from(sent);
        self.launch(rank, "all_reduce_small_norm_f32", 1, threads, p)
            .map(Some)
    }

    /// Where a kernel that writes a tensor of `count` f32 values, which rank `rank` sums next
    /// with the small-tensor kernel, sends each value to the other ranks itself
    /// (`presend_value` in kernels/peer.cuh): this rank's signal block and the small area's
    /// region bytes. `None` where the small kernel does not take `count` values.
    pub(crate) fn presend(&self, rank: usize, count: usize) -> Option<(u64, u64)> {
        let r = self.ranks.get(rank)?;
        (count * 4 <= SMALL_REGION).then_some((r.signal, SMALL_REGION as u64))
    }

    /// The parameters every all-reduce kernel takes: output, input and residual, rank `rank`'s
    /// signal block, the receive region's bytes, the rank and the group's size.
    fn params(&self, rank: usize, t: [u64; 3], count: usize, region: usize) -> Result<KParams> {
        let r = self.rank(rank)?;
        let mut p = KParams::default();
        for (k, ptr) in t.into_iter().enumerate() {
            p.t[k] = flat(ptr, count);
        }
        p.aux[0] = r.signal;
        p.aux[1] = region as u64;
        p.i[0] = rank as i32;
        p.i[1] = self.len() as i32;
        Ok(p)
    }

    fn rank(&self, rank: usize) -> Result<&Rank> {
        self.ranks
            .get(rank)
            .ok_or_else(|| Error::Invalid(format!("rank {rank} of a {}-rank group", self.len())))
    }

    fn launch(
        &self,
        rank: usize,
        kernel: &str,
        blocks: u32,
        threads: u32,
        p: KParams,
    ) -> Result<Cmd> {
        let r = self.rank(rank)?;
        let (func, name) = r
            .dev
            .kernels
            .func(&r.dev.ctx, &self.build, "allreduce", kernel)?;
        Ok(Cmd::Kernel {
            func,
            name,
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            smem: 0,
            cluster: 0,
            p: Box::new(p),
        })
    }
}

/// Threads of the one block of all_reduce_small_norm_f32 for a row of `count` f32 values whose
/// addresses are `addrs` (0: absent), the small-tensor kernel taking up to SMALL_REGION bytes:
/// one float4 a thread where the row allows (a thread waits for its values in turn), at most
/// 1,024 threads of NORM_VEC float4s each. `None` where the kernel cannot take the row: empty,
/// not whole float4s, too long, or an address not on 16 bytes.
fn norm_threads(count: usize, addrs: &[u64]) -> Option<u32> {
    let threads = (count / 4).div_ceil(32).min(32) * 32;
    let fits = count > 0
        && count.is_multiple_of(4)
        && count / 4 <= NORM_VEC * threads
        && count * 4 <= SMALL_REGION
        && addrs.iter().all(|a| a.is_multiple_of(16));
    fits.then_some(threads as u32)
}

/// What [`PeerGroup::norm_command`] computes after the sum: rms_norm(sum) * weight.
pub(crate) struct NormTail {
    /// The norm's weight: f32, one row.
    pub weight: u64,
    /// Where the normed row goes (f32).
    pub out: u64,
    /// Where its q8_1 blocks go (int8 values, (d, d * sum) pairs), for mat-vecs that read it.
    pub q8: Option<(u64, u64)>,
    /// The norm's epsilon.
    pub eps: f32,
}

/// A contiguous f32 vector of `count` values at `ptr`.
fn flat(ptr: u64, count: usize) -> TArg {
    let c = count as i64;
    TArg {
        ptr,
        ne: [c, 1, 1, 1],
        nb: [4, 4 * c, 4 * c, 4 * c],
    }
}

/// `bytes` of device memory with every 32-bit word set to `fill`.
fn alloc(dev: &DeviceShared, bytes: usize, fill: u32) -> Result<u64> {
    dev.bind()?;
    let mut ptr = 0;
    // SAFETY: ptr is a valid out-pointer; the context is current.
    unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }
        .result()
        .map_err(|e| dev.err("allocating all-reduce memory", e))?;
    // SAFETY: ptr holds `bytes` bytes (a multiple of 4) of this context.
    unsafe { sys::cuMemsetD32_v2(ptr, fill, bytes / 4) }
        .result()
        .map_err(|e| dev.err("clearing all-reduce memory", e))?;
    Ok(ptr)
}

impl Drop for PeerGroup {
    fn drop(&mut self) {
        for r in &self.ranks {
            if r.dev.synchronize_all().is_err() {
                continue;
            }
            for p in [r.signal, r.scratch, r.small] {
                if p != 0 {
                    // SAFETY: p came from cuMemAlloc of this context and is freed once, after
                    // every stream of the device finished.
                    let _ = unsafe { sys::cuMemFree_v2(p) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_norm_takes_rows_of_whole_float4s_up_to_8192_values() {
        let a = [256u64, 512, 0, 1024, 2048];
        // A decode row of an 8B model: one float4 a thread.
        assert_eq!(norm_threads(4096, &a), Some(1024));
        // The test model's 576 values: 144 float4s in 160 threads.
        assert_eq!(norm_threads(576, &a), Some(160));
        // 70B's 8192 values: two float4s a thread.
        assert_eq!(norm_threads(8192, &a), Some(1024));
        assert_eq!(norm_threads(8196, &a), None, "past 2 x 1024 float4s");
        assert_eq!(norm_threads(4098, &a), None, "not whole float4s");
        assert_eq!(norm_threads(0, &a), None, "empty");
        assert_eq!(
            norm_threads(4096, &[256, 520, 0, 1024, 2048]),
            None,
            "an address off 16 bytes"
        );
    }

    #[test]
    fn the_signal_block_mirrors_the_kernels_struct() {
        // Sizes struct ArSignal from kernels/peer.cuh's own text: each field a u64 or u32
        // with array dimensions from the defines.
        let src = include_str!("../../../kernels/peer.cuh");
        let dim = |d: &str| match d {
            "AR_MAX_RANKS" => MAX_RANKS,
            "AR_MAX_BLOCKS" => MAX_BLOCKS,
            other => panic!("unknown array dimension {other}"),
        };
        let body = src
            .split("struct ArSignal {")
            .nth(1)
            .and_then(|r| r.split("};").next())
            .expect("struct ArSignal in peer.cuh");
        let mut bytes = 0;
        for field in body.split(';').map(str::trim).filter(|f| !f.is_empty()) {
            let (ty, rest) = field.split_once(' ').expect("a type and a name");
            let mut n = match ty {
                "u64" => 8,
                "u32" => 4,
                other => panic!("unexpected field type {other}"),
            };
            for d in rest.split('[').skip(1) {
                n *= dim(d.trim_end_matches(']'));
            }
            bytes += n;
        }
        assert_eq!(SIGNAL_BYTES, bytes);
        let define = |name: &str| -> usize {
            let ar = include_str!("../../../kernels/allreduce.cu");
            [src, ar]
                .iter()
                .flat_map(|f| f.lines())
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("#define {name} in peer.cuh or allreduce.cu"))
        };
        assert_eq!(define("AR_MAX_RANKS"), MAX_RANKS);
        assert_eq!(define("AR_MAX_BLOCKS"), MAX_BLOCKS);
        assert_eq!(define("AR_SMALL_CHUNK"), SMALL_CHUNK);
        assert_eq!(define("AR_NORM_VEC"), NORM_VEC);
        let empty = src
            .lines()
            .find_map(|l| l.strip_prefix("#define AR_EMPTY 0x"))
            .and_then(|v| u32::from_str_radix(v.trim().trim_end_matches('u'), 16).ok());
        assert_eq!(empty, Some(EMPTY));
    }
}
