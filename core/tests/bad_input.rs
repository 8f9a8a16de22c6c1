//! Bad graphs are errors that name the tensor and the reason, never panics.

use std::any::Any;
use std::sync::Arc;

use tessera_core::{Buffer, DType, Error, Graph, Result};

/// A plain host buffer for binding tests (the CPU backend's is not a dependency of core).
struct VecBuffer(std::sync::Mutex<Vec<u8>>);

impl Buffer for VecBuffer {
    fn name(&self) -> String {
        "vec".into()
    }
    fn size(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        self.0.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        out.copy_from_slice(&self.0.lock().unwrap()[offset..offset + out.len()]);
        Ok(())
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.0.lock().unwrap().fill(value);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn named(g: &mut Graph, name: &str, dtype: DType, ne: &[usize]) -> tessera_core::TensorId {
    let id = g.new_tensor(dtype, ne).unwrap();
    g.set_name(id, name)
}

fn says(e: Error, words: &[&str]) {
    let s = e.to_string();
    for w in words {
        assert!(s.contains(w), "error {s:?} should mention {w:?}");
    }
}

#[test]
fn mismatched_shapes_and_types() {
    let mut g = Graph::new();
    let a = named(&mut g, "a", DType::F32, &[64, 8]);
    let b = named(&mut g, "b", DType::F32, &[32, 8]);
    says(
        g.mul_mat(a, b).unwrap_err(),
        &["'a'", "MUL_MAT", "inner dims"],
    );
    let c = named(&mut g, "c", DType::F32, &[3, 8]);
    says(g.add(a, c).unwrap_err(), &["'c'", "ADD", "broadcast"]);
    let i = named(&mut g, "idx", DType::F32, &[4]);
    says(g.get_rows(a, i).unwrap_err(), &["'idx'", "GET_ROWS", "i32"]);
    let q = named(&mut g, "q", DType::Q4_0, &[64, 8]);
    says(g.mul_mat(a, q).unwrap_err(), &["'q'", "src1"]);
    says(
        g.rms_norm(q, 1e-5).unwrap_err(),
        &["'q'", "RMS_NORM", "f32"],
    );
}

#[test]
fn a_view_past_its_source() {
    let mut g = Graph::new();
    let a = named(&mut g, "a", DType::F32, &[16, 4]);
    says(
        g.view(a, &[16, 2], &[64], 3 * 64).unwrap_err(),
        &["'a'", "VIEW", "past"],
    );
    assert!(g.view(a, &[16, 2], &[64], 2 * 64).is_ok());
}

#[test]
fn a_reshape_that_changes_the_element_count() {
    let mut g = Graph::new();
    let a = named(&mut g, "a", DType::F32, &[16, 4]);
    says(
        g.reshape(a, &[10, 6]).unwrap_err(),
        &["'a'", "RESHAPE", "elements"],
    );
    let t = g.transpose(a).unwrap();
    says(g.reshape(t, &[64]).unwrap_err(), &["RESHAPE", "contiguous"]);
}

#[test]
fn a_quantized_row_that_is_not_whole_blocks() {
    let mut g = Graph::new();
    says(
        g.new_tensor(DType::Q4_0, &[33, 2]).unwrap_err(),
        &["q4_0", "blocks"],
    );
    says(
        DType::Q4_K.row_size(300).unwrap_err(),
        &["300", "q4_K", "256"],
    );
}

#[test]
fn a_buffer_too_small_for_its_tensors() {
    let mut g = Graph::new();
    let a = named(&mut g, "weights", DType::F32, &[16, 4]);
    let buf: Arc<dyn Buffer> = Arc::new(VecBuffer(std::sync::Mutex::new(vec![0; 100])));
    says(
        g.bind(a, buf.clone(), 0).unwrap_err(),
        &["'weights'", "256", "100"],
    );
    says(buf.set(90, &[0; 20]).unwrap_err(), &["vec", "past"]);
}

#[test]
fn shapes_whose_product_overflows_and_bad_params() {
    let mut g = Graph::new();
    says(
        g.new_tensor(DType::F32, &[usize::MAX / 2, 4]).unwrap_err(),
        &["too large"],
    );
    let a = named(&mut g, "a", DType::F32, &[16]);
    says(g.clamp(a, 2.0, 1.0).unwrap_err(), &["'a'", "CLAMP"]);
    says(g.permute(a, [0, 0, 1, 2]).unwrap_err(), &["'a'", "PERMUTE"]);
    says(g.arange(0.0, 1.0, 0.0).unwrap_err(), &["ARANGE"]);
    says(g.concat(a, a, 7).unwrap_err(), &["'a'", "CONCAT"]);
}
