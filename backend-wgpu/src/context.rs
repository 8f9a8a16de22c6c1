//! The state one opened adapter shares between its device, buffers and backends: the wgpu
//! device and queue, the error slot that the uncaptured-error handler fills, and the caches of
//! pipelines and bind groups.
//!
//! # Errors without panics
//!
//! wgpu's default uncaptured-error handler panics. [`Gpu::open`] installs one that records the
//! first error in [`Gpu::error`] instead; every call that submits work or waits on the device
//! takes the recorded error ([`Gpu::check`]) and returns it as an [`Error::Device`]. Allocations
//! run inside error scopes, so that an out-of-memory or a size past the limits becomes an
//! [`Error::OutOfMemory`] or [`Error::Buffer`] of that call rather than a stray later error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_core::graph_key::GraphKey;
use tessera_core::{Error, Result};

use crate::backend::Recording;
use crate::options::WgpuOptions;
use crate::shader::Variant;

/// The storage bindings of the op shaders: binding 0 is the destination, 1.. the sources.
pub(crate) const MAX_STORAGE: usize = 8;
/// The binding of the per-op parameter block (a uniform with a dynamic offset).
pub(crate) const PARAMS_BINDING: u32 = 8;
/// The most storage bindings a pipeline has (the mat-vec with the fused rope,
/// [`crate::shader::QKV_ROPE_BINDINGS`]): layouts with more than [`MAX_STORAGE`] are made
/// where the adapter allows them, and their bindings past 7 are WGSL bindings 9 on.
const MAX_LAYOUT: usize = crate::shader::QKV_ROPE_BINDINGS;

/// The WGSL binding of storage binding `i`: `i`, or `i + 1` from [`PARAMS_BINDING`] on.
fn storage_slot(i: usize) -> u32 {
    let i = i as u32;
    if i < PARAMS_BINDING {
        i
    } else {
        i + 1
    }
}
/// The WGSL binding of the lattice grids of the i-quants (`grids` in `shaders/dequant.wgsl`),
/// which the variants that read those types have besides their storage bindings (read-only,
/// one buffer per device: [`crate::grids`]).
pub(crate) const GRID_BINDING: u32 = 11;
/// Bytes of one op's parameter block (`Params` in `shaders/common.wgsl`).
pub(crate) const PARAMS_SIZE: u64 = 256;

/// One storage binding of a dispatch: a window of a wgpu buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Window {
    /// The buffer's id (unique per process).
    pub id: u64,
    /// Byte offset of the window (a multiple of the storage offset alignment).
    pub base: u64,
    /// Bytes in the window (a multiple of 4).
    pub size: u64,
}

/// Key of a cached bind group: the storage windows in binding order and the parameter buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BindKey {
    windows: Vec<Window>,
    params: u64,
    /// Whether the group also binds the lattice grids (a layout of its own).
    grid: bool,
}

/// Locks a mutex, treating a poisoned one (a panic elsewhere) as still usable: the caches
/// hold no invariants that a panic could break half-way.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Everything one opened adapter shares.
pub(crate) struct Gpu {
    /// The device name (`wgpu:N`), for errors.
    pub name: String,
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The limits the device was opened with (the adapter's own).
    pub limits: wgpu::Limits,
    /// Whether the device has SUBGROUP (and the shaders may use subgroup operations).
    pub subgroups: bool,
    /// The adapter's smallest subgroup size (a shader whose subgroup operations assume more
    /// invocations a subgroup uses its fallback below it).
    pub subgroup_min: u32,
    /// Whether the device has TIMESTAMP_QUERY (graphs can be timed on the GPU).
    pub timestamps: bool,
    /// Whether the tiled mat-mat computes f16 and quantized weights in f16 (the H16 define):
    /// the device has SHADER_F16 and [`WgpuOptions::mat_mat_f16`] asks for it (by default
    /// wherever the adapter is not a software rasterizer).
    pub mat_mat_f16: bool,
    /// Whether the f16 tiled mat-mat runs its products on cooperative matrices (the COOP
    /// define; [`coop_wanted`]).
    pub coop: bool,
    /// Whether the shaders may convert f16 with unpack2x16float (the F16 define).
    f16_in_f32: bool,
    /// The options the device was opened with (its backends start with their fusion and
    /// profile settings).
    pub options: WgpuOptions,
    /// The first error the uncaptured-error handler saw, not yet reported.
    error: Arc<Mutex<Option<String>>>,
    /// Set once the device is lost.
    lost: Arc<AtomicBool>,
    /// Bytes allocated in buffers now alive.
    pub allocated: AtomicUsize,
    /// The next buffer id.
    next_id: AtomicU64,
    /// Bind group layouts by number of storage bindings (index 0 unused), up to
    /// [`MAX_LAYOUT`] or the adapter's limit.
    layouts: Vec<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    /// The same layouts with the lattice grids at [`GRID_BINDING`] too (for the variants that
    /// read a lattice i-quant: [`Variant::grid`]).
    grid_layouts: Vec<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    /// The lattice grids of the i-quants, uploaded when the device opens.
    grids: wgpu::Buffer,
    /// Compute pipelines by variant.
    pipelines: Mutex<HashMap<Variant, Arc<wgpu::ComputePipeline>>>,
    /// Bind groups by the windows they bind.
    bind_groups: Mutex<HashMap<BindKey, Arc<wgpu::BindGroup>>>,
    /// Recorded graphs by the hash of their key.
    recordings: Mutex<HashMap<u64, Arc<Recording>>>,
    /// How many times buffers were forgotten ([`Gpu::forget_buffer`]): a recording held since
    /// this last changed binds no freed buffer.
    forgets: AtomicU64,
    /// The scratch buffer ([`Gpu::scratch`]): its id and the buffer.
    scratch: Mutex<Option<(u64, wgpu::Buffer)>>,
}

/// The smallest scratch buffer made.
const SCRATCH_MIN: u64 = 1 << 16;

/// Whether the tiled mat-mat should run on cooperative matrices on `adapter`, opened with
/// `features`: the adapter offers EXPERIMENTAL_COOPERATIVE_MATRIX with 16 x 16 x 16 products
/// of f16 summed in f32 at subgroup scope, its subgroups are always 32 invocations (the shader
/// numbers its subgroups as local index / 32), and [`WgpuOptions::coop`] asks for them.
fn coop_wanted(adapter: &wgpu::Adapter, features: wgpu::Features, options: WgpuOptions) -> bool {
    if !options.coop
        || !features.contains(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP)
        || !adapter
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        || adapter.get_info().device_type == wgpu::DeviceType::Cpu
    {
        return false;
    }
    let info = adapter.get_info();
    if info.subgroup_min_size != 32 || info.subgroup_max_size != 32 {
        return false;
    }
    adapter.cooperative_matrix_properties().iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    })
}

/// Recorded graphs kept at most; when full, all are dropped and recording starts over.
const MAX_RECORDINGS: usize = 64;

impl Gpu {
    /// Opens `adapter` with its own limits and the features tessera uses that it has, for
    /// `options`.
    pub fn open(name: String, adapter: &wgpu::Adapter, options: WgpuOptions) -> Result<Arc<Gpu>> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        if (limits.max_storage_buffers_per_shader_stage as usize) < MAX_STORAGE {
            return Err(Error::Device {
                device: name,
                reason: format!(
                    "{} offers {} storage buffers per shader stage; tessera's shaders need {MAX_STORAGE} (WebGPU's default)",
                    info.name, limits.max_storage_buffers_per_shader_stage
                ),
            });
        }
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let mut features = adapter.features() & wanted;
        let coop = coop_wanted(adapter, features, options);
        let experimental = if coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            // SAFETY: wgpu marks its experimental features as possibly unsound where misused;
            // the one asked for here (cooperative matrices) is used only by the mat-mat
            // shader variant that every test build validates with naga, with a configuration
            // the adapter lists (`coop_wanted`).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let desc = wgpu::DeviceDescriptor {
            label: Some("tessera"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: experimental,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|e| Error::Device {
                device: name.clone(),
                reason: format!("cannot open {}: {e}", info.name),
            })?;
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let slot = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = lock(&slot);
            if s.is_none() {
                *s = Some(e.to_string());
            }
        }));
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            log::error!("wgpu device lost ({reason:?}): {msg}");
            flag.store(true, Ordering::SeqCst);
        });
        let most = MAX_LAYOUT.min(limits.max_storage_buffers_per_shader_stage as usize);
        let layouts = (0..=most).map(|n| make_layout(&device, n, false)).collect();
        // The grid binding is one more storage buffer: only layouts that leave room for it.
        let grid_most = most.min(limits.max_storage_buffers_per_shader_stage as usize - 1);
        let grid_layouts = (0..=grid_most)
            .map(|n| make_layout(&device, n, true))
            .collect();
        let grid_words = crate::grids::words();
        let grids = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tessera lattice grids"),
            size: 4 * grid_words.len() as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&grids, 0, bytemuck::cast_slice(&grid_words));
        log::debug!(
            "wgpu: opened {} ({:?}, {:?}) with {:?}",
            info.name,
            info.backend,
            info.device_type,
            features
        );
        Ok(Arc::new(Gpu {
            name,
            device,
            queue,
            limits,
            subgroups: features.contains(wgpu::Features::SUBGROUP) && options.subgroups,
            subgroup_min: info.subgroup_min_size,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            mat_mat_f16: features.contains(wgpu::Features::SHADER_F16)
                && options
                    .mat_mat_f16
                    .unwrap_or(info.device_type != wgpu::DeviceType::Cpu),
            coop,
            options,
            f16_in_f32: adapter
                .get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32),
            error,
            lost,
            allocated: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            layouts,
            grid_layouts,
            grids,
            pipelines: Mutex::default(),
            bind_groups: Mutex::default(),
            recordings: Mutex::default(),
            forgets: AtomicU64::new(0),
            scratch: Mutex::default(),
        }))
    }

    /// An error of this device.
    pub fn err(&self, reason: impl Into<String>) -> Error {
        Error::Device {
            device: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// Returns the error the handler recorded since the last check, or a lost device.
    pub fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.err("the device was lost"));
        }
        match lock(&self.error).take() {
            Some(e) => Err(self.err(e)),
            None => Ok(()),
        }
    }

    /// Bytes of the largest storage binding the shaders use: the adapter's limit, at most 2 GiB
    /// (the shaders address bytes in u32), a multiple of 4.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(1 << 31) / 4 * 4
    }

    /// A fresh buffer id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A buffer of `size` bytes for `usage` (named `what` in wgpu's labels and in the error):
    /// the adapter's out-of-memory or validation error becomes a tessera error.
    pub fn new_buffer(
        &self,
        what: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        self.scoped(
            || {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(what),
                    size,
                    usage,
                    mapped_at_creation: false,
                })
            },
            || Error::OutOfMemory {
                device: self.name.clone(),
                bytes: size as usize,
            },
            |e| self.err(format!("{what} buffer of {size} bytes: {e}")),
        )
    }

    /// Runs `f` inside out-of-memory and validation error scopes; an error caught becomes
    /// `on_oom` or `on_invalid`.
    pub fn scoped<T>(
        &self,
        f: impl FnOnce() -> T,
        on_oom: impl FnOnce() -> Error,
        on_invalid: impl FnOnce(String) -> Error,
    ) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        if oom.is_some() {
            return Err(on_oom());
        }
        if let Some(e) = invalid {
            return Err(on_invalid(e.to_string()));
        }
        Ok(value)
    }

    /// Waits until the queue has finished all submitted work.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.err(format!("waiting for the queue: {e}")))?;
        self.check()
    }

    /// The pipeline of a shader variant, built (and cached) on first use.
    pub fn pipeline(&self, v: &Variant) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = lock(&self.pipelines).get(v) {
            return Ok(p.clone());
        }
        let source = Variant {
            f16: self.f16_in_f32,
            ..*v
        }
        .source()
        .map_err(|e| self.err(e))?;
        let label = v.label();
        let layout = &self.layout(v)?.1;
        let pipeline = self.scoped(
            || {
                // SAFETY: every variant the backend can ask for is validated by naga in the
                // crate's unit tests (`shader::tests`), and the ops bound their indices by
                // the tensor shapes they are given, so the checks are not needed.
                let module = unsafe {
                    self.device.create_shader_module_trusted(
                        wgpu::ShaderModuleDescriptor {
                            label: Some(&label),
                            source: wgpu::ShaderSource::Wgsl(source.into()),
                        },
                        wgpu::ShaderRuntimeChecks::unchecked(),
                    )
                };
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(&label),
                        layout: Some(layout),
                        module: &module,
                        entry_point: Some(v.entry()),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &[],
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            },
            || self.err(format!("out of memory building shader {label}")),
            |e| self.err(format!("shader {label}: {e}")),
        )?;
        log::debug!("wgpu: built pipeline {label}");
        let p = Arc::new(pipeline);
        lock(&self.pipelines).insert(*v, p.clone());
        Ok(p)
    }

    /// The bind group layout (and pipeline layout) of `variant`: by its storage bindings, with
    /// the lattice grids where it reads them; an error where the adapter has too few storage
    /// bindings for it.
    fn layout(&self, v: &Variant) -> Result<&(wgpu::BindGroupLayout, wgpu::PipelineLayout)> {
        let layouts = if v.grid() {
            &self.grid_layouts
        } else {
            &self.layouts
        };
        layouts.get(v.storage_bindings()).ok_or_else(|| {
            self.err(format!(
                "shader {} needs more storage bindings than the adapter's {}",
                v.label(),
                self.limits.max_storage_buffers_per_shader_stage
            ))
        })
    }

    /// The bind group of a pipeline of `variant` binding `storage` (windows of buffers,
    /// destination first) and the parameter buffer, built (and cached) on first use.
    pub fn bind_group(
        &self,
        variant: &Variant,
        storage: &[(Window, &wgpu::Buffer)],
        params: (u64, &wgpu::Buffer),
    ) -> Arc<wgpu::BindGroup> {
        let grid = variant.grid();
        let key = BindKey {
            windows: storage.iter().map(|(w, _)| w.clone()).collect(),
            params: params.0,
            grid,
        };
        if let Some(g) = lock(&self.bind_groups).get(&key) {
            return g.clone();
        }
        let n = variant.storage_bindings();
        let mut entries: Vec<wgpu::BindGroupEntry> = storage
            .iter()
            .enumerate()
            .map(|(i, (w, b))| wgpu::BindGroupEntry {
                binding: storage_slot(i),
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b,
                    offset: w.base,
                    size: wgpu::BufferSize::new(w.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: PARAMS_BINDING,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params.1,
                offset: 0,
                size: wgpu::BufferSize::new(PARAMS_SIZE),
            }),
        });
        if grid {
            entries.push(wgpu::BindGroupEntry {
                binding: GRID_BINDING,
                resource: self.grids.as_entire_binding(),
            });
        }
        let layouts = if grid {
            &self.grid_layouts
        } else {
            &self.layouts
        };
        let g = Arc::new(self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layouts[n].0,
            entries: &entries,
        }));
        lock(&self.bind_groups).insert(key, g.clone());
        g
    }

    /// The device's scratch buffer, grown to at least `bytes` (a power of two, at least
    /// [`SCRATCH_MIN`]): its id and the buffer. One buffer serves every launch that binds the
    /// scratch ([`crate::ops::Bind::scratch`]) on any of the device's backends: each node that
    /// uses it writes it and reads it back in consecutive launches, and all of the device's
    /// work runs in queue order. A larger one replaces it when asked for, and the recordings
    /// that bind the old one are forgotten (their work in flight keeps it alive until done).
    pub fn scratch(&self, bytes: u64) -> Result<(u64, wgpu::Buffer)> {
        let mut slot = lock(&self.scratch);
        if let Some((id, buffer)) = slot.as_ref() {
            if buffer.size() >= bytes {
                return Ok((*id, buffer.clone()));
            }
        }
        let size = bytes.next_power_of_two().max(SCRATCH_MIN);
        let buffer = self.new_buffer("tessera scratch", size, wgpu::BufferUsages::STORAGE)?;
        let id = self.next_id();
        self.allocated.fetch_add(size as usize, Ordering::Relaxed);
        if let Some((old, old_buffer)) = slot.replace((id, buffer.clone())) {
            self.allocated
                .fetch_sub(old_buffer.size() as usize, Ordering::Relaxed);
            self.forget_buffer(old);
        }
        Ok((id, buffer))
    }

    /// Forgets the bind groups and recordings that bind buffer `id` (it is being freed).
    pub fn forget_buffer(&self, id: u64) {
        self.forgets.fetch_add(1, Ordering::SeqCst);
        lock(&self.bind_groups)
            .retain(|k, _| k.params != id && k.windows.iter().all(|w| w.id != id));
        lock(&self.recordings).retain(|_, r| r.buffers.binary_search(&id).is_err());
    }

    /// The number of [`Gpu::forget_buffer`] calls so far.
    pub fn forget_count(&self) -> u64 {
        self.forgets.load(Ordering::SeqCst)
    }

    /// The recording made for `key`, if there is one.
    pub fn recording(&self, key: &GraphKey) -> Option<Arc<Recording>> {
        lock(&self.recordings)
            .get(&key.hash())
            .filter(|r| r.key == *key)
            .cloned()
    }

    /// Keeps a recording.
    pub fn keep_recording(&self, rec: Arc<Recording>) {
        let mut all = lock(&self.recordings);
        if all.len() >= MAX_RECORDINGS {
            all.clear();
        }
        all.insert(rec.key.hash(), rec);
    }
}

/// The bind group layout (and pipeline layout) with `n` storage bindings (at
/// [`storage_slot`]s) and the parameters, and with `grid` the lattice grids (read-only, at
/// [`GRID_BINDING`]).
fn make_layout(
    device: &wgpu::Device,
    n: usize,
    grid: bool,
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..n)
        .map(|i| wgpu::BindGroupLayoutEntry {
            binding: storage_slot(i),
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    entries.push(wgpu::BindGroupLayoutEntry {
        binding: PARAMS_BINDING,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: wgpu::BufferSize::new(PARAMS_SIZE),
        },
        count: None,
    });
    if grid {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: GRID_BINDING,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: true },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &entries,
    });
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    (bgl, pl)
}
