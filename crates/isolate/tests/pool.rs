//! The pool against real worker processes: this binary is its own worker.
//!
//! Run as `pool convert-worker` it is a worker whose conversion misbehaves on cue (by file
//! name: `abort.hook`, `overflow.hook`, ...) and converts for real otherwise; run as
//! `pool garbage-worker KIND` it answers `Ready` and then breaks the protocol; run as
//! `pool mute-worker` it exits at once. Run without those, it runs the cases below against
//! pools of itself (`--measure [FILE...]` also prints the worker's memory figures).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hearth_isolate::{
    Bytes, Conversion, ConvertErrorKind, CrashCause, Error, Options, Pool, PoolConfig,
};

// The `hearth` binary's allocator, so that the worker's limits are tried as shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
const CSV: &[u8] = b"name,qty\napple,3\npear,5\n";

#[path = "pool/hooks.rs"]
mod hooks;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("convert-worker") => hearth_isolate::serve_with(hooks::misbehave),
        Some("garbage-worker") => hooks::garbage_worker(args.get(2).map_or("", String::as_str)),
        Some("mute-worker") => ExitCode::from(7),
        _ => {
            let measure = args.iter().position(|a| a == "--measure");
            let files = measure.map(|i| args[i + 1..].iter().map(PathBuf::from).collect());
            run_cases(files)
        }
    }
}

type Case = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs every case; with `measure`, the measurement too (over those extra files).
fn run_cases(measure: Option<Vec<PathBuf>>) -> ExitCode {
    let exe = std::env::current_exe().expect("the test binary's path");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut cases: Vec<(&str, Case)> = vec![
        (
            "converts_real_documents",
            Box::pin(converts_real_documents(exe.clone())),
        ),
        (
            "converter_errors_come_back_as_such",
            Box::pin(converter_errors_come_back_as_such(exe.clone())),
        ),
        (
            "each_death_names_its_cause_and_the_worker_is_replaced",
            Box::pin(each_death_names_its_cause(exe.clone())),
        ),
        (
            "cpu_runaway_ends_at_the_cpu_limit",
            Box::pin(cpu_runaway_ends_at_the_cpu_limit(exe.clone())),
        ),
        (
            "protocol_breakers_are_killed_without_allocating_their_claims",
            Box::pin(protocol_breakers_are_killed(exe.clone())),
        ),
        (
            "a_cancelled_conversion_keeps_its_slot",
            Box::pin(a_cancelled_conversion_keeps_its_slot(exe.clone())),
        ),
        (
            "busy_when_every_worker_stays_busy",
            Box::pin(busy_when_every_worker_stays_busy(exe.clone())),
        ),
        (
            "unavailable_when_no_worker_can_start",
            Box::pin(unavailable_when_no_worker_can_start(exe.clone())),
        ),
        (
            "workers_whose_memory_grew_are_retired",
            Box::pin(workers_whose_memory_grew_are_retired(exe.clone())),
        ),
    ];
    cases.push((
        "an_idle_worker_killed_from_outside_is_replaced",
        Box::pin(an_idle_worker_killed_from_outside_is_replaced(exe.clone())),
    ));
    cases.push((
        "a_killed_worker_takes_its_children_along",
        Box::pin(a_killed_worker_takes_its_children_along(exe.clone())),
    ));
    if let Some(files) = measure {
        cases.push(("measure", Box::pin(measure_worker(exe.clone(), files))));
    }
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        let started = Instant::now();
        let outcome = runtime.block_on(async { tokio::spawn(case).await });
        let ms = started.elapsed().as_millis();
        if outcome.is_ok() {
            passed += 1;
            println!("test {name} ... ok ({ms} ms)");
        } else {
            failed += 1;
            println!("test {name} ... FAILED ({ms} ms)");
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn config(exe: &Path, workers: usize, time_limit: Duration) -> PoolConfig {
    PoolConfig {
        workers,
        time_limit,
        memory_limit_bytes: MEMORY_LIMIT,
        cpu_time_limit: Duration::from_secs(30),
        ..PoolConfig::new(exe)
    }
}

async fn convert(pool: &Pool, bytes: &'static [u8], name: &str) -> Result<Conversion, Error> {
    pool.convert(
        Bytes::from_static(bytes),
        Some(name.to_owned()),
        &Options::default(),
    )
    .await
}

/// Waits until every worker is live and idle again.
async fn wait_full(pool: &Pool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = pool.health();
        if health.live == health.workers && health.idle == health.workers {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not refill: {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn converts_real_documents(exe: PathBuf) {
    let pool = Pool::start(config(&exe, 2, Duration::from_secs(10))).await;
    let health = pool.health();
    assert_eq!(
        (health.live, health.idle, health.is_degraded()),
        (2, 2, false)
    );

    let csv = convert(&pool, CSV, "fruit.csv")
        .await
        .expect("csv converts");
    assert_eq!(csv.format, hearth_markdown::Format::Csv);
    assert!(
        csv.markdown.contains("apple") && csv.markdown.contains('|'),
        "{}",
        csv.markdown
    );

    let html = b"<html><head><title>T</title></head><body><h1>Heading</h1><p>Some <b>bold</b> text.</p></body></html>";
    let html = convert(&pool, html, "page.html")
        .await
        .expect("html converts");
    assert_eq!(html.format, hearth_markdown::Format::Html);
    assert!(html.markdown.contains("# Heading"), "{}", html.markdown);
    assert!(html.markdown.contains("**bold**"), "{}", html.markdown);

    // A parser printing to stdout does not break the protocol: fd 1 is stderr in a worker.
    let printed = convert(&pool, CSV, "print.hook")
        .await
        .expect("printing parser");
    assert!(printed.markdown.contains("pear"));
    wait_full(&pool).await;
}

async fn converter_errors_come_back_as_such(exe: PathBuf) {
    let pool = Pool::start(config(&exe, 1, Duration::from_secs(10))).await;
    let empty = pool
        .convert(Bytes::new(), Some("a.txt".into()), &Options::default())
        .await;
    assert!(
        matches!(&empty, Err(Error::Convert { kind: ConvertErrorKind::Empty, message }) if message == "the file is empty"),
        "{empty:?}"
    );
    let binary: &'static [u8] = &[0, 159, 146, 150, 0, 1, 2, 3, 255, 254, 0, 0, 7, 8, 9];
    let unsupported = convert(&pool, binary, "blob.bin").await;
    match unsupported {
        Err(Error::Convert {
            kind: ConvertErrorKind::Unsupported { what },
            message,
        }) => {
            assert!(what.contains(".bin"), "{what}");
            assert!(message.starts_with("unsupported file type"), "{message}");
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
    let broken_zip: &'static [u8] = b"PK\x03\x04 this is no zip archive at all, only its magic";
    let malformed = convert(&pool, broken_zip, "broken.docx").await;
    assert!(
        matches!(malformed, Err(Error::Convert { .. })),
        "{malformed:?}"
    );
    // The worker lived through all of that.
    wait_full(&pool).await;
    assert!(convert(&pool, CSV, "after.csv").await.is_ok());
}

async fn each_death_names_its_cause(exe: PathBuf) {
    // Long enough that a worker which dies of its own cause (the memory hog takes under a second
    // alone) still does on a machine busy with a build, rather than reaching the time limit.
    let time_limit = Duration::from_secs(6);
    let pool = Pool::start(config(&exe, 2, time_limit)).await;
    let limit_bytes = MEMORY_LIMIT;
    let cases = [
        ("abort.hook", CrashCause::Signal { signal: 6 }),
        ("overflow.hook", CrashCause::StackOverflow),
        ("oom.hook", CrashCause::OutOfMemory { limit_bytes }),
        ("exit3.hook", CrashCause::Exited { code: 3 }),
        ("sleep.hook", CrashCause::TimeLimit { limit: time_limit }),
    ];
    for (hook, expected) in cases {
        let started = Instant::now();
        let result = convert(&pool, CSV, hook).await;
        let took = started.elapsed();
        match &result {
            Err(Error::Crashed { cause }) => {
                assert_eq!(*cause, expected, "{hook}");
                println!(
                    "  {hook}: \"Conversion failed: {cause}\" after {} ms",
                    took.as_millis()
                );
            }
            other => panic!("{hook}: expected a crash, got {other:?}"),
        }
        assert!(
            took < time_limit + Duration::from_secs(1),
            "{hook} took {took:?}"
        );
        // The next request on the same pool succeeds, and the pool is whole again.
        let next = convert(&pool, CSV, "next.csv").await;
        assert!(next.is_ok(), "after {hook}: {next:?}");
        wait_full(&pool).await;
    }
}

async fn cpu_runaway_ends_at_the_cpu_limit(exe: PathBuf) {
    let time_limit = Duration::from_secs(10);
    let pool = Pool::start(PoolConfig {
        cpu_time_limit: Duration::from_secs(1),
        ..config(&exe, 1, time_limit)
    })
    .await;
    // A job that uses some CPU first, so that the limit is seen to move with the worker.
    assert!(convert(&pool, CSV, "warm.csv").await.is_ok());
    let started = Instant::now();
    let result = convert(&pool, CSV, "spin.hook").await;
    let took = started.elapsed();
    match &result {
        Err(Error::Crashed { cause }) => {
            assert_eq!(
                *cause,
                CrashCause::CpuTimeLimit {
                    limit: Duration::from_secs(1)
                }
            );
            println!(
                "  spin.hook: \"Conversion failed: {cause}\" after {} ms",
                took.as_millis()
            );
        }
        other => panic!("expected the CPU limit, got {other:?}"),
    }
    assert!(took < time_limit, "{took:?}");
    assert!(convert(&pool, CSV, "next.csv").await.is_ok());
    wait_full(&pool).await;
}

async fn protocol_breakers_are_killed(exe: PathBuf) {
    for (kind, needle) in [
        ("huge", "claims 1152921504606846976 bytes"),
        ("text", "magic"),
    ] {
        let pool = Pool::start(PoolConfig {
            args: vec!["garbage-worker".into(), kind.into()],
            ..config(&exe, 1, Duration::from_secs(5))
        })
        .await;
        let started = Instant::now();
        let result = convert(&pool, CSV, "a.csv").await;
        match &result {
            Err(Error::Crashed {
                cause: CrashCause::Protocol { detail },
            }) => assert!(detail.contains(needle), "{detail}"),
            other => panic!("{kind}: expected a protocol error, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

async fn a_cancelled_conversion_keeps_its_slot(exe: PathBuf) {
    let pool = Pool::start(config(&exe, 2, Duration::from_secs(5))).await;
    for _ in 0..3 {
        let cancelled =
            tokio::time::timeout(Duration::from_millis(50), convert(&pool, CSV, "slow.hook")).await;
        assert!(
            cancelled.is_err(),
            "the slow job should not finish in 50 ms"
        );
    }
    wait_full(&pool).await;
    // Both slots are there: two slow jobs run at once.
    let started = Instant::now();
    let (a, b) = tokio::join!(
        convert(&pool, CSV, "slow.hook"),
        convert(&pool, CSV, "slow.hook")
    );
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1150),
        "ran one after the other: {took:?}"
    );
    wait_full(&pool).await;
}

async fn busy_when_every_worker_stays_busy(exe: PathBuf) {
    let time_limit = Duration::from_secs(1);
    let pool = Pool::start(config(&exe, 1, time_limit)).await;
    let hog = {
        let pool = pool.clone();
        tokio::spawn(async move { convert(&pool, CSV, "sleep.hook").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let waiting = convert(&pool, CSV, "waits.csv").await;
    let took = started.elapsed();
    match &waiting {
        Err(e @ Error::Busy { workers: 1, .. }) => println!("  \"Conversion failed: {e}\""),
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(
        took >= time_limit && took < time_limit + Duration::from_millis(500),
        "{took:?}"
    );
    let hogged = hog.await.expect("the hog task");
    assert!(matches!(
        hogged,
        Err(Error::Crashed {
            cause: CrashCause::TimeLimit { .. }
        })
    ));
    assert!(convert(&pool, CSV, "after.csv").await.is_ok());
}

async fn unavailable_when_no_worker_can_start(exe: PathBuf) {
    let missing = Pool::start(config(
        Path::new("/nonexistent/hearth"),
        2,
        Duration::from_secs(5),
    ))
    .await;
    let health = missing.health();
    assert!(health.is_degraded(), "{health:?}");
    assert_eq!((health.live, health.idle), (0, 0));
    let why = health.start_error.unwrap_or_default();
    assert!(why.contains("cannot run /nonexistent/hearth"), "{why}");
    let started = Instant::now();
    let result = convert(&missing, CSV, "a.csv").await;
    assert!(
        matches!(&result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(100));
    if let Err(e) = result {
        println!("  \"Conversion failed: {e}\"");
    }

    let mute = Pool::start(PoolConfig {
        args: vec!["mute-worker".into()],
        ..config(&exe, 1, Duration::from_secs(5))
    })
    .await;
    let health = mute.health();
    assert!(health.is_degraded(), "{health:?}");
    let why = health.start_error.unwrap_or_default();
    assert!(why.contains("exited with code 7"), "{why}");
}

async fn workers_whose_memory_grew_are_retired(exe: PathBuf) {
    let pid = |c: Result<Conversion, Error>| c.expect("pid.hook converts").markdown;
    let keep = Pool::start(config(&exe, 1, Duration::from_secs(5))).await;
    let first = pid(convert(&keep, CSV, "pid.hook").await);
    assert_eq!(
        first,
        pid(convert(&keep, CSV, "pid.hook").await),
        "a worker is reused"
    );

    let retire = Pool::start(PoolConfig {
        retire_rss_bytes: 1,
        ..config(&exe, 1, Duration::from_secs(5))
    })
    .await;
    let first = pid(convert(&retire, CSV, "pid.hook").await);
    assert_ne!(
        first,
        pid(convert(&retire, CSV, "pid.hook").await),
        "a grown worker is retired"
    );
    wait_full(&retire).await;
}

async fn an_idle_worker_killed_from_outside_is_replaced(exe: PathBuf) {
    use nix::sys::signal::{kill, Signal};
    let pool = Pool::start(config(&exe, 1, Duration::from_secs(5))).await;
    let first = convert(&pool, CSV, "pid.hook").await.expect("pid").markdown;
    let pid = nix::unistd::Pid::from_raw(first.parse().expect("a pid"));
    kill(pid, Signal::SIGKILL).expect("kill the idle worker");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Health notices the dead idle worker and has it replaced.
    let health = pool.health();
    assert_eq!(health.live, 0, "{health:?}");
    wait_full(&pool).await;
    let second = convert(&pool, CSV, "pid.hook").await.expect("pid").markdown;
    assert_ne!(first, second);
    // Killed again, and this time no health check runs: the checkout notices instead.
    let pid = nix::unistd::Pid::from_raw(second.parse().expect("a pid"));
    kill(pid, Signal::SIGKILL).expect("kill the idle worker");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(convert(&pool, CSV, "after.csv").await.is_ok());
}

/// A worker killed at the time limit takes the processes it started with it (as the OCR
/// engine would be): `child.hook` starts `sleep 600`, writes its pid to the file the document
/// names, and sleeps itself.
async fn a_killed_worker_takes_its_children_along(exe: PathBuf) {
    let dir = std::env::temp_dir().join(format!("hearth-pool-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let pid_file = dir.join("child.pid");
    let pool = Pool::start(config(&exe, 1, Duration::from_secs(1))).await;
    let path = Bytes::from(pid_file.to_string_lossy().into_owned());
    let result = pool
        .convert(path, Some("child.hook".into()), &Options::default())
        .await;
    assert!(
        matches!(
            result,
            Err(Error::Crashed {
                cause: CrashCause::TimeLimit { .. }
            })
        ),
        "{result:?}"
    );
    let child: i32 = std::fs::read_to_string(&pid_file)
        .expect("the hook wrote its child's pid")
        .trim()
        .parse()
        .expect("a pid");
    let _ = std::fs::remove_dir_all(&dir);
    // Gone, or a zombie waiting for a reaper: either way no longer running.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker's child {child} still runs: {stat}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_full(&pool).await;
}

/// Prints, for each document under a few memory limits, whether a fresh worker converts it and
/// what the worker then maps and holds: a generated 5 MB CSV and 470 kB HTML, plus the files
/// named after `--measure`. Threads 1 afterwards would mean the converter could not start its
/// 64 MiB-stack thread and converted on the main thread (8 MiB of stack): that happened below
/// 96 MiB, before the pool's minimum of 256 MiB.
async fn measure_worker(exe: PathBuf, files: Vec<PathBuf>) {
    let rows: String = (0..200_000)
        .map(|i| format!("{i},item {i},{}\n", i * 7))
        .collect();
    let html: String = (0..20_000)
        .map(|i| format!("<p>para <b>{i}</b></p>"))
        .collect();
    let mut docs = vec![
        (
            "big.csv".to_owned(),
            Bytes::from(format!("id,name,value\n{rows}")),
        ),
        (
            "big.html".to_owned(),
            Bytes::from(format!("<html><body>{html}</body></html>")),
        ),
    ];
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        let bytes = std::fs::read(&file).expect("a file to measure");
        docs.push((name.unwrap_or_default(), Bytes::from(bytes)));
    }
    let pick = |s: &str, key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .map(|l| {
                l[key.len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("?")
                    .to_owned()
            })
            .unwrap_or_default()
    };
    for mib in [256u64, 512, 2048] {
        for (name, bytes) in &docs {
            let pool = Pool::start(PoolConfig {
                memory_limit_bytes: mib * 1024 * 1024,
                ..config(&exe, 1, Duration::from_secs(30))
            })
            .await;
            let size = bytes.len();
            let options = Options::default();
            let result = pool.convert(bytes.clone(), Some(name.clone()), &options);
            let outcome = match result.await {
                Ok(c) => format!("ok, {} kB of {}", c.markdown.len() / 1024, c.format),
                Err(e) => e.to_string(),
            };
            let status = convert(&pool, CSV, "status.hook").await;
            let status = status.map(|c| c.markdown).unwrap_or_else(|e| e.to_string());
            println!(
                "  limit {mib} MiB, {name} ({size} B): {outcome}; VmSize {} kB, VmHWM {} kB, threads {}",
                pick(&status, "VmSize:"),
                pick(&status, "VmHWM:"),
                pick(&status, "Threads:"),
            );
        }
    }
}
