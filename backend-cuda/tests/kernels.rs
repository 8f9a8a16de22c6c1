//! Every kernel file compiles with NVRTC (needs only libnvrtc, no GPU; skipped without it), and
//! every kernel entry point starts with `pdl_wait();` (a scan of the sources; needs nothing).

use std::collections::BTreeSet;
use std::path::Path;

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

/// The source with comments blanked out (newlines kept, so that positions still name lines).
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            out.extend(
                src[i..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else if b[i] == b'"' {
            // A string literal (asm text): copied as it is, skipping escaped characters.
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            out.push_str(&src[start..i]);
        } else {
            let c = src[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Byte offsets where `word` occurs as a whole identifier.
fn word_at(text: &str, word: &str) -> Vec<usize> {
    let b = text.as_bytes();
    text.match_indices(word)
        .map(|(i, _)| i)
        .filter(|&i| {
            (i == 0 || !is_ident(b[i - 1])) && b.get(i + word.len()).is_none_or(|&c| !is_ident(c))
        })
        .collect()
}

/// The `#define` line (with its continuation lines) that contains offset `at`, as the macro's
/// name and the range of the definition's text, if `at` is inside one.
fn define_around(text: &str, at: usize) -> Option<(String, usize, usize)> {
    // Start of the logical line: go back over lines that the previous one continues.
    let mut start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    while start > 0
        && text[..start - 1]
            .trim_end_matches([' ', '\t'])
            .ends_with('\\')
    {
        start = text[..start - 1].rfind('\n').map_or(0, |n| n + 1);
    }
    let rest = text[start..].trim_start();
    let rest = rest
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("define")?;
    let name: String = rest
        .trim_start()
        .bytes()
        .take_while(|&c| is_ident(c))
        .map(char::from)
        .collect();
    let mut end = start;
    loop {
        let line_end = text[end..].find('\n').map_or(text.len(), |n| end + n);
        if !text[end..line_end].trim_end().ends_with('\\') || line_end == text.len() {
            end = line_end;
            break;
        }
        end = line_end + 1;
    }
    Some((name, start, end))
}

/// Checks a set of kernel sources (name, text): every entry point (a `__global__` function,
/// written directly or through a macro that expands to `__global__`, such as `KERNEL`) must
/// have `pdl_wait();` as the first statement of its body. Returns the entry points found (by
/// file and line) or the list of offenders.
fn check_pdl_wait(files: &[(String, String)]) -> Result<Vec<String>, Vec<String>> {
    let texts: Vec<(&str, String)> = files
        .iter()
        .map(|(n, s)| (n.as_str(), strip_comments(s)))
        .collect();
    // Markers: `__global__` and, to a fixed point, every macro that stands for the start of
    // an entry point's declaration (a definition holding a marker and no body). A macro whose
    // definition holds whole entry points (`{` included) is checked where it is defined.
    let mut markers: BTreeSet<String> = BTreeSet::from(["__global__".to_string()]);
    loop {
        let mut grew = false;
        for (_, t) in &texts {
            for m in markers.clone() {
                for at in word_at(t, &m) {
                    if let Some((name, start, end)) = define_around(t, at) {
                        if name != m && !t[start..end].contains('{') && markers.insert(name) {
                            grew = true;
                        }
                    }
                }
            }
        }
        if !grew {
            break;
        }
    }
    let mut found = Vec::new();
    let mut bad = Vec::new();
    for (file, t) in &texts {
        for m in &markers {
            for at in word_at(t, m) {
                // A marker in the definition of a marker macro is not an entry point itself.
                if let Some((name, ..)) = define_around(t, at) {
                    if markers.contains(&name) {
                        continue;
                    }
                }
                let line = t[..at].matches('\n').count() + 1;
                let here = format!("{file}:{line}");
                let (Some(brace), semi) = (t[at..].find('{'), t[at..].find(';')) else {
                    bad.push(format!("{here}: {m} without a body"));
                    continue;
                };
                if semi.is_some_and(|s| s < brace) {
                    bad.push(format!(
                        "{here}: {m} declaration without a body (define entry points in place)"
                    ));
                    continue;
                }
                // The body's first statement, skipping blanks and macro line continuations.
                let body = t[at + brace + 1..].trim_start_matches([' ', '\t', '\n', '\r', '\\']);
                // pdl_wait_later(): the kernel waits further on, after reads of memory no kernel
                // writes (mmvq.cu's early weights); its file must call pdl_wait() somewhere.
                let later = body.starts_with("pdl_wait_later();") && t.contains("pdl_wait();");
                if body.starts_with("pdl_wait();") || later {
                    found.push(here);
                } else {
                    let first: String =
                        body.lines().next().unwrap_or("").chars().take(40).collect();
                    bad.push(format!(
                        "{here}: the entry point's body starts with `{first}`, not `pdl_wait();`"
                    ));
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(found)
    } else {
        Err(bad)
    }
}

/// Every `.cu` and `.cuh` file of `kernels/`.
fn kernel_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu" || x == "cuh"))
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect();
    files.sort();
    files
}

/// Programmatic dependent launch (on sm_90 and later) lets a kernel start before the one
/// before it finished; only `pdl_wait()` (common.cuh) makes it wait for that kernel's results,
/// so every entry point must call it before anything else.
#[test]
fn kernel_entry_points_wait_first() {
    let files = kernel_sources();
    assert!(
        files.iter().any(|(n, _)| n == "common.cuh"),
        "kernels/common.cuh not found"
    );
    let common = &files.iter().find(|(n, _)| n == "common.cuh").unwrap().1;
    let common = strip_comments(common);
    assert!(
        common.contains("void pdl_wait()") && common.contains("griddepcontrol.wait;"),
        "common.cuh must define pdl_wait() with griddepcontrol.wait"
    );
    match check_pdl_wait(&files) {
        Ok(found) => {
            // Guards against a scan that silently finds nothing (about 90 entry points, most
            // of them instantiated several times through macros).
            assert!(found.len() >= 80, "only {} entry points found", found.len());
            println!("{} entry points start with pdl_wait()", found.len());
        }
        Err(bad) => panic!(
            "kernel entry points that do not start with pdl_wait();\n{}",
            bad.join("\n")
        ),
    }
}

/// The scan itself catches a forgotten wait, in a plain entry point, one written through a
/// macro, and one behind a prototype, and accepts the forms the kernels use.
#[test]
fn pdl_scan_catches_a_missing_wait() {
    let common = "#define KERNEL extern \"C\" __global__ void\n".to_string();
    let case = |body: &str| {
        check_pdl_wait(&[
            ("common.cuh".into(), common.clone()),
            ("t.cu".into(), body.to_string()),
        ])
    };
    // Accepted.
    let ok = case(concat!(
        "KERNEL a(const KParams p) {\n    pdl_wait();\n    f(p);\n}\n",
        "KERNEL b(const KParams p) { pdl_wait(); f(p); }\n",
        "#define M(n) \\\n    KERNEL m_##n(const KParams p) { pdl_wait(); f<n>(p); } \\\n",
        "    KERNEL m2_##n(const KParams p) {    \\\n        pdl_wait(); f<n>(p); }\n",
        "#define K2 extern \"C\" __global__ void __launch_bounds__(128)\n",
        "K2 c(const KParams p) { // comment\n    pdl_wait();\n}\n",
        "KERNEL d(const KParams p) { pdl_wait_later(); f(p); }\n",
    ));
    assert_eq!(ok.map(|f| f.len()), Ok(6));
    // Rejected.
    for bad in [
        "KERNEL a(const KParams p) {\n    const float x = p.f[0];\n    pdl_wait();\n}\n",
        "KERNEL b(const KParams p) { f(p); }\n",
        "#define M(n) \\\n    KERNEL m_##n(const KParams p) { f<n>(p); }\n",
        "#define K2 extern \"C\" __global__ void __launch_bounds__(128)\nK2 c(const KParams p) { f(p); }\n",
        "extern \"C\" __global__ void d(const KParams p) { /* pdl_wait(); */ f(p); }\n",
        "KERNEL e(const KParams p);\n",
        "KERNEL f(const KParams p) { pdl_wait_later(); f(p); }\n",
    ] {
        assert!(case(bad).is_err(), "not caught:\n{bad}");
    }
}
