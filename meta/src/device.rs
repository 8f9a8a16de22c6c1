//! [`MetaDevice`]: a device made of other devices, of any kinds, that runs one graph as tensor
//! parallelism.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use tessera_core::backend::{Backend, Buffer, BufferType, Device, DeviceKind, Memory};
use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::tensor::{Tensor, TensorId};

use crate::backend::MetaBackend;
use crate::buffer::{MetaBuffer, MetaBufferType, Placed, ShardedTensor};
use crate::options::{MetaOptions, SplitMode};
use crate::plan::{self, InputPolicy};
use crate::ratio;
use crate::split::{normalize_ratios, partition_units, SplitState};

/// How work is divided among the parts.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitRatios {
    /// From each part's free memory and a short measured mat-vec benchmark (see
    /// [`crate::auto_ratios`]).
    Auto,
    /// Shares given by the caller, one per part (any positive scale; zero means the part holds
    /// empty slices).
    Given(Vec<f64>),
}

impl SplitRatios {
    /// Parses `auto` or a comma-separated list of shares (`0.6,0.4`, `3,1`).
    pub fn parse(s: &str) -> Result<SplitRatios> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("auto") {
            return Ok(SplitRatios::Auto);
        }
        let ratios = s
            .split(',')
            .map(|x| {
                x.trim().parse::<f64>().map_err(|_| {
                    Error::Invalid(format!(
                        "split ratio '{}' is not a number (write e.g. 0.6,0.4 or auto)",
                        x.trim()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SplitRatios::Given(ratios))
    }
}

/// What a meta device and its backends share.
pub(crate) struct Shared {
    pub parts: Vec<Arc<dyn Device>>,
    pub ratios: Vec<f64>,
    pub policy: InputPolicy,
    pub name: String,
    /// Partial results of at least this many bytes are all-reduced in bf16.
    pub bf16_above: Option<usize>,
    pub options: MetaOptions,
    /// How a model is divided over the parts: [`SplitMode::Tensor`] or [`SplitMode::Layer`],
    /// `Auto` resolved when the device was made.
    pub mode: SplitMode,
    /// Whether the ratios were given by the caller (else measured).
    pub ratios_given: bool,
    /// Each part's measured mat-vec throughput (bytes per second), measured on first need.
    pub speeds: OnceLock<Vec<f64>>,
}

impl Shared {
    /// Whether every part comes from one backend (`cuda:0`, `cuda:1`), so that the backend may
    /// offer a communicator over them.
    pub fn same_backend(&self) -> bool {
        let backend =
            |d: &Arc<dyn Device>| d.name().split(':').next().unwrap_or_default().to_string();
        self.parts
            .first()
            .is_some_and(|f| self.parts.iter().all(|p| backend(p) == backend(f)))
    }
}

/// A device made of N devices of any kinds (named `meta:<part>,<part>,...`). Its graphs run as
/// tensor parallelism: weights and caches are split by their registered states, computed
/// tensors by the per-op rules, and partial results are all-reduced (see [`crate`]).
#[derive(Clone)]
pub struct MetaDevice {
    shared: Arc<Shared>,
}

impl MetaDevice {
    /// A meta device over `parts` (at least one), dividing work by `ratios`, with the default
    /// [`MetaOptions`].
    pub fn new(parts: Vec<Arc<dyn Device>>, ratios: &SplitRatios) -> Result<MetaDevice> {
        MetaDevice::with_options(parts, ratios, MetaOptions::default())
    }

    /// A meta device over `parts` (at least one), dividing work by `ratios`, run as `options`
    /// say.
    ///
    /// Parts that run one graph together wait on each other, and a backend may compile its
    /// kernels differently for that (CUDA's early release of a kernel's successor): open such
    /// parts with their backend's options for a group (the facade's `meta_device` does).
    pub fn with_options(
        parts: Vec<Arc<dyn Device>>,
        ratios: &SplitRatios,
        options: MetaOptions,
    ) -> Result<MetaDevice> {
        if parts.is_empty() {
            return Err(Error::Invalid(
                "a meta device needs at least one part".into(),
            ));
        }
        let mode = resolve_mode(&parts, options.split_mode)?;
        if mode == SplitMode::Tensor {
            if let Some(m) = parts.iter().find(|p| p.kind() == DeviceKind::Meta) {
                return Err(Error::Invalid(format!(
                    "a tensor-parallel meta device cannot contain another meta device ({}): \
                     nest groups with the layer split mode",
                    m.name()
                )));
            }
        }
        let speeds = OnceLock::new();
        let ratios_given = matches!(ratios, SplitRatios::Given(_));
        let ratios = match ratios {
            SplitRatios::Given(r) => normalize_ratios(r, parts.len())?,
            SplitRatios::Auto => {
                let speed = if parts.len() > 1 {
                    ratio::measure_speeds(&parts)?
                } else {
                    vec![1.0; parts.len()]
                };
                let r = ratio::auto_ratios(&parts, &speed);
                let _ = speeds.set(speed);
                r
            }
        };
        let name = format!(
            "meta:{}",
            parts
                .iter()
                .map(|p| spec_name(p.as_ref()))
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(MetaDevice {
            shared: Arc::new(Shared {
                parts,
                ratios,
                policy: InputPolicy::Mirrored,
                name,
                bf16_above: None,
                options,
                mode,
                ratios_given,
                speeds,
            }),
        })
    }

    /// The meta device behind a `dyn Device`, if it is one.
    pub fn from_device(device: &dyn Device) -> Option<&MetaDevice> {
        device.as_any().downcast_ref::<MetaDevice>()
    }

    fn with(&self, change: impl FnOnce(&mut Shared)) -> MetaDevice {
        let s = &self.shared;
        let mut shared = Shared {
            parts: s.parts.clone(),
            ratios: s.ratios.clone(),
            policy: s.policy,
            name: s.name.clone(),
            bf16_above: s.bf16_above,
            options: s.options.clone(),
            mode: s.mode,
            ratios_given: s.ratios_given,
            speeds: s.speeds.clone(),
        };
        change(&mut shared);
        MetaDevice {
            shared: Arc::new(shared),
        }
    }

    /// The same parts and ratios with another policy for staged inputs.
    pub fn with_input_policy(&self, policy: InputPolicy) -> MetaDevice {
        self.with(|s| s.policy = policy)
    }

    /// The same device, all-reducing partial results of at least `min_bytes` bytes in bf16:
    /// each part casts its partial sum to bf16, the bf16 values are summed (in f32) and cast
    /// back. Half the bytes move, at bf16's precision (8 significant bits).
    pub fn with_bf16_reduce(&self, min_bytes: usize) -> MetaDevice {
        self.with(|s| s.bf16_above = Some(min_bytes))
    }

    /// Each part's share of the work (summing to 1).
    pub fn ratios(&self) -> &[f64] {
        &self.shared.ratios
    }

    /// How a model is divided over the parts: [`SplitMode::Tensor`] or [`SplitMode::Layer`]
    /// (the options' `Auto` resolved when the device was made: see [`SplitMode::Auto`]).
    pub fn split_mode(&self) -> SplitMode {
        self.shared.mode
    }

    /// Whether the ratios were given by the caller rather than measured.
    pub fn ratios_given(&self) -> bool {
        self.shared.ratios_given
    }

    /// Each part's mat-vec throughput in bytes per second: measured with the automatic
    /// ratios, or now (once) when the ratios were given.
    pub fn speeds(&self) -> Result<Vec<f64>> {
        if let Some(s) = self.shared.speeds.get() {
            return Ok(s.clone());
        }
        let s = if self.shared.parts.len() > 1 {
            ratio::measure_speeds(&self.shared.parts)?
        } else {
            vec![1.0; self.shared.parts.len()]
        };
        Ok(self.shared.speeds.get_or_init(|| s).clone())
    }

    /// The policy for staged inputs.
    pub fn input_policy(&self) -> InputPolicy {
        self.shared.policy
    }

    /// The options it runs with.
    pub fn options(&self) -> &MetaOptions {
        &self.shared.options
    }

    /// Divides `total` elements among the parts by the ratios, in whole units of `unit`
    /// elements (`what` names the dimension in errors).
    pub fn split_counts(&self, total: usize, unit: usize, what: &str) -> Result<Vec<usize>> {
        partition_units(total, unit, &self.shared.ratios, what)
    }

    /// A sharded buffer of virtual size `size` holding `tensors` at their offsets: every part
    /// gets one buffer of its own device with its slices, packed and aligned. Whole tensors are
    /// then written and read with [`Buffer::set`] and [`Buffer::get`] at their offsets (the
    /// slices are scattered and gathered), and graphs bind them as with any buffer.
    pub fn alloc_sharded(&self, size: usize, tensors: &[ShardedTensor]) -> Result<Arc<dyn Buffer>> {
        let parts = &self.shared.parts;
        let n = parts.len();
        let mut order: Vec<&ShardedTensor> = tensors.iter().collect();
        order.sort_by_key(|t| t.offset);
        let mut end = 0;
        for t in &order {
            let bytes = Tensor::contiguous_strides(t.dtype, t.ne)[3] * t.ne[3];
            let bad =
                |r: String| Error::Invalid(format!("sharded tensor at byte {}: {r}", t.offset));
            if t.offset < end {
                return Err(bad("it overlaps the tensor before it".into()));
            }
            end = t
                .offset
                .checked_add(bytes)
                .ok_or(Error::Overflow("sharded tensor end"))?;
            if end > size {
                return Err(bad(format!(
                    "it ends at {end}, past the buffer's {size} bytes"
                )));
            }
            t.state.check_fits(t.dtype, t.ne, n).map_err(bad)?;
            if t.state == SplitState::Partial && t.dtype != DType::F32 {
                return Err(bad("a partial tensor must be f32".into()));
            }
        }
        let mut placed: Vec<Placed> = tensors
            .iter()
            .map(|t| Placed {
                tensor: t.clone(),
                part_offsets: vec![0; n],
            })
            .collect();
        let mut bufs = Vec::with_capacity(n);
        for (j, dev) in parts.iter().enumerate() {
            let bt = dev.buffer_type();
            let align = bt.alignment().max(1);
            let mut used = 0usize;
            for p in placed.iter_mut() {
                let t = &p.tensor;
                let ne = crate::split::part_shape(t.ne, &t.state, j);
                let bytes = Tensor::contiguous_strides(t.dtype, ne)[3] * ne[3];
                let off = used.div_ceil(align) * align;
                p.part_offsets[j] = off;
                used = off + bytes;
            }
            if used > bt.max_size() {
                return Err(Error::OutOfMemory {
                    device: dev.name(),
                    bytes: used,
                });
            }
            bufs.push(bt.alloc(used.max(1))?);
        }
        Ok(Arc::new(MetaBuffer::sharded(
            self.shared.name.clone(),
            size,
            bufs,
            placed,
        )))
    }

    /// A stream over every part, as its concrete type (for [`MetaBackend::all_reduce`]).
    pub fn meta_backend(&self) -> Result<MetaBackend> {
        MetaBackend::new(self.shared.clone())
    }

    /// Checks that nodes `nodes` of `graph` can be split over the parts, as a run would: every
    /// state derives, or the error names the tensor and op that cannot be split.
    pub fn check(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let s = &self.shared;
        plan::check(graph, nodes, s.parts.len(), s.policy, &s.ratios, &s.name)
    }
}

/// A part's name as a spec writes it: a nested meta device in brackets (`[cpu,cpu]`).
fn spec_name(d: &dyn Device) -> String {
    let name = d.name();
    match name.strip_prefix("meta:") {
        Some(inner) if d.kind() == DeviceKind::Meta => format!("[{inner}]"),
        _ => name,
    }
}

/// The split mode `want` resolves to over `parts` (see [`SplitMode::Auto`]).
fn resolve_mode(parts: &[Arc<dyn Device>], want: SplitMode) -> Result<SplitMode> {
    if want != SplitMode::Auto {
        return Ok(want);
    }
    if parts.len() <= 1 {
        return Ok(SplitMode::Tensor);
    }
    if parts.iter().any(|p| p.kind() == DeviceKind::Meta) {
        return Ok(SplitMode::Layer);
    }
    if parts.iter().all(|p| p.kind() == DeviceKind::Cpu) {
        return Ok(SplitMode::Tensor);
    }
    let backend = |d: &Arc<dyn Device>| d.name().split(':').next().unwrap_or_default().to_string();
    let first = &parts[0];
    let like = parts
        .iter()
        .all(|p| backend(p) == backend(first) && p.description() == first.description());
    // Like GPUs pay off as tensor parallelism only where the backend sums over them without
    // the host (a communicator: peer copies, NCCL).
    let mode = if like && first.communicator(parts)?.is_some() {
        SplitMode::Tensor
    } else {
        SplitMode::Layer
    };
    log::info!(
        "split mode auto: {} over {}",
        mode.name(),
        parts.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
    );
    Ok(mode)
}

impl Device for MetaDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }

    fn description(&self) -> String {
        let parts: Vec<String> = self
            .shared
            .parts
            .iter()
            .zip(&self.shared.ratios)
            .map(|(p, r)| format!("{} {:.0}%", p.name(), r * 100.0))
            .collect();
        match self.shared.mode {
            // Measured ratios do not divide the layers: the fastest part takes what fits.
            SplitMode::Layer if !self.shared.ratios_given => format!(
                "layer split over {} (the fastest first, as much as fits)",
                self.shared
                    .parts
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SplitMode::Layer => format!("layer split over {}", parts.join(", ")),
            _ => format!("tensor parallel over {}", parts.join(", ")),
        }
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Meta
    }

    /// The parts' memory added up, each device counted once (two `cpu` parts share the host's).
    fn memory(&self) -> Memory {
        let mut seen: Vec<String> = Vec::new();
        self.shared.parts.iter().fold(Memory::default(), |m, p| {
            if seen.contains(&p.name()) {
                return m;
            }
            seen.push(p.name());
            let pm = p.memory();
            Memory {
                free: m.free.saturating_add(pm.free),
                total: m.total.saturating_add(pm.total),
            }
        })
    }

    fn buffer_type(&self) -> Arc<dyn BufferType> {
        let types: Vec<Arc<dyn BufferType>> =
            self.shared.parts.iter().map(|p| p.buffer_type()).collect();
        let alignment = types.iter().map(|t| t.alignment()).max().unwrap_or(64);
        let max_size = types
            .iter()
            .map(|t| t.max_size())
            .min()
            .unwrap_or(usize::MAX);
        Arc::new(MetaBufferType {
            name: self.shared.name.clone(),
            alignment,
            max_size,
        })
    }

    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(MetaBackend::new(self.shared.clone())?))
    }

    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        self.shared.parts.iter().all(|p| p.supports_op(graph, id))
    }

    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        match buffer.as_any().downcast_ref::<MetaBuffer>() {
            Some(m) if m.is_sharded() => {
                let bufs = m.part_buffers();
                bufs.len() == self.shared.parts.len()
                    && self
                        .shared
                        .parts
                        .iter()
                        .zip(bufs)
                        .all(|(p, b)| p.can_use_buffer(b.as_ref()))
            }
            Some(_) => true,
            None => buffer.is_host(),
        }
    }

    fn parts(&self) -> Vec<Arc<dyn Device>> {
        self.shared.parts.clone()
    }

    fn prepare(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        self.shared
            .parts
            .iter()
            .try_for_each(|p| p.prepare(&mut *progress))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
