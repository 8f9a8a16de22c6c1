//! [`CudaComm`]: the all-reduce of a group of CUDA devices, for meta devices made of GPUs.
//!
//! Two carriers, chosen per call:
//!
//! - **peer** (`peer` module): a one-shot kernel that writes each rank's values into every other
//!   rank's memory (peer access) and sums what it received; it needs no host step between the
//!   ranks, so it runs inside each rank's CUDA graph (the meta device puts
//!   [`tessera_core::Op::AllReduce`] nodes in the part graphs), fused with a residual add that
//!   follows, and for one row also with the rms_norm * w after that. Tensors up to 256 KiB (a
//!   decode step's) take a kernel without flags or fences, which pays one link crossing
//!   instead of a write, a fence and a flag; larger f32 tensors up to the scratch size one with
//!   flags. Used when every pair of GPUs has peer access (NVLink or PCIe).
//! - **NCCL** ([`nccl`]): ring and tree algorithms with the bandwidth for large tensors, and
//!   bf16 sums; enqueued on each rank's stream between graph stages.
//!
//! [`crate::CudaOptions::all_reduce`] picks the carriers ([`crate::AllReduce`]);
//! [`crate::CudaOptions::peer_mib`] sets the peer scratch size, the largest tensor the peer
//! kernel sums.

pub mod nccl;
pub(crate) mod peer;

use std::sync::Arc;

use tessera_core::{Backend, Buffer, Communicator, Error, ReduceType, Result};

use crate::backend::CudaBackend;
use crate::driver::DeviceShared;
use crate::kernels::Build;
use crate::memory::CudaBuffer;
use crate::{AllReduce, CudaOptions};
use nccl::NcclComm;
use peer::PeerGroup;

/// Which carriers a group may use ([`AllReduce`] less `Host`, which makes no group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Auto,
    Peer,
    Nccl,
}

/// The all-reduce of a group of CUDA devices (one rank per device, in order).
pub struct CudaComm {
    devs: Vec<Arc<DeviceShared>>,
    peer: Option<Arc<PeerGroup>>,
    nccl: Option<NcclComm>,
    mode: Mode,
}

/// What a group keeps when its communicator is dropped, for the next group over the same
/// GPUs: setting up NCCL and peer memory takes long, and a test suite opens one meta backend
/// per case. A kept group is handed to one communicator at a time (two users of one group
/// would interleave their calls on the GPUs).
struct Kept {
    ordinals: Vec<usize>,
    mode: Mode,
    slot_bytes: usize,
    f16: bool,
    peer: Option<Arc<PeerGroup>>,
    nccl: Option<NcclComm>,
}

static KEPT: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

fn kept() -> std::sync::MutexGuard<'static, Vec<Kept>> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for CudaComm {
    fn drop(&mut self) {
        if self.peer.is_none() && self.nccl.is_none() {
            return;
        }
        kept().push(Kept {
            ordinals: self.devs.iter().map(|d| d.ordinal).collect(),
            mode: self.mode,
            slot_bytes: self.peer.as_ref().map_or(0, |p| p.max_elements() * 4),
            f16: self.peer.as_ref().is_some_and(|p| p.f16()),
            peer: self.peer.take(),
            nccl: self.nccl.take(),
        });
    }
}

impl CudaComm {
    /// A group over `devs`, with every carrier `options` allow that works here. `Ok(None)`:
    /// none works (no peer access and no NCCL) or `options` ask for the host path; the caller
    /// uses the host.
    pub(crate) fn new(
        devs: Vec<Arc<DeviceShared>>,
        options: &CudaOptions,
    ) -> Result<Option<CudaComm>> {
        let mode = match options.all_reduce {
            AllReduce::Auto => Mode::Auto,
            AllReduce::Peer => Mode::Peer,
            AllReduce::Nccl => Mode::Nccl,
            AllReduce::Host => return Ok(None),
        };
        let slot_bytes = options.peer_mib << 20;
        let f16 = options.peer_f16;
        let ordinals: Vec<usize> = devs.iter().map(|d| d.ordinal).collect();
        {
            let mut kept = kept();
            let found = kept.iter().position(|k| {
                k.ordinals == ordinals
                    && k.mode == mode
                    && (k.peer.is_none() || (k.slot_bytes == slot_bytes && k.f16 == f16))
            });
            if let Some(i) = found {
                let k = kept.swap_remove(i);
                return Ok(Some(CudaComm {
                    devs,
                    peer: k.peer,
                    nccl: k.nccl,
                    mode,
                }));
            }
        }
        let peer = if mode != Mode::Nccl && peer::all_peers(&devs)? {
            let build = Build {
                early: false,
                cache: options.cache_dir(),
            };
            Some(Arc::new(PeerGroup::new(&devs, slot_bytes, f16, build)?))
        } else {
            None
        };
        let nccl = if mode == Mode::Peer {
            None
        } else {
            match NcclComm::local(&devs) {
                Ok(c) => Some(c),
                Err(e) if peer.is_some() || mode == Mode::Auto => {
                    log::info!("cuda: NCCL is not used: {e}");
                    None
                }
                Err(e) => return Err(e),
            }
        };
        if peer.is_none() && nccl.is_none() {
            return Ok(None);
        }
        Ok(Some(CudaComm {
            devs,
            peer,
            nccl,
            mode,
        }))
    }

    /// Local ranks `first_rank..first_rank + devices.len()` of an `nranks`-rank NCCL
    /// communicator named by `id` (from [`nccl::unique_id`], made by one process and handed
    /// to every other by the caller): how several processes or nodes build one group. Returns
    /// once every rank has joined. All-reduces go through NCCL alone. The devices' streams run
    /// as parts of a group where the devices were opened with [`CudaOptions::grouped`].
    pub fn join(
        devices: &[&crate::CudaDevice],
        id: &[u8; nccl::UNIQUE_ID_BYTES],
        first_rank: usize,
        nranks: usize,
    ) -> Result<CudaComm> {
        let devs: Vec<_> = devices.iter().map(|d| d.shared().clone()).collect();
        let nccl = NcclComm::join(&devs, id, first_rank, nranks)?;
        Ok(CudaComm {
            devs,
            peer: None,
            nccl: Some(nccl),
            mode: Mode::Nccl,
        })
    }

    /// A group over `devices` through the peer kernel alone (no NCCL), whose calls sum up to
    /// `max_bytes` of f32, sending values as the first device's options say
    /// ([`CudaOptions::peer_f16`]); an error where some pair of GPUs lacks peer access.
    pub fn peer_only(devices: &[&crate::CudaDevice], max_bytes: usize) -> Result<CudaComm> {
        let devs: Vec<_> = devices.iter().map(|d| d.shared().clone()).collect();
        let options = devices.first().map(|d| d.options()).unwrap_or_default();
        if !peer::all_peers(&devs)? {
            return Err(Error::Unsupported {
                backend: "cuda".into(),
                what: "a peer all-reduce between GPUs without peer access".into(),
            });
        }
        let build = Build {
            early: false,
            cache: options.cache_dir(),
        };
        let peer = Some(Arc::new(PeerGroup::new(
            &devs,
            max_bytes,
            options.peer_f16,
            build,
        )?));
        Ok(CudaComm {
            devs,
            peer,
            nccl: None,
            mode: Mode::Peer,
        })
    }

    /// The library version of NCCL (e.g. 22807), where NCCL is loaded.
    pub fn nccl_version(&self) -> Option<i32> {
        self.nccl.as_ref().and_then(|_| nccl::version().ok())
    }
}

/// The CUDA backends of `backends`, which must be streams of the group's devices in order.
fn streams<'b>(
    devs: &[Arc<DeviceShared>],
    backends: &'b mut [Box<dyn Backend>],
) -> Result<Vec<&'b mut CudaBackend>> {
    if backends.len() != devs.len() {
        return Err(Error::Invalid(format!(
            "an all-reduce over {} CUDA ranks was given {} streams",
            devs.len(),
            backends.len()
        )));
    }
    backends
        .iter_mut()
        .zip(devs)
        .map(|(b, d)| {
            let name = b.name();
            b.as_any_mut()
                .and_then(|a| a.downcast_mut::<CudaBackend>())
                .filter(|c| c.ordinal() == d.ordinal)
                .ok_or_else(|| Error::Invalid(format!("{name} is not a stream of {}", d.name)))
        })
        .collect()
}

impl Communicator for CudaComm {
    fn name(&self) -> String {
        match (&self.peer, &self.nccl) {
            (Some(_), Some(_)) => "peer+nccl".into(),
            (Some(_), None) => "peer".into(),
            _ => "nccl".into(),
        }
    }

    fn size(&self) -> usize {
        self.devs.len()
    }

    fn all_reduce(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        dtype: ReduceType,
    ) -> Result<()> {
        let mut streams = streams(&self.devs, backends)?;
        if bufs.len() != self.devs.len() {
            return Err(Error::Invalid(format!(
                "an all-reduce over {} ranks was given {} buffers",
                self.devs.len(),
                bufs.len()
            )));
        }
        if count == 0 {
            return Ok(());
        }
        let esize = if dtype == ReduceType::BF16 { 2 } else { 4 };
        let mut ptrs = Vec::with_capacity(bufs.len());
        for ((buf, off), d) in bufs.iter().zip(&self.devs) {
            let b = buf
                .as_any()
                .downcast_ref::<CudaBuffer>()
                .filter(|b| b.ordinal() == d.ordinal)
                .ok_or_else(|| {
                    Error::Invalid(format!("buffer {} is not memory of {}", buf.name(), d.name))
                })?;
            b.check_range(*off, count * esize)?;
            ptrs.push(b.device_ptr() + *off as u64);
        }
        let peer_fits = dtype == ReduceType::F32
            && self
                .peer
                .as_ref()
                .is_some_and(|p| count <= p.max_elements());
        match (&self.peer, &self.nccl) {
            (Some(peer), _) if peer_fits && (self.nccl.is_none() || self.mode == Mode::Peer) => {
                for (k, s) in streams.iter_mut().enumerate() {
                    let cmd = peer.command(k, ptrs[k], ptrs[k], 0, count, false)?;
                    s.run_command(&cmd)?;
                }
                Ok(())
            }
            (_, Some(nccl)) => {
                let raw: Vec<_> = streams.iter().map(|s| s.cu_stream()).collect();
                for s in &streams {
                    s.bind()?;
                }
                nccl.all_reduce(&ptrs, &raw, count, dtype == ReduceType::BF16)
            }
            _ => Err(Error::Unsupported {
                backend: "cuda".into(),
                what: format!(
                    "a {} all-reduce of {count} elements without NCCL (the peer kernel sums f32 up to {} elements)",
                    if dtype == ReduceType::BF16 { "bf16" } else { "f32" },
                    self.peer.as_ref().map_or(0, |p| p.max_elements())
                ),
            }),
        }
    }

    fn attach(&mut self, backends: &mut [Box<dyn Backend>]) -> Result<usize> {
        let Some(peer) = self.peer.clone() else {
            return Ok(0);
        };
        for (k, s) in streams(&self.devs, backends)?.into_iter().enumerate() {
            s.join_group(peer.clone(), k);
        }
        Ok(peer.max_elements())
    }
}

/// The shared state of each CUDA device among `devices`, or `None` if one is not a CUDA
/// device.
pub(crate) fn shared_of(
    devices: &[Arc<dyn tessera_core::Device>],
) -> Option<Vec<Arc<DeviceShared>>> {
    devices
        .iter()
        .map(|d| {
            d.as_any()
                .downcast_ref::<crate::CudaDevice>()
                .map(|c| c.shared().clone())
        })
        .collect()
}
