//! The test binary as a worker: a conversion that misbehaves on cue, and workers that break
//! the protocol.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use hearth_isolate::{Bytes, Conversion, Converter};

/// The test worker's conversion: misbehaves as the file name says, converts otherwise.
pub fn misbehave(
    converter: &Converter,
    bytes: Bytes,
    filename: Option<&str>,
) -> hearth_markdown::Result<Conversion> {
    match filename {
        Some("abort.hook") => std::process::abort(),
        Some("overflow.hook") => {
            let depth = recurse(0);
            unreachable!("recursion ended at {depth}")
        }
        Some("oom.hook") => hoard(),
        Some("spin.hook") => spin(),
        Some("sleep.hook") => {
            std::thread::sleep(Duration::from_secs(600));
            unreachable!("slept ten minutes")
        }
        Some("exit3.hook") => std::process::exit(3),
        Some("child.hook") => {
            // A child process as the OCR engine is one; the document is where its pid goes.
            // Never waited for: the worker sleeps until it is killed, with its child.
            #[allow(clippy::zombie_processes)]
            let child = std::process::Command::new("sleep")
                .arg("600")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("start sleep");
            let path = String::from_utf8_lossy(&bytes).into_owned();
            std::fs::write(path, child.id().to_string()).expect("write the child's pid");
            std::thread::sleep(Duration::from_secs(600));
            unreachable!("slept ten minutes")
        }
        Some("slow.hook") => {
            std::thread::sleep(Duration::from_millis(600));
            converter.convert(bytes, Some("slow.csv"))
        }
        Some("print.hook") => {
            // A parser that prints: this must land on stderr, not inside a frame.
            let mut out = std::io::stdout();
            for _ in 0..1000 {
                let _ = out.write_all(b"HIW1 stray output from a parser\n");
            }
            let _ = out.flush();
            converter.convert(bytes, Some("print.csv"))
        }
        Some("status.hook") => {
            // What the worker maps and holds after converting, and the limit it set itself.
            let converted = converter.convert(bytes, Some("status.csv"))?;
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
            Ok(Conversion {
                markdown: format!("{status}{limits}"),
                ..converted
            })
        }
        Some("pid.hook") => {
            let converted = converter.convert(bytes, Some("pid.csv"))?;
            Ok(Conversion {
                markdown: std::process::id().to_string(),
                ..converted
            })
        }
        _ => converter.convert(bytes, filename),
    }
}

/// Real recursion until the stack runs out: each frame keeps an array alive across the call.
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 64]);
    if depth == u64::MAX {
        return frame[0];
    }
    recurse(depth + 1).wrapping_add(frame[1])
}

/// Allocates and touches 32 MiB after 32 MiB until an allocation fails.
fn hoard() -> ! {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        held.push(vec![1u8; 32 * 1024 * 1024]);
        std::hint::black_box(&held);
    }
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// Says `Ready` as the protocol wants, reads a little of the request, then answers a frame
/// that claims an exabyte (`huge`) or plain text (anything else).
pub fn garbage_worker(kind: &str) -> ExitCode {
    let header = br#"{"type":"ready","pid":1,"address_space_bytes":0,"usage":{"max_rss_bytes":0,"cpu_ms":0}}"#;
    let mut out = std::io::stdout().lock();
    let mut frame = Vec::from(*b"HIW1");
    frame.extend_from_slice(&(header.len() as u32).to_le_bytes());
    frame.extend_from_slice(&0u64.to_le_bytes());
    frame.extend_from_slice(header);
    let _ = out.write_all(&frame).and_then(|()| out.flush());
    let mut first = [0u8; 16];
    let _ = std::io::Read::read_exact(&mut std::io::stdin(), &mut first);
    let answer: Vec<u8> = if kind == "huge" {
        let mut a = Vec::from(*b"HIW1");
        a.extend_from_slice(&2u32.to_le_bytes());
        a.extend_from_slice(&(1u64 << 60).to_le_bytes());
        a.extend_from_slice(b"{}");
        a
    } else {
        b"Traceback (most recent call last): this is not a frame at all\n".to_vec()
    };
    let _ = out.write_all(&answer).and_then(|()| out.flush());
    std::thread::sleep(Duration::from_secs(30));
    ExitCode::SUCCESS
}
