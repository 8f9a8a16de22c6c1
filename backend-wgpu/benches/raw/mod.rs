//! Plain wgpu, without tessera, for the benchmarks that measure what the adapter itself gives
//! (`coop_peak`, `read_peak`): a device, and a pipeline from WGSL.

/// A device on the first Vulkan adapter that has `features` (opened with them and the
/// adapter's limits; experimental features where cooperative matrices are asked for), or
/// `None` (printed as skipped).
pub fn open(features: wgpu::Features) -> Option<(wgpu::Device, wgpu::Queue)> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc.with_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    let Some(adapter) = adapters
        .into_iter()
        .find(|a| a.features().contains(features))
    else {
        println!("skipped: no adapter with {features:?}");
        return None;
    };
    println!("adapter: {}", adapter.get_info().name);
    let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: a benchmark of the experimental feature itself, on shaders naga validates.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    };
    let device = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: None,
        required_features: features,
        required_limits: adapter.limits(),
        experimental_features: experimental,
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .expect("device");
    Some(device)
}

/// The pipeline of entry point `main` of WGSL `source`, built as a trusted module (no runtime
/// bounds checks, as tessera builds its own), with the layout derived from the shader.
pub fn pipeline(device: &wgpu::Device, source: &str) -> wgpu::ComputePipeline {
    // SAFETY: the benchmarks' shaders index only within their arrays (checked by reading them).
    let module = unsafe {
        device.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl(source.into()),
            },
            wgpu::ShaderRuntimeChecks::unchecked(),
        )
    };
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}
