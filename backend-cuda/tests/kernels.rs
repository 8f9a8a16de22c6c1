//! Every kernel file compiles with NVRTC (needs only libnvrtc, no GPU; skipped without it).

#[test]
fn kernels_compile_for_sm90() {
    match tessera_cuda::kernels::compile_all("sm_90") {
        Ok(files) => {
            for (f, size) in files {
                println!("kernels/{f}.cu: {size} bytes of sm_90 CUBIN");
            }
        }
        Err(e) if e == "libnvrtc not found" => eprintln!("skipped: {e}"),
        Err(e) => panic!("{e}"),
    }
}
