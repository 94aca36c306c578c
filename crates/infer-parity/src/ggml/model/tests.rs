use super::*;

#[test]
fn horizontal_sums_add_in_the_avx_order() {
    // 2^24 + 1 rounds to 2^24: the grouping decides whether the two ones survive.
    let big = 16_777_216f32;
    let seq = |v: &[f32]| v.iter().fold(0f32, |s, &x| s + x);
    let mut v = [0f32; 8];
    v[0] = big;
    v[1] = 1.0;
    v[5] = 1.0;
    // (0 + 4) + (2 + 6) = big, (1 + 5) + (3 + 7) = 2.
    assert_eq!(hsum8(&v), big + 2.0);
    assert_eq!(seq(&v), big);
    let mut w = [0f32; 16];
    w[0] = big;
    w[1] = 1.0;
    w[9] = 1.0;
    assert_eq!(reduce16(&w), big + 2.0);
    assert_eq!(seq(&w), big);
}

#[test]
fn q8_quantization_rounds_half_to_even_and_stores_f16_scales() {
    let mut x = [0f32; 32];
    x[0] = 127.0; // amax 127: id = 1, d = 1
    x[1] = 2.5;
    x[2] = 3.5;
    x[3] = -2.5;
    x[4] = 0.1;
    let mut b = [Q8_ZERO];
    quantize_row_q8(&x, true, &mut b);
    assert_eq!(&b[0].q[..5], &[127, 2, 4, -2, 0]);
    assert_eq!(b[0].d, 1.0);
    assert_eq!(b[0].s, 131.0);
    // d = amax / 127 rounded to f16; the multiplier is 127 / amax, not 1 / d.
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.01).collect();
    quantize_row_q8(&x, false, &mut b);
    assert_eq!(b[0].d, round_f16(x[31] / 127.0));
    assert_eq!(b[0].q[31], 127);
    assert_eq!(b[0].s, 0.0);
    quantize_row_q8(&[0.0; 32], true, &mut b);
    assert_eq!((b[0].d, b[0].s, b[0].q), (0.0, 0.0, [0; 32]));
}

#[test]
fn q4_1_dot_is_lanes_of_four_plus_the_min_term() {
    // One block: d = 2, m = 0.5, every nibble 3 (low and high); activations q = 1, d = 1,
    // s = 32.
    let mut blk = vec![0u8; Q4_1_BYTES];
    blk[0..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
    blk[2..4].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
    blk[4..].fill(0x33);
    let a = [Q8Block {
        d: 1.0,
        s: 32.0,
        q: [1; 32],
    }];
    // 8 lanes of 2 * (4 * 3) = 24, summed: 192; plus 0.5 * 32.
    assert_eq!(dot_q4_1_q8_1(&blk, &a), 192.0 + 16.0);
    // Nibble order: byte k holds element k (low) and k + 16 (high).
    blk[4..].fill(0x01);
    let mut a2 = a;
    a2[0].q = [0; 32];
    a2[0].q[16] = 1;
    a2[0].s = 0.0;
    assert_eq!(dot_q4_1_q8_1(&blk, &a2), 0.0);
    a2[0].q[0] = 1;
    assert_eq!(dot_q4_1_q8_1(&blk, &a2), 2.0);
}

#[test]
fn q8_0_dot_uses_signed_weights() {
    let mut blk = vec![0u8; Q8_0_BYTES];
    blk[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
    for (i, q) in blk[2..].iter_mut().enumerate() {
        *q = if i % 2 == 0 { 2 } else { (-3i8) as u8 };
    }
    let a = [Q8Block {
        d: 2.0,
        s: 0.0,
        q: [1; 32],
    }];
    // 16 * (2 - 3) * 0.5 * 2
    assert_eq!(dot_q8_0_q8_0(&blk, &a), -16.0);
}

#[test]
fn f32_dots_fuse_and_group_like_ggml() {
    let x: Vec<f32> = (0..128).map(|i| (i % 7) as f32 - 3.0).collect();
    let y: Vec<f32> = (0..128).map(|i| (i % 5) as f32 * 0.5).collect();
    let exact: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    // Small integers and halves: every order is exact.
    assert_eq!(dot_f32(&x, &y), exact);
    assert_eq!(dot_f32_tinyblas(&x, &y), exact);
    // Element 0 and element 64 share a lane of the same accumulator in ggml_vec_dot_f32
    // (fused: 1 + 2^-30 survives before the -1), while tinyBLAS adds element 16 there too.
    let mut a = vec![0f32; 64 * 2];
    let mut b = vec![0f32; 64 * 2];
    a[0] = 1.0;
    b[0] = 1.0;
    a[64] = 1.0;
    b[64] = 2f32.powi(-30);
    a[16] = -1.0;
    b[16] = 1.0;
    // vec_dot: lane 0 of acc 0 = 1 + 2^-30 -> rounds to 1; acc 1 lane 0 = -1; sum 0.
    assert_eq!(dot_f32(&a, &b), 0.0);
    // tinyBLAS: one accumulator, lane 0: 1, then -1 -> 0, ..., then + 2^-30.
    assert_eq!(dot_f32_tinyblas(&a, &b), 2f32.powi(-30));
}

/// Deterministic bytes and activations for the block tests.
fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*seed >> 33) as u32
}

fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

#[test]
fn q5_0_weights_take_the_fifth_bit_from_qh() {
    let mut b = [0u8; Q5_0_BYTES];
    b[2..6].copy_from_slice(&(1u32 | (1 << 17)).to_le_bytes());
    b[6] = 0x3f; // element 0: 15 | 16 = 31 -> 15; element 16: 3 -> -13
    b[7] = 0x21; // element 1: 1 -> -15; element 17: 2 | 16 = 18 -> 2
    let w = decode_q5_0(&b);
    assert_eq!((w[0], w[16], w[1], w[17], w[2]), (15, -13, -15, 2, -16));
}

/// The K-quant dots (each kernel's accumulation) agree with the plain f64 dot of the
/// dequantized weights and activations.
#[test]
fn k_quant_dots_match_the_dequantized_dot() {
    let mut seed = 7;
    let x = activations(512, &mut seed);
    let mut a = [Q8K_ZERO; 2];
    quantize_row_q8_k(&x, &mut a);
    let deq_a: Vec<f64> = a
        .iter()
        .flat_map(|b| b.q.iter().map(move |&q| f64::from(b.d) * f64::from(q)))
        .collect();
    assert!(a.iter().all(|b| b.q.contains(&-127)));
    for (bi, b) in a.iter().enumerate() {
        for (j, s) in b.bsums.iter().enumerate() {
            let want: i32 = b.q[16 * j..16 * j + 16].iter().map(|&q| i32::from(q)).sum();
            assert_eq!(*s, want, "block {bi} bsum {j}");
        }
    }
    let close = |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0);

    // Q4_K: d, dmin, scales/mins < 32 in the simple 6-bit layout, random nibbles.
    let mut row = vec![0u8; 2 * Q4_K_BYTES];
    for blk in row.chunks_exact_mut(Q4_K_BYTES) {
        blk[0..2].copy_from_slice(&f16::from_f32(0.01).to_bits().to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(0.02).to_bits().to_le_bytes());
        for v in blk[4..12].iter_mut() {
            *v = (lcg(&mut seed) % 32) as u8;
        }
        for v in blk[12..16].iter_mut() {
            *v = (lcg(&mut seed) % 16) as u8 | ((lcg(&mut seed) % 16) as u8) << 4;
        }
        for v in blk[16..].iter_mut() {
            *v = lcg(&mut seed) as u8;
        }
    }
    let mut want = 0f64;
    for (blk, ab) in row.chunks_exact(Q4_K_BYTES).zip(deq_a.chunks_exact(256)) {
        for (e, &av) in ab.iter().enumerate() {
            let j = e / 32;
            let (sc, m) = q4_k_scale_min(j, &blk[4..16]);
            let q = (blk[16 + 32 * (j / 2) + e % 32] >> (4 * (j % 2))) & 15;
            let w = f64::from(f16_at(&blk[0..2])) * f64::from(sc) * f64::from(q)
                - f64::from(f16_at(&blk[2..4])) * f64::from(m);
            want += w * av;
        }
    }
    assert!(close(dot_q4_k_q8_k(&row, &a, false), want));
    assert!(close(dot_q4_k_q8_k(&row, &a, true), want));

    // Q6_K: random codes and scales.
    let mut row = vec![0u8; 2 * Q6_K_BYTES];
    for blk in row.chunks_exact_mut(Q6_K_BYTES) {
        for v in blk[..192].iter_mut() {
            *v = lcg(&mut seed) as u8;
        }
        for v in blk[192..208].iter_mut() {
            *v = (lcg(&mut seed) % 61) as u8;
        }
        blk[208..210].copy_from_slice(&f16::from_f32(0.003).to_bits().to_le_bytes());
    }
    let mut want = 0f64;
    for (blk, ab) in row.chunks_exact(Q6_K_BYTES).zip(deq_a.chunks_exact(256)) {
        let q = decode_q6_k(blk);
        for (e, &av) in ab.iter().enumerate() {
            let w = f64::from(f16_at(&blk[208..210]))
                * f64::from(blk[192 + e / 16] as i8)
                * (f64::from(q[e]) - 32.0);
            want += w * av;
        }
    }
    assert!(close(dot_q6_k_q8_k(&row, &a), want));
    assert!(close(dot_q6_k_tiled(&row, &a), want));
}

#[test]
fn geglu_uses_the_f16_gelu_table_and_saturates() {
    let t = gelu_table();
    assert_eq!(geglu(0.0, 3.0, t), 0.0);
    assert_eq!(geglu(-10.0, 3.0, t), 0.0);
    assert_eq!(geglu(12.0, 0.5, t), 6.0);
    let g = geglu(1.0, 1.0, t);
    assert_eq!(g, round_f16(g));
    assert!((g - 0.841_192).abs() < 1e-3, "{g}");
}

#[test]
fn vectorised_exp_is_close_to_exp_and_saturates() {
    assert_eq!(v_expf(0.0), 1.0);
    assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
    assert_eq!(v_expf(-200.0), 0.0);
    assert_eq!(v_expf(200.0), f32::INFINITY);
    for i in -1000..=800 {
        let x = i as f32 * 0.1;
        let want = (x as f64).exp();
        let got = v_expf(x) as f64;
        assert!(
            (got - want).abs() <= 4.0 * want * f32::EPSILON as f64 || want < 1e-37,
            "exp({x}) = {got}, want {want}"
        );
    }
    // Subnormal results are rounded once.
    assert!(v_expf(-100.0) > 0.0 && v_expf(-100.0) < f32::MIN_POSITIVE);
    assert!((v_silu(1.0) - 0.731_058_6).abs() < 1e-6);
}

#[test]
fn softmax_weights_sum_to_one_and_masked_positions_are_zero() {
    let kq = [1.0f32, 2.0, 3.0];
    let mut w = [9f32; 16];
    soft_max(&kq, 0.5, &mut w);
    assert!(w[3..].iter().all(|&v| v == 0.0));
    let s: f32 = w.iter().sum();
    assert!((s - 1.0).abs() < 1e-6);
    assert!(w[2] > w[1] && w[1] > w[0]);
}

#[test]
fn rms_norm_and_rope_basics() {
    let x = [3.0f32, 4.0];
    let mut out = [0f32; 2];
    rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
    let r = 1.0f32 / 12.5f32.sqrt();
    assert_eq!(out, [3.0 * r, 4.0 * r * 2.0]);
    let mut cache = [(0f32, 0f32); 2];
    rope_cache(0, 0.5, &mut cache);
    assert_eq!(cache, [(1.0, 0.0), (1.0, 0.0)]);
    rope_cache(2, 0.5, &mut cache);
    assert_eq!(cache[1], (1f32.cos(), 1f32.sin()));
    let mut v = [1.0f32, 0.0, 0.0, 1.0];
    let quarter = [(0.0f32, 1.0f32), (0.0, 1.0)];
    rope_normal(&mut v, &quarter);
    assert_eq!(v, [0.0, 1.0, -1.0, 0.0]);
}

fn read_f32(path: &Path) -> Option<Vec<f32>> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// (elements whose bits differ, largest difference) over the common tail of two tensors
/// (llama.cpp keeps only the output row in the last layer after attention).
fn compare(got: &[f32], want: &[f32]) -> (usize, f32) {
    let n = got.len().min(want.len());
    let (g, w) = (&got[got.len() - n..], &want[want.len() - n..]);
    g.iter().zip(w).fold((0, 0f32), |(c, m), (a, b)| {
        if a.to_bits() == b.to_bits() {
            (c, m)
        } else {
            (c + 1, m.max((a - b).abs()))
        }
    })
}

/// Prints each tapped tensor against llama.cpp's dump of the same name.
struct DumpTap {
    dir: std::path::PathBuf,
    first_diff: Option<String>,
}

impl Tap for DumpTap {
    fn tap(&mut self, name: &str, il: Option<usize>, data: &[f32]) {
        let file = match il {
            Some(il) => format!("{name}-{il}.f32"),
            None => format!("{name}.f32"),
        };
        let Some(want) = read_f32(&self.dir.join(&file)) else {
            println!("{file}: not in the dump");
            return;
        };
        let (n, max) = compare(data, &want);
        println!(
            "{file}: {n} of {} differ (max {max:e})",
            data.len().min(want.len())
        );
        if n > 0 && self.first_diff.is_none() {
            self.first_diff = Some(file);
            if let Ok(w) = std::env::var("HEARTH_LCDUMP_ROW") {
                let w: usize = w.parse().unwrap();
                let per: Vec<usize> = data
                    .chunks(w)
                    .zip(want.chunks(w))
                    .map(|(a, b)| compare(a, b).0)
                    .collect();
                println!("  per row: {per:?}");
            }
        }
    }
}

/// Steps along one SmolLM2 (or, with HEARTH_LCDUMP_MODEL=gemma3, Gemma 3) fixture case (prompt, then `N` of llama.cpp's ids) and compares
/// the logits of every step, and the tensors of step `CALL`, with a dump made by
/// `scripts/parity/lcdump.sh DIR CALL CASE N` (env HEARTH_LCDUMP=DIR, HEARTH_LCDUMP_CALL,
/// HEARTH_LCDUMP_CASE, HEARTH_LCDUMP_N; run with --nocapture to see each tensor;
/// HEARTH_LCDUMP_ROW=W also prints the differing count per W values of the first differing
/// tensor, e.g. per token).
#[test]
#[ignore = "needs weights/ and a llama.cpp dump (scripts/parity/lcdump.sh)"]
fn logits_and_tensors_match_a_llama_cpp_dump() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let dir = std::path::PathBuf::from(env("HEARTH_LCDUMP", "/tmp/lcdump"));
    let call: usize = env("HEARTH_LCDUMP_CALL", "0").parse().unwrap();
    let case: usize = env("HEARTH_LCDUMP_CASE", "0").parse().unwrap();
    let n_forced: usize = env("HEARTH_LCDUMP_N", "0").parse().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // HEARTH_LCDUMP_MODEL=gemma3: Gemma 3 270M and its fixture instead of SmolLM2.
    let (weights, fixture) = if env("HEARTH_LCDUMP_MODEL", "smollm2") == "gemma3" {
        (
            "weights/gemma-3-270m-Q4_K_M.gguf",
            "tests/fixtures/text/gemma-3-270m-q4_k_m.json",
        )
    } else {
        (
            "weights/SmolLM2-135M-Instruct.Q4_1.gguf",
            "tests/fixtures/text/smollm2-135m-instruct-q4_1.json",
        )
    };
    let mut cfg = TextModelConfig::local(root.join(weights));
    cfg.threads = 2;
    let mut m = GgmlModel::load(&cfg).unwrap();
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(fixture)).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let prompt = ids(&fx["cases"][case]["prompt_ids"]);
    let forced = ids(&fx["cases"][case]["greedy_ids"]);
    let cap = prompt.len() + n_forced;
    let mut seq = m.new_cache(cap);
    let mut logits = Vec::new();
    let mut bad = Vec::new();
    for k in 0..=n_forced {
        let tokens = if k == 0 {
            prompt.clone()
        } else {
            vec![forced[k - 1]]
        };
        if k == call {
            let mut tap = DumpTap {
                dir: dir.join("t"),
                first_diff: None,
            };
            m.forward_tapped(&mut seq, &tokens, &mut logits, &mut tap)
                .unwrap();
            println!("call {k}: first differing tensor {:?}", tap.first_diff);
            seq.len += tokens.len();
        } else {
            logits = m.forward(&mut seq, &tokens).unwrap();
        }
        let want = read_f32(&dir.join(format!("logits_{k}.f32"))).expect("logits in the dump");
        let (n, max) = compare(&logits, &want);
        println!("call {k}: {n} logits differ (max {max:e})");
        if n > 0 {
            bad.push((k, n, max));
        }
    }
    assert!(
        bad.is_empty(),
        "(call, logits differing, max difference): {bad:?}"
    );
}
