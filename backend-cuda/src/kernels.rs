//! The CUDA C kernels of `kernels/`, compiled by NVRTC at first use for the device's exact
//! architecture and cached on disk.
//!
//! Each op family is one `.cu` file; the shared headers (`common.cuh`, `quant.cuh`) are spliced
//! in where a file includes them, so the text NVRTC sees is self-contained. The compiled CUBIN
//! is stored in the cache directory ([`crate::CudaOptions::kernel_cache`]), named by a 128-bit
//! hash of everything that decides its bytes:
//! the expanded source, the NVRTC options, the architecture, the driver version and the NVRTC
//! version. A second start finds every module there and compiles nothing. A cache that cannot
//! be read or written only costs a compile; a kernel that does not compile is an error naming
//! its file and carrying NVRTC's log.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{sys as nsys, Ptx};
use tessera_core::{Error, Result};

/// Headers the kernel files include, by the name they include them with.
const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("quant.cuh", include_str!("../../kernels/quant.cuh")),
    ("quant_k.cuh", include_str!("../../kernels/quant_k.cuh")),
    ("quant_iq.cuh", include_str!("../../kernels/quant_iq.cuh")),
    (
        "quant_iq_grids.cuh",
        include_str!("../../kernels/quant_iq_grids.cuh"),
    ),
    ("peer.cuh", include_str!("../../kernels/peer.cuh")),
    ("attention.cuh", include_str!("../../kernels/attention.cuh")),
];

/// The kernel files: one op family each.
const FILES: &[(&str, &str)] = &[
    ("unary", include_str!("../../kernels/unary.cu")),
    ("binary", include_str!("../../kernels/binary.cu")),
    ("copy", include_str!("../../kernels/copy.cu")),
    ("quantize", include_str!("../../kernels/quantize.cu")),
    ("rows", include_str!("../../kernels/rows.cu")),
    ("norm", include_str!("../../kernels/norm.cu")),
    ("softmax", include_str!("../../kernels/softmax.cu")),
    ("rope", include_str!("../../kernels/rope.cu")),
    ("glu", include_str!("../../kernels/glu.cu")),
    ("reduce", include_str!("../../kernels/reduce.cu")),
    ("shape", include_str!("../../kernels/shape.cu")),
    ("matmul", include_str!("../../kernels/matmul.cu")),
    ("mmvq", include_str!("../../kernels/mmvq.cu")),
    ("moe", include_str!("../../kernels/moe.cu")),
    (
        "attention_prompt",
        include_str!("../../kernels/attention_prompt.cu"),
    ),
    (
        "attention_decode",
        include_str!("../../kernels/attention_decode.cu"),
    ),
    (
        "attention_merge",
        include_str!("../../kernels/attention_merge.cu"),
    ),
    ("allreduce", include_str!("../../kernels/allreduce.cu")),
];

/// A kernel entry point, ready to launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Func(pub sys::CUfunction);

// SAFETY: a CUfunction handle may be launched from any thread; its module is kept alive for
// the life of the KernelSet that handed it out.
unsafe impl Send for Func {}
// SAFETY: as above.
unsafe impl Sync for Func {}

/// The kernel source of a file with its headers spliced in.
pub(crate) fn expanded_source(file: &str) -> Option<String> {
    let (_, src) = FILES.iter().find(|(n, _)| *n == file)?;
    let mut out = String::new();
    let mut seen = Vec::new();
    expand(src, &mut out, &mut seen);
    Some(out)
}

fn expand(src: &str, out: &mut String, seen: &mut Vec<&'static str>) {
    for line in src.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#include \"") {
            let name = rest.trim_end_matches('"');
            if let Some((hname, htext)) = HEADERS.iter().find(|(n, _)| *n == name) {
                if !seen.contains(hname) {
                    seen.push(hname);
                    expand(htext, out, seen);
                }
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
}

/// Names of every kernel file (for tests and cache warm-up).
pub fn kernel_files() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|(n, _)| *n)
}

/// 64-bit FNV-1a from a given basis.
fn fnv(basis: u64, parts: &[&[u8]]) -> u64 {
    let mut h = basis;
    for p in parts {
        for &b in p.iter() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts so that ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// NVRTC's version (major, minor).
fn nvrtc_version() -> (i32, i32) {
    let (mut a, mut b) = (0, 0);
    // SAFETY: valid out-pointers; the library was probed.
    unsafe {
        let _ = nsys::nvrtcVersion(&mut a, &mut b);
    }
    (a, b)
}

/// Compiles CUDA C to a CUBIN for `arch` (e.g. `sm_90`); `Err` holds a message with NVRTC's log.
fn nvrtc_compile(
    file: &str,
    source: &str,
    options: &[String],
) -> std::result::Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|_| "source contains a NUL byte".to_string())?;
    let name = CString::new(format!("{file}.cu")).map_err(|_| "bad file name".to_string())?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).unwrap_or_default())
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: every pointer passed lives until the program is destroyed at the end of this
    // block; sizes come from NVRTC itself.
    unsafe {
        let mut prog: nsys::nvrtcProgram = std::ptr::null_mut();
        let r = nsys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcCreateProgram failed: {r:?}"));
        }
        let compiled = nsys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let out = if compiled != nsys::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            let _ = nsys::nvrtcGetProgramLogSize(prog, &mut size);
            let mut log = vec![0u8; size.max(1)];
            let _ = nsys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast());
            let log = String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .to_string();
            Err(format!("{compiled:?}\n{log}"))
        } else {
            let mut size = 0usize;
            let r = nsys::nvrtcGetCUBINSize(prog, &mut size);
            if r != nsys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(format!("nvrtcGetCUBINSize failed: {r:?}"))
            } else {
                let mut bin = vec![0u8; size];
                let r = nsys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast());
                if r != nsys::nvrtcResult::NVRTC_SUCCESS {
                    Err(format!("nvrtcGetCUBIN failed: {r:?}"))
                } else {
                    Ok(bin)
                }
            }
        };
        let _ = nsys::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// The NVRTC options every file is compiled with (`early` adds the define that makes every
/// kernel release the next one early, see [`Build::early`]).
fn options(arch: &str, early: bool) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--device-as-default-execution-space".into(),
    ];
    if early {
        o.push("-DPDL_EARLY_RELEASE".into());
    }
    o
}

/// Compiles every kernel file for `arch` (e.g. `sm_90`) with NVRTC alone, no GPU or driver
/// needed: a check that the kernels build. Returns each file with its CUBIN size, or the first
/// error (with NVRTC's log); an error too when libnvrtc cannot be loaded.
pub fn compile_all(arch: &str) -> std::result::Result<Vec<(&'static str, usize)>, String> {
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { nsys::is_culib_present() } {
        return Err("libnvrtc not found".into());
    }
    FILES
        .iter()
        .map(|(file, _)| {
            let src = expanded_source(file).unwrap_or_default();
            nvrtc_compile(file, &src, &options(arch, true))
                .map(|bin| (*file, bin.len()))
                .map_err(|log| format!("kernels/{file}.cu: {log}"))
        })
        .collect()
}

/// Which build of the kernel files a stream launches, and where compiled files are cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Build {
    /// Every kernel but the all-reduce's releases the next one as soon as it has passed its
    /// own wait (programmatic dependent launch, see the `driver` module docs): on for a GPU used
    /// alone, off for the parts of a multi-GPU group ([`crate::CudaOptions::grouped`]).
    pub early: bool,
    /// The disk cache directory, if one can be named.
    pub cache: Option<PathBuf>,
}

impl Build {
    /// The build that streams made with `options` launch.
    pub(crate) fn of(options: &crate::CudaOptions) -> Build {
        Build {
            early: !options.grouped,
            cache: options.cache_dir(),
        }
    }
}

/// A loaded kernel and its name, kept for errors.
type Named = (CudaFunction, &'static str);

/// The kernels of one device: modules loaded on first use, functions looked up once, each
/// per build variant (early release or not), so that streams of both kinds share the device.
pub(crate) struct KernelSet {
    device: String,
    arch: String,
    driver_version: i32,
    modules: Mutex<HashMap<(&'static str, bool), Arc<CudaModule>>>,
    funcs: Mutex<HashMap<(String, bool), Named>>,
    smem: Mutex<HashMap<usize, u32>>,
}

impl KernelSet {
    pub(crate) fn new(device: &str, cc: (i32, i32), driver_version: i32) -> KernelSet {
        KernelSet {
            device: device.to_string(),
            arch: format!("sm_{}{}", cc.0, cc.1),
            driver_version,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
            smem: Mutex::new(HashMap::new()),
        }
    }

    /// The CUBIN of a file, from the disk cache or compiled now.
    pub(crate) fn cubin(&self, build: &Build, file: &'static str) -> Result<Vec<u8>> {
        let source = expanded_source(file).ok_or_else(|| Error::Device {
            device: self.device.clone(),
            reason: format!("no kernel file kernels/{file}.cu"),
        })?;
        let options = options(&self.arch, build.early);
        let (nv_major, nv_minor) = nvrtc_version();
        let key_parts: Vec<Vec<u8>> = vec![
            source.as_bytes().to_vec(),
            options.join(" ").into_bytes(),
            self.arch.clone().into_bytes(),
            self.driver_version.to_le_bytes().to_vec(),
            format!("nvrtc {nv_major}.{nv_minor}").into_bytes(),
        ];
        let parts: Vec<&[u8]> = key_parts.iter().map(|p| p.as_slice()).collect();
        let key = format!(
            "{:016x}{:016x}",
            fnv(0xcbf2_9ce4_8422_2325, &parts),
            fnv(0x6c62_272e_07bb_0142, &parts)
        );
        let path = build
            .cache
            .as_ref()
            .map(|d| d.join(format!("{file}-{}-{key}.cubin", self.arch)));
        if let Some(p) = &path {
            if let Ok(bin) = std::fs::read(p) {
                if bin.starts_with(b"\x7fELF") {
                    log::debug!(
                        "{}: kernels/{file}.cu from the cache ({})",
                        self.device,
                        p.display()
                    );
                    return Ok(bin);
                }
            }
        }
        log::info!(
            "{}: compiling kernels/{file}.cu for {} with NVRTC {nv_major}.{nv_minor}",
            self.device,
            self.arch
        );
        let started = std::time::Instant::now();
        let bin = nvrtc_compile(file, &source, &options).map_err(|log| Error::Device {
            device: self.device.clone(),
            reason: format!(
                "kernels/{file}.cu failed to compile with NVRTC for {}: {log}",
                self.arch
            ),
        })?;
        log::debug!(
            "{}: kernels/{file}.cu compiled in {:.2} s",
            self.device,
            started.elapsed().as_secs_f64()
        );
        if let Some(p) = &path {
            let stored = p
                .parent()
                .map(std::fs::create_dir_all)
                .transpose()
                .and_then(|_| {
                    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                    std::fs::write(&tmp, &bin)?;
                    std::fs::rename(&tmp, p)
                });
            if let Err(e) = stored {
                log::warn!(
                    "{}: could not store kernels/{file}.cu in the cache {}: {e}",
                    self.device,
                    p.display()
                );
            }
        }
        Ok(bin)
    }

    /// The loaded module of a file (compiled outside the lock, so files compile in parallel).
    fn module(
        &self,
        ctx: &Arc<CudaContext>,
        build: &Build,
        file: &'static str,
    ) -> Result<Arc<CudaModule>> {
        let key = (file, build.early);
        if let Some(m) = self
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(m.clone());
        }
        let bin = self.cubin(build, file)?;
        let mut mods = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = mods.get(&key) {
            return Ok(m.clone());
        }
        let m = ctx
            .load_module(Ptx::from_binary(bin))
            .map_err(|e| Error::Device {
                device: self.device.clone(),
                reason: format!("loading kernels/{file}.cu: {}", crate::driver::describe(e)),
            })?;
        mods.insert(key, m.clone());
        Ok(m)
    }

    /// Compiles (or reads from the cache) and loads file `file` if not loaded yet.
    pub(crate) fn load(
        &self,
        ctx: &Arc<CudaContext>,
        build: &Build,
        file: &'static str,
    ) -> Result<()> {
        self.module(ctx, build, file).map(|_| ())
    }

    /// Kernel `name` of file `file` in `build`, with its name kept for errors.
    pub(crate) fn func(
        &self,
        ctx: &Arc<CudaContext>,
        build: &Build,
        file: &'static str,
        name: &str,
    ) -> Result<(Func, &'static str)> {
        let key = (name.to_string(), build.early);
        {
            let funcs = self.funcs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((f, n)) = funcs.get(&key) {
                return Ok((Func(f.cu_function()), n));
            }
        }
        let m = self.module(ctx, build, file)?;
        let f = m.load_function(name).map_err(|e| Error::Device {
            device: self.device.clone(),
            reason: format!(
                "kernels/{file}.cu has no kernel {name}: {}",
                crate::driver::describe(e)
            ),
        })?;
        let raw = Func(f.cu_function());
        // Kernel names are a small fixed set: each is kept once for the life of the process.
        let kept: &'static str = Box::leak(name.to_string().into_boxed_str());
        self.funcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (f, kept));
        Ok((raw, kept))
    }

    /// Lets `func` use `bytes` of dynamic shared memory (needed above 48 KiB).
    pub(crate) fn allow_smem(&self, device: &str, func: Func, bytes: u32) -> Result<()> {
        let mut set = self.smem.lock().unwrap_or_else(|p| p.into_inner());
        let key = func.0 as usize;
        if set.get(&key).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        // SAFETY: func is a valid function handle of a loaded module.
        unsafe {
            sys::cuFuncSetAttribute(
                func.0,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .result()
        .map_err(|e| crate::driver::drv(device, "raising a kernel's shared memory limit", e))?;
        set.insert(key, bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::options;

    #[test]
    fn early_release_is_one_define() {
        let early = options("sm_90", true);
        let plain = options("sm_90", false);
        assert!(early.iter().any(|o| o == "-DPDL_EARLY_RELEASE"));
        assert!(!plain.iter().any(|o| o.contains("PDL")));
        assert_eq!(early.len(), plain.len() + 1);
    }
}
