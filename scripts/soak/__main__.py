"""Soak benchmark: one real `hearth serve` (auth, completion, markdown, imagine) under a steady
mix of traffic for a long time, watched for leaks and checked for lost money.

Started by scripts/soak.sh, which builds the binary and fetches what this needs; run on its own:

    python3 scripts/soak DURATION --bin PATH [--postgres URL] [--out FILE] [--interval SECS] [--rate X]

What it does, in order:
  1. Starts `hearth serve` with all four services on ports the kernel picks, in a throwaway data
     dir under .cache/soak/, with SmolLM2 as both text models and the tiny SDXL-shaped image
     model, on the embedded store (or PostgreSQL with --postgres).
  2. Drives mixed traffic at a steady rate for DURATION from a pool of threads: sign-in, token
     checks and logout on the auth listener; one-shot, SSE and OpenAI-style completions, some
     stopped with /stream/shutdown and some cut off by the client mid-stream; document uploads,
     a share of them hostile; image requests; /metrics scrapes of every listener.
  3. Every --interval seconds (and at the end) samples the server process (RSS, open file
     descriptors, threads, conversion workers) and the answers of that interval (p50/p99
     latency per class, answers by status class), as one Markdown table row.
  4. Checks the money once traffic has drained: no hold left open, every soak user's balance
     equal to their initial balance minus their ledger's debits, and for users that never cut a
     request, the ledger's debits equal one for one the costs the answers reported.
  5. Prints a summary and exits 1 if the money check fails, an answer was unexpected (a 5xx not
     injected on purpose, above all), a request got no answer, or the server died.

Standard library only: a soak must not depend on a third-party client's retries (the openai
package retries 5xx and 429 by default, which would hide exactly what this looks for).
"""

# This module owns the command line, the driver loop (drive) and the run itself (main). Run as
# `python3 scripts/soak`: Python puts this folder first on sys.path, so the modules beside this
# one import by their plain names.

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

from common import ROOT, SERVICES, SMOLLM2, fmt_elapsed, log, parse_duration
from documents import corpus
from money import money_check, money_in_flight, server_counts
from record import Recorder, Table, User, fmt_pp
from server import Server
from traffic import Traffic
from wire import post_json


# Seconds between RSS samples within a row's interval.
RSS_EVERY = 5


def with_rss_window(proc, samples):
    """`proc` with the least, median and greatest RSS of `samples` (its own reading when there
    are none)."""
    samples = sorted(samples) or [proc["rss_kib"]]
    return dict(proc, rss_min_kib=samples[0], rss_med_kib=samples[len(samples) // 2],
                rss_max_kib=samples[-1])


def drive(traffic, duration, rate, stop, on_tick):
    """Sends each class at its own steady rate (its period jittered by ±20% so that classes do
    not fall into step) until `duration` passes or `stop` is set. A class whose requests are
    still in flight up to its cap is skipped that turn and counted: a server falling behind
    shows up as skips instead of an ever-growing queue in the driver."""
    plan = traffic.plan()
    inflight = {name: 0 for name, *_ in plan}
    lock = threading.Lock()
    start = time.monotonic()
    due = {name: start + random.uniform(0, period / rate) for name, period, _, _ in plan}
    with ThreadPoolExecutor(max_workers=48, thread_name_prefix="soak") as pool:
        def run(name, fn):
            try:
                fn()
            except Exception as e:  # a bug in the driver must not end the soak silently
                traffic.rec.error(name, 0, e)
            finally:
                with lock:
                    inflight[name] -= 1

        while not stop.is_set():
            now = time.monotonic()
            if now - start >= duration:
                break
            on_tick(now - start)
            for name, period, cap, fn in plan:
                if due[name] > now:
                    continue
                due[name] += period / rate * random.uniform(0.8, 1.2)
                due[name] = max(due[name], now)
                with lock:
                    if inflight[name] >= cap:
                        traffic.rec.skip(name)
                        continue
                    inflight[name] += 1
                pool.submit(run, name, fn)
            stop.wait(min(0.25, max(0.0, min(due.values()) - time.monotonic())))
        log("traffic stopped; waiting for the requests in flight")
    # leaving the `with` waits for every request: each has a timeout, so this ends


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("duration", type=parse_duration, help="how long to drive traffic: 90s, 30m, 2h, 1h30m")
    ap.add_argument("--bin", required=True, help="the hearth binary")
    ap.add_argument("--postgres", metavar="URL", help="use this PostgreSQL database instead of the embedded store")
    ap.add_argument("--out", help="the report (default .cache/soak/soak-<timestamp>.md)")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between table rows (default 60)")
    ap.add_argument("--rate", type=float, default=1.0, help="scales every request rate (default 1: about 3 requests/s)")
    ap.add_argument("--users", type=int, default=6, help="soak users; a third of them (at least one) cut requests off")
    ap.add_argument("--keep", action="store_true", help="keep the run's data dir")
    ap.add_argument("--seed", type=int, help="seed of the driver's choices")
    args = ap.parse_args()
    if args.seed is not None:
        random.seed(args.seed)
    if not os.path.exists(SMOLLM2):
        sys.exit(f"soak: {SMOLLM2} is missing: run scripts/fetch-weights.sh smollm2")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    soak_dir = os.path.join(ROOT, ".cache", "soak")
    run_dir = os.path.join(soak_dir, f"run-{stamp}")
    os.makedirs(run_dir, exist_ok=True)
    out_path = args.out or os.path.join(soak_dir, f"soak-{stamp}.md")
    log_path = os.path.splitext(out_path)[0] + ".log"
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    open(out_path, "w").close()
    table = Table(out_path)
    report = table.write

    server = Server(args.bin, run_dir, log_path, args.postgres)
    stop = threading.Event()
    # Ctrl-C ends the traffic early; the checks still run. A second one stops at once.
    def interrupted(*_):
        if stop.is_set():
            raise KeyboardInterrupt
        log("interrupted: stopping the traffic, then checking")
        stop.set()
    signal.signal(signal.SIGINT, interrupted)

    failures = []
    try:
        server.prepare()
        log("building the hostile documents")
        benign, hostile = corpus()
        server.start()
        log(f"hearth serve pid {server.proc.pid}: " + ", ".join(f"{s} {server.urls[s]}" for s in SERVICES))
        server.wait_ready()

        cutters = max(1, args.users // 3)
        users = [User(f"soak-{stamp}-{'x' if i < cutters else 'c'}{i + 1}", cutter=i < cutters)
                 for i in range(args.users)]
        ttl = int(args.duration) + 3600
        for user in users:
            user.idp = server.cli("idp", "mint", user.name, "--ttl", str(ttl)).strip()
            answer = post_json(server.urls["auth"], "/token", {"userId": user.name, "idpToken": user.idp})
            if answer.status != 200:
                raise RuntimeError(f"sign-in of {user.name} failed: {answer.status} {answer.error_text()}")
            user.token = answer.json()["serviceToken"]

        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
        report(f"# Hearth soak, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        report(f"- binary `{args.bin}` at `{commit}`, store: {'PostgreSQL' if args.postgres else 'embedded (sled)'}, "
               f"{os.cpu_count()} CPUs")
        report(f"- {fmt_elapsed(args.duration)} of traffic at rate x{args.rate:g}, {len(users)} users "
               f"({cutters} hang up mid-answer), {len(benign)} benign and {len(hostile) + 1} hostile upload kinds")
        report(f"- server log: `{log_path}`\n")
        table.start()
        recorder = Recorder()
        traffic = Traffic(server.urls, users, recorder, benign, hostile)
        table.row(0, server.sample(), [], 0)  # idle, models loaded: the baseline

        # RSS moves by 150 MiB within a minute as images come and go (a VAE decode's activations
        # are freed after each), so one reading a minute measures the moment, not the trend. A
        # row reports the least, median and greatest of samples taken every RSS_EVERY seconds;
        # the summary compares the least and the greatest: a leak raises both.
        next_row = [args.interval]
        next_rss = [RSS_EVERY]
        rss_window = []
        def tick(elapsed):
            if not server.alive():
                failures.append(f"the server died during the run (exit status {server.proc.returncode})")
                stop.set()
                return
            if elapsed >= next_rss[0]:
                next_rss[0] += RSS_EVERY
                rss_window.append(server.sample()["rss_kib"])
            if elapsed >= next_row[0]:
                next_row[0] += args.interval
                window, unexpected = recorder.drain()
                table.row(elapsed, with_rss_window(server.sample(), rss_window), window, unexpected)
                rss_window.clear()

        started = time.monotonic()
        drive(traffic, args.duration, args.rate, stop, tick)
        elapsed = time.monotonic() - started
        if not server.alive():
            raise RuntimeError(f"the server died (exit status {server.proc.returncode}); log: {log_path}")

        # Money in flight must come back to zero: held = charged + released once nothing runs.
        # A cut stream settles a step after its client left, so wait for it a little.
        deadline = time.monotonic() + 30
        while True:
            flight = money_in_flight(server.urls)
            open_amount = {s: h - c - r for s, (h, c, r) in flight.items()}
            if all(abs(v) < 1e-6 for v in open_amount.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        counts = server_counts(server.urls)
        window, unexpected = recorder.drain()
        end_sample = with_rss_window(server.sample(), rss_window)
        table.row(elapsed, end_sample, window, unexpected)
        balances_live = {}
        for user in users:
            answer = post_json(server.urls["auth"], "/balance", {"serviceToken": user.token})
            balances_live[user.name] = Decimal(answer.json()["balance"]) if answer.status == 200 else None

        exit_status = server.stop()
        log("server stopped; checking the money")

        # ---- summary
        report("\n## Summary\n")
        if elapsed < args.duration - 1:
            report(f"- traffic ran {fmt_elapsed(elapsed)} of the {fmt_elapsed(args.duration)} asked (interrupted)")
        rows = table.rows[1:]  # without the idle baseline
        base = next((r for r in rows if r[0] >= 300), None) if elapsed >= 300 + args.interval else None
        base = base or (rows[0] if rows else table.rows[0])
        last = table.rows[-1]
        def rss(row, which):
            return row[1].get(f"rss_{which}_kib", row[1]["rss_kib"])
        report(f"- RSS: {table.rows[0][1]['rss_kib'] / 1024:.0f} MiB idle; the least and greatest of the "
               f"minute's samples: {rss(base, 'min') / 1024:.0f} and {rss(base, 'max') / 1024:.0f} MiB in the "
               f"minute to {fmt_elapsed(base[0])}, {rss(last, 'min') / 1024:.0f} and {rss(last, 'max') / 1024:.0f} "
               f"MiB in the last: x{rss(last, 'min') / max(1, rss(base, 'min')):.3f} and "
               f"x{rss(last, 'max') / max(1, rss(base, 'max')):.3f} (peak {last[1]['hwm_kib'] / 1024:.0f} MiB)")
        report(f"- open fds: {base[1]['fds']} at {fmt_elapsed(base[0])}, {last[1]['fds']} at the end; threads: "
               f"{base[1]['threads']} -> {last[1]['threads']}; conversion workers: {base[1]['workers']} -> "
               f"{last[1]['workers']}")
        totals = recorder.totals
        n = sum(sum(v.values()) for v in totals.values())
        fivexx = sum(c for v in totals.values() for s, c in v.items() if isinstance(s, int) and s >= 500)
        hostile_5xx = sum(c for s, c in totals.get("hostile", {}).items() if isinstance(s, int) and s >= 500)
        unexpected_5xx = sum(c for k, c in recorder.unexpected.items() if re.match(r"\S+ 5\d\d ", k))
        report(f"- answers: {n} in {fmt_elapsed(elapsed)} ({n / max(elapsed, 1):.1f}/s); 5xx: {fivexx}, of them "
               f"{hostile_5xx} hostile uploads answered `Conversion failed` by design, {unexpected_5xx} unexpected")
        report(f"- unexpected answers: {recorder.unexpected_count - recorder.errors}; requests with no answer: "
               f"{recorder.errors}; tolerated 429s: {sum(recorder.tolerated.values())}")
        for key, count in sorted(recorder.unexpected.items(), key=lambda kv: -kv[1])[:15]:
            report(f"  - {count} x {key}")
        if recorder.skipped:
            report(f"- not sent (class or user slots busy): "
                   + ", ".join(f"{k} {v}" for k, v in sorted(recorder.skipped.items())))
        report("- by class (status: count; p50/p99 ms over the run):")
        for cls in sorted(totals):
            statuses = ", ".join(f"{s}: {c}" for s, c in sorted(totals[cls].items(), key=lambda kv: str(kv[0])))
            report(f"  - {cls}: {statuses}; {fmt_pp(recorder.latencies.get(cls, []))}")
        report(f"- the server's own counts: completions {counts['finished']} finished, {counts['aborted']} aborted "
               f"(client gone or stopped), {counts['rejected']} rejected; conversions by outcome: "
               + ", ".join(f"{k} {v}" for k, v in sorted(counts["conversions"].items())))
        report(f"- server log: {server.log_levels['WARN']} warnings, {server.log_levels['ERROR']} errors; the most frequent:")
        for key, count in sorted(server.log_messages.items(), key=lambda kv: -kv[1])[:8]:
            report(f"  - {count} x {key}")
        report(f"- server exit status on SIGTERM: {exit_status}")

        report("\n## Money\n")
        for service, v in open_amount.items():
            h, c, r = flight[service]
            report(f"- {service}: held {h:.6f} = charged {c:.6f} + released {r:.6f} "
                   f"({'ok' if abs(v) < 1e-6 else f'FAIL: {v:.6f} still held'})")
            if abs(v) >= 1e-6:
                failures.append(f"{service}: {v:.6f} credits still held after the traffic drained")
        money_ok, debited = money_check(server, users, balances_live, report)
        # The server's own count of what it charged (this process, every soak user) against the
        # ledgers: the same money seen from the other side.
        charged = sum(c for _, c, _ in flight.values())
        same = abs(charged - float(debited)) < 1e-5
        report(f"\n- charged according to /metrics: {charged:.6f} credits; the soak users' ledgers: {debited} "
               f"({'ok' if same else 'FAIL'})")
        money_ok = money_ok and same
        if not money_ok:
            failures.append("the money check failed (table above)")
        if unexpected_5xx:
            failures.append(f"{unexpected_5xx} unexpected 5xx answers")
        if recorder.unexpected_count:
            failures.append(f"{recorder.unexpected_count - recorder.errors} unexpected answers, "
                            f"{recorder.errors} requests without an answer")
        if exit_status != 0:
            failures.append(f"the server exited with {exit_status} on SIGTERM")
        report("\n## Verdict\n")
        report(f"- money check: {'pass' if money_ok else 'FAIL'}")
        report("- " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
        report(f"\nReport: {out_path}")
    except KeyboardInterrupt:
        failures.append("interrupted")
    except RuntimeError as e:
        failures.append(str(e))
        report(f"\n**FAIL:** {e}")
    finally:
        server.kill()
        if not args.keep and not failures:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif os.path.isdir(run_dir):
            log(f"kept the run's data dir: {run_dir}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
