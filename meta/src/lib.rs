//! tessera-meta: one graph over several devices of any kinds (CPU, CUDA, wgpu, in any mix) as
//! tensor parallelism.
//!
//! The crate sees only tessera-core's public API: its parts are `dyn Device`s, whatever
//! backend made them, and a backend knows nothing of it (a backend offers a [`Communicator`](tessera_core::Communicator)
//! through [`Device::communicator`], and that is all). [`MetaOptions`] holds its settings.
//!
//! # The model
//!
//! A [`MetaDevice`] is made of N *parts*, each a plain [`Device`]. It implements [`Device`]
//! itself (kind [`tessera_core::DeviceKind::Meta`], named `meta:<part>,<part>,...`), so the scheduler,
//! the model runner and the conformance suite use it like any other device. Every tensor of a
//! graph it runs has a [`SplitState`]:
//!
//! - **split** along one axis (0-3): each part holds a slice; the axis may be cut into
//!   segments that are split separately (a fused QKV weight: each part gets a slice of Q, of K
//!   and of V), and a segment may repeat;
//! - **mirrored**: each part holds all of it;
//! - **partial**: each part holds a tensor of the full shape and the value is their sum.
//!
//! Weights and caches get their states from the caller's policy when they are put in a
//! sharded buffer ([`MetaDevice::alloc_sharded`]); the model runner's policy is Megatron-style
//! tensor parallelism (column-parallel Q, K, V, gate and up; row-parallel attention output and
//! down; the rest mirrored). Every computed tensor's state is derived from its sources' by
//! per-op rules (`rules`): a mul_mat of a row-split weight gives a column-split result; one
//! whose weight and input are both split along the inner axis gives a partial result;
//! element-wise ops keep the split their sources agree on; row ops (rms_norm, soft_max) need
//! whole rows; rope and flash_attn_ext split by heads, keeping each KV head with its GQA group
//! of query heads; views, reshapes and permutes carry the split axis along. A graph whose states
//! cannot be derived is refused with an [`tessera_core::Error::Split`] naming the tensor, its op and the
//! reason, when it is planned ([`MetaDevice::check`], or the first run), never with an abort.
//!
//! # What differs from ggml's meta backend, and why
//!
//! ggml's meta backend (llama.cpp's `-sm tensor`) is the reference for the split-state rules.
//! tessera departs from it where the issue asked for better:
//!
//! - **Mirrored tensors are sliced for free.** When an op needs a source as a slice and that
//!   source is mirrored, each part reads it through a view of its own whole copy; ggml requires
//!   sources to already agree. This is what lets a graph mix mirrored activations with split
//!   weights without any rule for every combination, and what the rules use for masks and
//!   positions.
//! - **Partial results stay partial through linear ops** (scale, add of two partials, a
//!   mul_mat by a mirrored matrix, views) and are all-reduced only when a node needs the sum,
//!   so several partials can be summed once. ggml reduces right after each partial node.
//! - **Compute memory is per slice.** Each part plans and allocates its own graph at its
//!   sliced shapes, so no part holds full-size intermediates of split tensors; the meta
//!   buffers that graphs bind intermediates into are host memory that is only committed where
//!   something is written (inputs and read-back results).
//! - **Mixed device kinds overlap their transfers.** The generic all-reduce moves the tensor in
//!   chunks through host memory with every backend's async copies, adding one chunk while the
//!   parts copy out the next (the `reduce` module); a backend communicator (NCCL for CUDA, from
//!   [`Device::communicator`]) replaces it when every part comes from one backend and offers one.
//! - **Ratios are rounded to whole units** (quantization blocks, heads with their GQA group) by
//!   largest remainders, and chosen automatically from a measured mat-vec benchmark limited by
//!   free memory when not given ([`SplitRatios::Auto`]).
//! - **Nothing aborts**: a part may hold an empty slice (a partial node it has no share of is
//!   filled with zeros), and everything that cannot be split is an error.
//!
//! # Running
//!
//! [`MetaBackend`]'s [`compute`](tessera_core::Backend::compute) plans a graph once (`plan`):
//! states, one graph per part with sliced shapes, stages cut at the all-reduces, and the
//! transfers of inputs and results. It keeps a few plans and finds them again by comparing the
//! graph's structure and bindings. A run uploads staged inputs' slices, runs the stages on every
//! part with the all-reduces between them, and gathers the results the caller reads back.
//!
//! A meta device of one part runs the part's own kernels on the same graph with two extra
//! copies per run (the inputs in, the read-back results out); nothing is split or reduced.

mod backend;
mod buffer;
mod device;
mod experts;
mod layers;
mod options;
mod plan;
mod ratio;
mod reduce;
mod rules;
mod split;
mod submit;

use std::sync::Arc;

pub use backend::MetaBackend;
pub use buffer::{MetaBuffer, MetaBufferType, ShardedTensor};
pub use device::{MetaDevice, SplitRatios};
pub use layers::{plan_layers, LayerCosts, LayerPart, LayerPlan, LayerShares};
pub use options::{AllReducePath, MetaOptions, SplitMode};
pub use plan::InputPolicy;
pub use ratio::{auto_ratios, measure_matvec, measure_speeds, water_fill};
pub use reduce::ReduceBreakdown;
pub use split::{
    byte_chunks, normalize_ratios, part_shape, partition, partition_units, AxisSplit, Interval,
    Segment, SplitState,
};

use tessera_core::backend::Device;
use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::sched::SchedPlan;

/// The part specs of a meta device spec: `meta:cpu,wgpu:0` (or just `cpu,wgpu:0`) gives
/// `["cpu", "wgpu:0"]`; a group in brackets is a nested meta device, given back as its own
/// spec (`meta:[cuda:0,cuda:1],cpu` gives `["meta:cuda:0,cuda:1", "cpu"]`). An empty part or
/// unbalanced brackets are an error.
pub fn parse_spec(spec: &str) -> Result<Vec<String>> {
    let list = spec.trim();
    let list = list.strip_prefix("meta:").unwrap_or(list);
    let bad = |why: &str| Error::Invalid(format!("meta device spec '{spec}' {why}"));
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut push = |piece: &str| -> Result<()> {
        let piece = piece.trim();
        let part = match piece.strip_prefix('[') {
            Some(inner) => {
                let inner = inner
                    .strip_suffix(']')
                    .ok_or_else(|| bad("has text after a closing bracket"))?;
                format!("meta:{inner}")
            }
            None => piece.to_string(),
        };
        if part.is_empty() || part == "meta:" {
            return Err(bad("has an empty part (write meta:cpu,cuda:0)"));
        }
        parts.push(part);
        Ok(())
    };
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| bad("closes a bracket it did not open"))?
            }
            ',' if depth == 0 => {
                push(&list[start..i])?;
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("leaves a bracket open"));
    }
    push(&list[start..])?;
    Ok(parts)
}

/// Checks every split of a scheduler plan that runs on a meta device: the graph must split
/// ([`MetaDevice::check`]).
pub fn check_plan(devices: &[Arc<dyn Device>], graph: &Graph, plan: &SchedPlan) -> Result<()> {
    for split in &plan.splits {
        if let Some(m) = devices
            .get(split.device)
            .and_then(|d| MetaDevice::from_device(d.as_ref()))
        {
            m.check(graph, &split.nodes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_spec;

    #[test]
    fn specs_with_nested_groups_parse() {
        assert_eq!(parse_spec("meta:cpu,wgpu:0").unwrap(), ["cpu", "wgpu:0"]);
        assert_eq!(parse_spec("cpu, cuda:0").unwrap(), ["cpu", "cuda:0"]);
        assert_eq!(
            parse_spec("meta:[cuda:0,cuda:1],cpu").unwrap(),
            ["meta:cuda:0,cuda:1", "cpu"]
        );
        assert_eq!(
            parse_spec("meta:cpu,[cpu,[cpu,cpu]]").unwrap(),
            ["cpu", "meta:cpu,[cpu,cpu]"]
        );
        for bad in [
            "meta:cpu,,cpu",
            "meta:[cpu,cpu",
            "meta:cpu]",
            "meta:[]",
            "meta:[cpu]x",
        ] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
