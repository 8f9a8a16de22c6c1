//! The device, buffer and backend plumbing: registry entry, allocation, read-only host
//! buffers, range checks, and the errors for memory the CPU cannot use.

mod common;

use std::any::Any;
use std::sync::Arc;

use common::Case;
use tessera_core::{
    Backend, BackendReg, Buffer, BufferType, DType, Device, DeviceKind, Error, Graph,
};
use tessera_cpu::{CpuBackend, CpuBackendReg, CpuBuffer, CpuBufferType, CpuDevice, CpuOptions};

#[test]
fn registry_lists_one_cpu_device() {
    let devices = CpuBackendReg::new().devices().unwrap();
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    assert_eq!(d.name(), "cpu");
    assert_eq!(d.kind(), DeviceKind::Cpu);
    assert!(d.description().contains("threads"), "{}", d.description());
    let m = d.memory();
    assert!(m.free <= m.total);
    assert!(d.buffer_type().is_host());
    assert!(d.new_backend().is_ok());
    assert_eq!(CpuBackendReg::new().name(), "cpu");
}

#[test]
fn the_registry_entry_makes_its_device_with_its_options() {
    let two = CpuBackendReg::with_options(CpuOptions::default().with_threads(2).with_precise(true));
    let one = CpuBackendReg::with_options(CpuOptions::default().with_threads(1));
    let (two, one) = (two.devices().unwrap(), one.devices().unwrap());
    let cpu = |d: &Arc<dyn Device>| d.as_any().downcast_ref::<CpuDevice>().unwrap().clone();
    let (two, one) = (cpu(&two[0]), cpu(&one[0]));
    assert_eq!((two.threads(), two.precise()), (2, true));
    assert_eq!((one.threads(), one.precise()), (1, false));
    let all = CpuDevice::with_options(&CpuOptions::default());
    assert_eq!(all.threads(), CpuDevice::new().threads());
}

#[test]
fn threads_and_precise_are_settable() {
    let d = CpuDevice::new().with_threads(3).with_precise(true);
    assert_eq!((d.threads(), d.precise()), (3, true));
    let mut b = CpuBackend::new(1, false).unwrap();
    assert_eq!(b.threads(), 1);
    b.set_threads(2).unwrap();
    b.set_precise(true);
    assert_eq!((b.threads(), b.precise()), (2, true));
}

#[test]
fn buffers_are_aligned_and_range_checked() {
    let bt = CpuBufferType;
    assert_eq!(bt.alignment(), 64);
    let empty = bt.alloc(0).unwrap();
    assert_eq!(empty.size(), 0);
    let b = bt.alloc(100).unwrap();
    assert_eq!(b.host_ptr().unwrap() as usize % 64, 0);
    b.set(10, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 4];
    b.get(9, &mut out).unwrap();
    assert_eq!(out, [0, 1, 2, 3]);
    assert!(matches!(b.set(98, &[1, 2, 3]), Err(Error::Buffer { .. })));
    assert!(matches!(
        b.get(usize::MAX, &mut out),
        Err(Error::Buffer { .. })
    ));
    b.clear(7).unwrap();
    b.get(0, &mut out).unwrap();
    assert_eq!(out, [7; 4]);
    let c = bt.alloc(8).unwrap();
    c.copy_from(2, b.as_ref(), 0, 4).unwrap();
    assert!(c.copy_from(6, b.as_ref(), 0, 4).is_err());
    assert!(c.copy_from(0, b.as_ref(), 99, 4).is_err());
}

#[test]
fn an_impossible_allocation_is_out_of_memory() {
    let r = CpuBufferType.alloc(isize::MAX as usize / 2);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })));
}

#[test]
fn host_bytes_are_wrapped_read_only_without_copying() {
    let bytes: Arc<Vec<u8>> = Arc::new((0..16).collect());
    let dev = CpuDevice::new();
    let buf = dev.buffer_from_host(bytes.clone()).unwrap().unwrap();
    assert_eq!(buf.host_ptr().unwrap().cast_const(), bytes.as_ptr());
    assert_eq!(buf.size(), 16);
    let mut out = [0u8; 3];
    buf.get(5, &mut out).unwrap();
    assert_eq!(out, [5, 6, 7]);
    assert!(matches!(buf.set(0, &[1]), Err(Error::Buffer { .. })));
    assert!(buf.clear(0).is_err());
    assert!(buf
        .as_any()
        .downcast_ref::<CpuBuffer>()
        .unwrap()
        .is_read_only());
    assert!(dev.can_use_buffer(buf.as_ref()));
}

#[test]
fn weights_in_host_bytes_are_read_and_results_there_refused() {
    let vals = [1.0f32, 2.0, 3.0, 4.0];
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let buf = CpuDevice::new()
        .buffer_from_host(Arc::new(bytes))
        .unwrap()
        .unwrap();
    let mut c = Case::new();
    let w = c.g.weight("w", DType::F32, &[4], buf.clone(), 0).unwrap();
    let y = c.g.scale(w, 2.0).unwrap();
    assert_eq!(c.run(&[y]).unwrap()[0], vec![2.0, 4.0, 6.0, 8.0]);

    // A result bound into the read-only bytes is an error, not a write.
    let mut g = Graph::new();
    let w = g.weight("w", DType::F32, &[4], buf.clone(), 0).unwrap();
    let y = g.scale(w, 2.0).unwrap();
    g.bind(y, buf, 0).unwrap();
    let mut be = CpuBackend::new(1, false).unwrap();
    assert!(matches!(be.compute(&g, &[w, y]), Err(Error::Buffer { .. })));
}

/// Memory the CPU cannot read (like a GPU buffer).
struct DeviceOnly;

impl Buffer for DeviceOnly {
    fn name(&self) -> String {
        "fake-gpu".into()
    }
    fn size(&self) -> usize {
        1024
    }
    fn set(&self, _: usize, _: &[u8]) -> tessera_core::Result<()> {
        Ok(())
    }
    fn get(&self, _: usize, _: &mut [u8]) -> tessera_core::Result<()> {
        Ok(())
    }
    fn clear(&self, _: u8) -> tessera_core::Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn memory_that_is_not_host_memory_is_unsupported() {
    let mut g = Graph::new();
    let w = g
        .weight("w", DType::F32, &[4], Arc::new(DeviceOnly), 0)
        .unwrap();
    let y = g.scale(w, 2.0).unwrap();
    g.bind(y, CpuBufferType.alloc(16).unwrap(), 0).unwrap();
    assert!(!CpuDevice::new().can_use_buffer(&DeviceOnly));
    let mut be = CpuBackend::new(1, false).unwrap();
    assert!(matches!(
        be.compute(&g, &[y]),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn unbound_tensors_and_unsupported_types_are_errors() {
    let mut g = Graph::new();
    let a = g.new_tensor(DType::F32, &[4, 2]).unwrap();
    let m = g.argmax(a).unwrap();
    let mut be = CpuBackend::new(1, false).unwrap();
    assert!(matches!(be.compute(&g, &[m]), Err(Error::Buffer { .. })));
    let dev = CpuDevice::new();
    assert!(dev.supports_op(&g, m));
    g.get_mut(m).dtype = DType::Q4_0;
    assert!(!dev.supports_op(&g, m));
    assert!(matches!(
        be.compute(&g, &[m]),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn an_index_past_the_rows_is_an_error() {
    let mut c = Case::new();
    let a = c.input(DType::F32, &[2, 3], &[0.0; 6]);
    let i = c.ints(&[1], &[3]);
    let r = c.g.get_rows(a, i).unwrap();
    assert!(matches!(c.run(&[r]), Err(Error::Invalid(_))));
}
