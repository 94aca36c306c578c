//! Microbenchmark: GFLOP/s of the quantized matmul per kernel path and thread count, against a
//! naive f32 loop over dequantized weights, on SmolLM2-135M shapes.
//!
//! `cargo run --release -p hearth-kernels --example kbench [-- --quick] [--only SUBSTRING]`
//!
//! Besides wall-clock microseconds per call, single-thread rows show the thread's own CPU time
//! per call (from `/proc/thread-self/schedstat`), which stays meaningful when other processes
//! share the cores.

use hearth_kernels::{matmul, GgmlType, KernelPath, QActs, QMatrix, ThreadPool};
use std::time::Instant;

fn rand_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect()
}

/// Random blocks with sane f16 scales.
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut b = rand_bytes(rows * ty.row_bytes(cols).unwrap(), seed);
    let bb = ty.block_bytes();
    let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for blk in b.chunks_exact_mut(bb) {
        match ty {
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&scale),
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&scale);
                blk[2..4].copy_from_slice(&scale);
            }
            _ => blk[0..2].copy_from_slice(&scale),
        }
    }
    b
}

/// Nanoseconds this thread has spent on a CPU (Linux), if readable.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    // (name, type, rows (outputs), cols (inputs))
    let shapes = [
        ("q_proj 576x576", GgmlType::Q4_1, 576, 576),
        ("gate+up 3072x576", GgmlType::Q4_1, 3072, 576),
        ("down 576x1536", GgmlType::Q4_1, 576, 1536),
        ("lm_head 49152x576", GgmlType::Q8_0, 49152, 576),
        ("q4_k 2048x640", GgmlType::Q4_K, 2048, 640 / 256 * 256 + 256),
        ("q5_k 2048x768", GgmlType::Q5_K, 2048, 768),
        ("q6_k 1024x768", GgmlType::Q6_K, 1024, 768),
        ("q5_0 1024x576", GgmlType::Q5_0, 1024, 576),
        ("q5_1 1024x576", GgmlType::Q5_1, 1024, 576),
        // Gemma 3 270M Q4_K_M: Q5_0 where a K-quant would not fit 640 columns, Q4_K where the
        // columns allow it, a slice of the 262144 x 640 Q8_0 head.
        ("g q5_0 2048x640", GgmlType::Q5_0, 2048, 640),
        ("g q4_k 640x1024", GgmlType::Q4_K, 640, 1024),
        ("g q4_k 640x2048", GgmlType::Q4_K, 640, 2048),
        ("g q8_0 16384x640", GgmlType::Q8_0, 16384, 640),
    ];
    println!(
        "{:<20} {:>4} {:>11} {:>3} {:>10} {:>9} {:>11}",
        "shape", "n", "path", "thr", "us/call", "GFLOP/s", "cpu-us/call"
    );
    for (name, ty, rows, cols) in shapes {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let bytes = matrix(ty, rows, cols, &mut seed);
        let w = QMatrix::from_ggml(ty, rows, cols, &bytes).unwrap();
        // The interleaved arrangement the AVX2 and VNNI paths get at load, where the shape
        // allows it; the plain one runs on the 4x4 tiles.
        let mut wil = QMatrix::for_ggml_on(ty, rows, cols, KernelPath::Avx512Vnni).unwrap();
        wil.pack_ggml_rows(0, &bytes).unwrap();
        let mut runs: Vec<(&str, &QMatrix, KernelPath)> = KernelPath::available()
            .into_iter()
            .map(|p| (p.name(), &w, p))
            .collect();
        for (label, path) in [
            ("avx2-il", KernelPath::Avx2),
            ("vnni-il", KernelPath::Avx512Vnni),
            ("amx-il", KernelPath::Amx),
        ] {
            if wil.interleaved() && path.is_available() {
                runs.push((label, &wil, path));
            }
        }
        // naive baseline: dequantized f32 weights, plain loop, one thread
        let mut wf = vec![0f32; rows * cols];
        let rb = ty.row_bytes(cols).unwrap();
        for r in 0..rows {
            hearth_kernels::dequantize_row(
                ty,
                &bytes[r * rb..(r + 1) * rb],
                &mut wf[r * cols..(r + 1) * cols],
            )
            .unwrap();
        }
        for n in [1usize, 8, 128] {
            if quick && n == 8 {
                continue;
            }
            let x: Vec<f32> = rand_bytes(n * cols, &mut seed)
                .iter()
                .map(|&b| b as f32 / 128.0 - 1.0)
                .collect();
            let flops = 2.0 * rows as f64 * cols as f64 * n as f64;
            let iters = ((2e9 / flops) as usize).clamp(2, 200) / if quick { 4 } else { 1 };
            let iters = iters.max(2);
            // naive (skip the huge prefill case: it takes seconds)
            if n == 1 {
                let mut out = vec![0f32; rows];
                let mut ts = Vec::new();
                for _ in 0..iters.min(20) {
                    let t = Instant::now();
                    for (r, o) in out.iter_mut().enumerate() {
                        *o = wf[r * cols..(r + 1) * cols]
                            .iter()
                            .zip(&x)
                            .map(|(a, b)| a * b)
                            .sum();
                    }
                    ts.push(t.elapsed().as_secs_f64());
                    std::hint::black_box(&out);
                }
                let t = median(ts);
                println!(
                    "{:<20} {:>4} {:>11} {:>3} {:>10.1} {:>9.2}",
                    name,
                    n,
                    "naive-f32",
                    1,
                    t * 1e6,
                    flops / t / 1e9
                );
            }
            let mut acts = QActs::new();
            acts.quantize(&x, n, cols).unwrap();
            let mut out = vec![0f32; rows * n];
            for threads in [1usize, 2] {
                let pool = ThreadPool::new(threads);
                for &(label, w, path) in &runs {
                    if path == KernelPath::Scalar && (n > 1 || quick) {
                        continue;
                    }
                    let mut ts = Vec::new();
                    matmul(path, w, &acts, &mut out, &pool).unwrap();
                    let cpu0 = thread_cpu_ns();
                    for _ in 0..iters {
                        let t = Instant::now();
                        matmul(path, w, &acts, &mut out, &pool).unwrap();
                        ts.push(t.elapsed().as_secs_f64());
                    }
                    let cpu = match (threads, cpu0, thread_cpu_ns()) {
                        (1, Some(a), Some(b)) => {
                            format!("{:.1}", (b - a) as f64 / 1e3 / iters as f64)
                        }
                        _ => "-".to_string(),
                    };
                    let t = median(ts);
                    println!(
                        "{:<20} {:>4} {:>11} {:>3} {:>10.1} {:>9.2} {:>11}",
                        name,
                        n,
                        label,
                        threads,
                        t * 1e6,
                        flops / t / 1e9,
                        cpu
                    );
                }
            }
        }
    }
}
