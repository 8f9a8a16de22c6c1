//! Buffers on the first wgpu adapter: unaligned set/get, copies, clears, and errors instead of
//! panics for sizes past the limits.

mod common;

use tessera_core::Error;

#[test]
fn unaligned_set_get_copy_clear() {
    let Some(dev) = common::device() else { return };
    let bt = dev.buffer_type();
    let a = bt.alloc(103).unwrap();
    let b = bt.alloc(103).unwrap();
    a.clear(0xab).unwrap();
    let mut out = vec![0u8; 103];
    a.get(0, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0xab));
    let data: Vec<u8> = (0..57u8).collect();
    a.set(5, &data).unwrap();
    a.get(0, &mut out).unwrap();
    assert!(out[..5].iter().all(|&x| x == 0xab));
    assert_eq!(&out[5..62], &data[..]);
    assert!(out[62..].iter().all(|&x| x == 0xab));
    let mut mid = vec![0u8; 3];
    a.get(6, &mut mid).unwrap();
    assert_eq!(mid, [1, 2, 3]);
    b.clear(0).unwrap();
    b.copy_from(8, a.as_ref(), 4, 64).unwrap();
    b.copy_from(1, a.as_ref(), 5, 2).unwrap();
    let mut got = vec![0u8; 103];
    b.get(0, &mut got).unwrap();
    assert_eq!(&got[8..72], &out[4..68]);
    assert_eq!(&got[1..3], &out[5..7]);
    assert!(a.set(100, &[0; 4]).is_err());
    assert!(a.get(101, &mut [0; 4]).is_err());
    assert!(dev.can_use_buffer(a.as_ref()));
    let mem = dev.memory();
    assert!(mem.total >= 1 << 20 && mem.free <= mem.total, "{mem:?}");
}

#[test]
fn too_large_is_an_error() {
    let Some(dev) = common::device() else { return };
    let bt = dev.buffer_type();
    match bt.alloc(usize::MAX / 2) {
        Err(Error::Buffer { .. } | Error::OutOfMemory { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("allocated usize::MAX / 2 bytes"),
    }
}

#[test]
fn async_writes_and_copies_are_ordered() {
    let Some(dev) = common::device() else { return };
    let bt = dev.buffer_type();
    let (a, b) = (bt.alloc(64).unwrap(), bt.alloc(64).unwrap());
    let mut backend = dev.new_backend().unwrap();
    let data: Vec<u8> = (0..64u8).collect();
    backend.set_async(a.as_ref(), 0, &data).unwrap();
    backend
        .copy_async(a.as_ref(), 8, b.as_ref(), 16, 32)
        .unwrap();
    backend.set_async(a.as_ref(), 1, &[200, 201]).unwrap();
    backend.copy_async(a.as_ref(), 0, b.as_ref(), 1, 3).unwrap();
    backend.synchronize().unwrap();
    let mut got = vec![0u8; 64];
    b.get(0, &mut got).unwrap();
    assert_eq!(&got[1..4], &[0, 200, 201]);
    assert_eq!(&got[16..48], &data[8..40]);
}
