//! Checks the candle backend on a device (a GPU under CUDA) against the fast CPU path on GGUF
//! files (the generated models of `tests/fixtures/arch/`, every family and quantization), as
//! `tests/device_backend.rs` checks it on the CPU: teacher-forced along the CPU's greedy tokens,
//! the device must pick the same token wherever the CPU's margin is at least 1.0; and three
//! sequences stepped together on the device (one prefilling beside two decoding) must pick what
//! they pick alone wherever that margin holds. Prints one JSON line per file (with the largest
//! logit difference relative to the row's largest logit, and for each decisive step that
//! differs: step, CPU margin, the CPU's logits of its token and the device's, the device's
//! logits of both); exits 1 if any decisive step differs. On a GPU the teacher-forced run is
//! repeated with every decode step launched kernel by kernel (`HEARTH_CUDA_GRAPHS=off`), and the
//! steps replayed as CUDA graphs must give the same logits bit for bit.
//!
//! `device_check [--device cuda] [--dtype auto|f32|f16|bf16] [--prompt N] FILE.gguf...`: the
//! teacher-forced run's prompt is N tokens (12 unless given; a long one takes the decode
//! attention's splits of a row, merged by the last of their blocks).

use std::process::ExitCode;

use hearth_infer::{BackendChoice, DeviceSpec, Dtype, GpuTuning, Step, TextModel, TextModelConfig};

#[path = "../tests/support/mod.rs"]
mod support;
use support::{argmax, margin};

const NEAR_TIE: f32 = 1.0;
const STEPS: usize = 24;

fn main() -> ExitCode {
    let mut device = "cuda".to_string();
    let mut dtype = Dtype::Auto;
    let mut files = Vec::new();
    let mut prompt = 12;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => device = args.next().unwrap_or_default(),
            "--prompt" => match args.next().unwrap_or_default().parse() {
                Ok(n) if n > 0 => prompt = n,
                _ => {
                    eprintln!("device_check: --prompt takes a positive number of tokens");
                    return ExitCode::from(2);
                }
            },
            "--dtype" => match args.next().unwrap_or_default().parse() {
                Ok(d) => dtype = d,
                Err(e) => {
                    eprintln!("device_check: {e}");
                    return ExitCode::from(2);
                }
            },
            _ => files.push(a),
        }
    }
    let spec: DeviceSpec = match device.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("device_check: {e}");
            return ExitCode::from(2);
        }
    };
    let mut ok = true;
    for f in &files {
        match check(f, spec, dtype, prompt) {
            Ok((line, good)) => {
                println!("{line}");
                ok &= good;
            }
            Err(e) => {
                println!("{{\"file\":\"{f}\",\"error\":\"{e}\"}}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn load(
    path: &str,
    device: DeviceSpec,
    backend: BackendChoice,
    dtype: Dtype,
    graphs: bool,
) -> Result<TextModel, String> {
    let mut cfg = TextModelConfig::local(path);
    cfg.device = device;
    // HEARTH_CUDA_EVENTS, HEARTH_CUDA_POOL, HEARTH_DECODE_ATTENTION, HEARTH_FUSED,
    // HEARTH_CUDA_GRAPHS: the GPU's fast paths turned off, to check the path they replace.
    cfg.gpu = GpuTuning::from_vars(|k| std::env::var(k).ok());
    cfg.gpu.no_graphs |= !graphs;
    cfg.dtype = dtype;
    cfg.backend = backend;
    cfg.threads = 4;
    TextModel::load(&cfg).map_err(|e| e.to_string())
}

/// Each step's logits for `prompt` then the tokens `follow` fed one at a time.
fn run(m: &mut TextModel, prompt: &[u32], follow: &[u32]) -> Result<Vec<Vec<f32>>, String> {
    let mut seq = m
        .new_sequence(prompt.len() + follow.len() + 1)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    for i in 0..=follow.len() {
        let l = m
            .forward(&mut [Step {
                seq: &mut seq,
                tokens: &next,
            }])
            .map_err(|e| e.to_string())?;
        out.push(l.to_vec());
        if i < follow.len() {
            next = vec![follow[i]];
        }
    }
    Ok(out)
}

fn check(
    path: &str,
    device: DeviceSpec,
    dtype: Dtype,
    prompt_len: usize,
) -> Result<(String, bool), String> {
    let mut cpu = load(
        path,
        DeviceSpec::Cpu,
        BackendChoice::Fast,
        Dtype::Auto,
        false,
    )?;
    let mut dev = load(path, device, BackendChoice::Candle, dtype, true)?;
    let vocab = cpu.info().vocab_size;
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| ((i * 131 + 17) % vocab) as u32)
        .collect();
    // The CPU's greedy path, then the device teacher-forced along it.
    let mut path_ids = Vec::new();
    let mut want = Vec::new();
    {
        let mut seq = cpu
            .new_sequence(prompt.len() + STEPS + 1)
            .map_err(|e| e.to_string())?;
        let mut next = prompt.clone();
        for _ in 0..STEPS {
            let l = cpu
                .forward(&mut [Step {
                    seq: &mut seq,
                    tokens: &next,
                }])
                .map_err(|e| e.to_string())?
                .to_vec();
            let id = argmax(&l);
            path_ids.push(id);
            want.push(l);
            next = vec![id];
        }
    }
    let got = run(&mut dev, &prompt, &path_ids[..STEPS - 1])?;
    // The same steps launched kernel by kernel: replayed graphs must change nothing.
    let graph_diff = if device == DeviceSpec::Cpu {
        0f32
    } else {
        let mut eager = load(path, device, BackendChoice::Candle, dtype, false)?;
        let plain = run(&mut eager, &prompt, &path_ids[..STEPS - 1])?;
        got.iter()
            .flatten()
            .zip(plain.iter().flatten())
            .map(|(a, b)| {
                if a.to_bits() == b.to_bits() {
                    0.0
                } else {
                    (a - b).abs().max(f32::MIN_POSITIVE)
                }
            })
            .fold(0f32, f32::max)
    };
    let (mut decisive, mut wrong, mut rel) = (0, 0, 0f32);
    let mut flips = Vec::new();
    for (step, (w, g)) in want.iter().zip(&got).enumerate() {
        let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
        for (x, y) in w.iter().zip(g) {
            rel = rel.max((x - y).abs() / scale);
        }
        if margin(w) >= NEAR_TIE {
            decisive += 1;
            let (a, b) = (argmax(w) as usize, argmax(g) as usize);
            if a != b {
                wrong += 1;
                // The CPU's margin, and the device's logits of the two tokens.
                flips.push(format!(
                    "[{step},{:.3},{:.3},{:.3},{:.3},{:.3}]",
                    margin(w),
                    w[a],
                    w[b],
                    g[a],
                    g[b]
                ));
            }
        }
    }
    // Batched on the device: sequence 0 prefills while 1 and 2 decode, then all decode.
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|s| {
            (0..(5 + 4 * s))
                .map(|i| ((i * 97 + 31 * s + 3) % vocab) as u32)
                .collect()
        })
        .collect();
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| run(&mut dev, p, &[7, 8, 9]))
        .collect::<Result<_, _>>()?;
    let mut seqs = (0..3)
        .map(|s| dev.new_sequence(prompts[s].len() + 4))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut fed = [0usize; 3];
    let mut together: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    for t in 0..5 {
        let live: Vec<usize> = (0..3).filter(|&s| (s > 0 || t > 0) && fed[s] < 4).collect();
        let toks: Vec<Vec<u32>> = live
            .iter()
            .map(|&s| {
                if fed[s] == 0 {
                    prompts[s].clone()
                } else {
                    vec![6 + fed[s] as u32]
                }
            })
            .collect();
        let mut steps = Vec::new();
        let mut order = Vec::new();
        for (s, seq) in seqs.iter_mut().enumerate() {
            if let Some(k) = live.iter().position(|&x| x == s) {
                steps.push(Step {
                    seq,
                    tokens: &toks[k],
                });
                order.push(s);
            }
        }
        let l = dev.forward(&mut steps).map_err(|e| e.to_string())?.to_vec();
        for (row, &s) in order.iter().enumerate() {
            together[s].push(l[row * vocab..(row + 1) * vocab].to_vec());
            fed[s] += 1;
        }
    }
    let (mut b_decisive, mut b_wrong, mut worst) = (0, 0, 0f32);
    for (a, b) in alone.iter().zip(&together) {
        for (la, lb) in a.iter().zip(b) {
            let scale = la.iter().fold(1f32, |m, x| m.max(x.abs()));
            for (x, y) in la.iter().zip(lb) {
                worst = worst.max((x - y).abs() / scale);
            }
            if margin(la) >= NEAR_TIE {
                b_decisive += 1;
                b_wrong += usize::from(argmax(la) != argmax(lb));
            }
        }
    }
    let line = format!(
        "{{\"file\":\"{path}\",\"backend\":\"{}\",\"prompt\":{prompt_len},\"steps\":{STEPS},\"decisive\":{decisive},\"differ\":{wrong},\"max_rel_diff\":{rel:.2e},\"flips\":[{}],\"batched_decisive\":{b_decisive},\"batched_differ\":{b_wrong},\"batched_max_rel_diff\":{worst:.2e},\"graph_max_abs_diff\":{graph_diff:.2e}}}",
        dev.info().backend,
        flips.join(",")
    );
    Ok((line, wrong == 0 && b_wrong == 0 && graph_diff == 0.0))
}
