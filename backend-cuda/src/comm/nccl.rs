//! NCCL communicators: one `ncclComm_t` per local rank, collectives enqueued on each rank's
//! stream inside one NCCL group (so that one thread may drive every local GPU).
//!
//! Ranks are set up the way several processes or nodes would set them up: a unique id from
//! [`unique_id`] (made by one rank and handed to the others by the caller), then
//! `ncclCommInitRank` for every local rank inside a group. A single process that owns all
//! the ranks makes the id itself (`NcclComm::local`).

use std::sync::Arc;

use cudarc::nccl::{result, sys};
use tessera_core::{Error, Result};

use crate::driver::DeviceShared;

/// The NCCL symbols tessera calls (checked present before the first call).
const SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclAllReduce",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGetErrorString",
];

/// Bytes of an NCCL unique id.
pub const UNIQUE_ID_BYTES: usize = 128;

/// Checks that libnccl and every symbol used are present; the reason where not.
pub(crate) fn probe() -> std::result::Result<(), String> {
    // SAFETY: is_culib_present only tries to open the library; culib() is called only after it
    // succeeded, so it cannot panic.
    unsafe {
        if !sys::is_culib_present() {
            return Err("libnccl not found".into());
        }
        let lib = sys::culib();
        if let Some(s) = SYMBOLS
            .iter()
            .find(|n| lib.get::<*const std::ffi::c_void>(n.as_bytes()).is_err())
        {
            return Err(format!("libnccl lacks {s}"));
        }
    }
    Ok(())
}

fn nccl_err(what: &str, e: result::NcclError) -> Error {
    // SAFETY: the symbol was probed; NCCL returns a static string for every result code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    Error::Device {
        device: "nccl".into(),
        reason: format!("{what} failed: {}", text.to_string_lossy()),
    }
}

/// A new NCCL unique id, to hand to every rank of one communicator (every process).
pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
    probe().map_err(|reason| Error::Device {
        device: "nccl".into(),
        reason,
    })?;
    let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// The library's version, e.g. 22807 for 2.28.7.
pub(crate) fn version() -> Result<i32> {
    result::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))
}

/// The local ranks of one NCCL communicator.
pub(crate) struct NcclComm {
    comms: Vec<sys::ncclComm_t>,
    devs: Vec<Arc<DeviceShared>>,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time; the owner is
// used by one thread at a time.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Ranks `first_rank..first_rank + devs.len()` of an `nranks`-rank communicator
    /// identified by `id`, on `devs` in order. Returns once every rank of the communicator
    /// (in every process) has joined.
    pub(crate) fn join(
        devs: &[Arc<DeviceShared>],
        id: &[u8; UNIQUE_ID_BYTES],
        first_rank: usize,
        nranks: usize,
    ) -> Result<NcclComm> {
        probe().map_err(|reason| Error::Device {
            device: "nccl".into(),
            reason,
        })?;
        if first_rank + devs.len() > nranks || devs.is_empty() {
            return Err(Error::Invalid(format!(
                "NCCL ranks {first_rank}..{} do not fit a communicator of {nranks}",
                first_rank + devs.len()
            )));
        }
        for (i, a) in devs.iter().enumerate() {
            if devs[..i].iter().any(|b| b.ordinal == a.ordinal) {
                return Err(Error::Invalid(format!(
                    "NCCL needs one rank per GPU; {} is given twice",
                    a.name
                )));
            }
        }
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first_err = None;
        for (k, dev) in devs.iter().enumerate() {
            if let Err(e) = dev.bind() {
                first_err.get_or_insert(e);
                continue;
            }
            // SAFETY: comms[k] is a valid out-pointer; the context of the rank's GPU is current.
            let r = unsafe {
                result::comm_init_rank(&mut comms[k], nranks as i32, uid, (first_rank + k) as i32)
            };
            if let Err(e) = r {
                first_err.get_or_insert(nccl_err("ncclCommInitRank", e));
            }
        }
        let end = result::group_end().map_err(|e| nccl_err("initialising the ranks", e));
        let comm = NcclComm {
            comms,
            devs: devs.to_vec(),
        };
        match (first_err, end) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(_)) => Ok(comm),
        }
    }

    /// Every rank of a new communicator, in this process, one per device.
    pub(crate) fn local(devs: &[Arc<DeviceShared>]) -> Result<NcclComm> {
        let id = unique_id()?;
        NcclComm::join(devs, &id, 0, devs.len())
    }

    /// Sums `count` elements at device address `ptrs[k]` of local rank `k` in place, on
    /// `streams[k]`.
    pub(crate) fn all_reduce(
        &self,
        ptrs: &[u64],
        streams: &[cudarc::driver::sys::CUstream],
        count: usize,
        bf16: bool,
    ) -> Result<()> {
        let dtype = if bf16 {
            sys::ncclDataType_t::ncclBfloat16
        } else {
            sys::ncclDataType_t::ncclFloat32
        };
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first_err = None;
        for (k, &comm) in self.comms.iter().enumerate() {
            if let Err(e) = self.devs[k].bind() {
                first_err.get_or_insert(e);
                continue;
            }
            let p = ptrs[k] as *mut std::ffi::c_void;
            // SAFETY: the caller checked that `count` elements at `ptrs[k]` lie in memory of
            // rank k's GPU; the stream belongs to that GPU.
            let r = unsafe {
                result::all_reduce(
                    p,
                    p,
                    count,
                    dtype,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    streams[k].cast(),
                )
            };
            if let Err(e) = r {
                first_err.get_or_insert(nccl_err("ncclAllReduce", e));
            }
        }
        let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        match (first_err, end) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(_)) => Ok(()),
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        for (k, &c) in self.comms.iter().enumerate() {
            if c.is_null() || self.devs[k].bind().is_err() {
                continue;
            }
            // SAFETY: the communicator was made by ncclCommInitRank and is destroyed once.
            if let Err(e) = unsafe { result::comm_destroy(c) } {
                log::warn!("nccl: destroying rank {k} failed: {:?}", e.0);
            }
        }
    }
}
