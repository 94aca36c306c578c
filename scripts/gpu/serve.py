"""`hearth serve` on the GPU, end to end: writes a random 1.1B llama (f16 and Q8_0) with a real
tokenizer, serves both and the tiny image model on the GPU, checks the contract over HTTP, then
drives streams at several concurrencies with the load generator (SSE `/stream` and OpenAI
`/v1/chat/completions`) and stops the server as an operator would.

    python3 scripts/gpu/serve.py --hearth BIN --loadgen BIN --tokenizer tok.gguf --work DIR --out DIR

The checks (each a line `check NAME: ok|FAILED ...`, and `serve-checks.json` in --out):
  health        every model ready on the GPU, the image model too;
  billing       a one-shot completion: usage costs at the model's prices, the balance moved by
                exactly their sum;
  stream        an SSE stream to its end: its token events, its usage and the balance agree;
  shutdown      /stream/shutdown stops a running stream: 200 with the partial answer, billed once;
  disconnect    16 streams cut by their clients: every sequence and its KV blocks freed
                (hearth_completion_active_sequences and kv_cache_in_use_bytes back to where they
                were), no money left held;
  image         an image over HTTP on the GPU, a PNG, billed at the price for its area;
  sigterm       the server exits 0 on SIGTERM within its grace.
The load (JSON lines from the load generator) goes to serve-load.jsonl in --out.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import time
from decimal import Decimal

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "soak"))
from money import money_in_flight, scrape  # noqa: E402
from server import Server  # noqa: E402
from wire import connect, cut, get_json, post_json, sse_events  # noqa: E402

PRICES = {"in": Decimal("0.10"), "out": Decimal("0.40")}
IMAGE_PRICE = Decimal("0.040")
MODELS = {"llama-1b-f16": "f16", "llama-1b-q8": "q8_0"}


def models_toml(work, device):
    rows = [f'[defaults]\ndevice = "{device}"\n']
    for model, weights in MODELS.items():
        rows.append(f"""[text."{model}"]
weights = "{os.path.join(work, model + '.gguf')}"
temperature_max = 2.0
max_output_tokens = 4096
max_input_tokens = 4096
input_price_per_million = "{PRICES['in']}"
output_price_per_million = "{PRICES['out']}"
max_active = 64
max_queued = 256
kv_budget_mb = 16384
prefill_chunk = 512
max_step_tokens = 8192
""")
    rows.append(f"""[image."xl-lightning"]
weights = "no-real-weights-here"
tiny_weights = "tiny-sdxl"
price_per_image = "{IMAGE_PRICE}"
""")
    return "\n".join(rows)


class Checks:
    def __init__(self):
        self.results = {}

    def record(self, name, ok, detail=""):
        self.results[name] = {"ok": bool(ok), "detail": detail}
        print(f"check {name}: {'ok' if ok else 'FAILED'} {detail}", flush=True)


def balance(urls, token):
    return Decimal(post_json(urls["auth"], "/balance", {"serviceToken": token}).json()["balance"])


def body(token, model, max_tokens, prompt="Write a long story about a lighthouse keeper."):
    return {"serviceToken": token, "model": model, "temperature": 0.7,
            "messages": [{"role": "user", "content": prompt}], "maxOutputTokens": max_tokens}


def cost_of(usage):
    return Decimal(usage["inputCost"]) + Decimal(usage["outputCost"])


def priced(usage):
    """Whether the usage's costs are its token counts at the table's prices (to the rounding of
    the shown decimals)."""
    want_in = Decimal(usage["promptTokens"]) * PRICES["in"] / Decimal(10**6)
    want_out = Decimal(usage["completionTokens"]) * PRICES["out"] / Decimal(10**6)
    return (abs(Decimal(usage["inputCost"]) - want_in) < Decimal("1e-6")
            and abs(Decimal(usage["outputCost"]) - want_out) < Decimal("1e-6"))


def stream(urls, doc, on_token=None):
    """POST /stream and read it to its `completed` or `aborted` event: (token events, that event
    or None). `on_token(count, stream_id)` is called after each token event."""
    conn = connect(urls["completion"])
    try:
        conn.request("POST", "/stream", body=json.dumps(doc).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        stream_id = resp.getheader("X-Stream-Id")
        tokens = 0
        for event in sse_events(resp):
            if "token" in event:
                tokens += 1
                if on_token:
                    on_token(tokens, stream_id)
            if "completed" in event or "aborted" in event:
                return tokens, event
        return tokens, None
    finally:
        conn.close()


def gauge(urls, name, model=None):
    total = 0.0
    for key, value in scrape(urls["completion"]).items():
        if key == name or key.startswith(name + "{"):
            if model is None or f'model="{model}"' in key:
                total += value
    return total


def run_checks(server, urls, token, checks):
    model = "llama-1b-f16"
    text = get_json(urls["completion"], "/")
    image = get_json(urls["imagine"], "/")
    checks.record("health", all(s == "ready" for s in text["models"].values())
                  and image["model"]["status"] == "ready", json.dumps(text["models"]))

    before = balance(urls, token)
    got = post_json(urls["completion"], "/", body(token, model, 48))
    usage = got.json().get("usage", {}) if got.status == 200 else {}
    after = balance(urls, token)
    checks.record("billing", got.status == 200 and priced(usage) and before - after == cost_of(usage),
                  f"status {got.status}, usage {usage}, balance {before} -> {after}")

    before = balance(urls, token)
    tokens, final = stream(urls, body(token, model, 64))
    after = balance(urls, token)
    usage = final["response"]["usage"] if final else {}
    checks.record("stream", final is not None and "completed" in final and priced(usage)
                  and tokens >= 1 and before - after == cost_of(usage),
                  f"{tokens} token events, usage {usage}, balance {before} -> {after}")

    before = balance(urls, token)
    stopped = []

    def stop_at_eighth(seen, stream_id):
        if seen == 8 and not stopped:
            stopped.append(post_json(urls["completion"], "/stream/shutdown", {"streamId": stream_id}))

    seen, ended = stream(urls, body(token, model, 4000), on_token=stop_at_eighth)
    stopped = stopped[0] if stopped else None
    after = balance(urls, token)
    partial = stopped.json()["response"]["usage"] if stopped is not None and stopped.status == 200 else {}
    checks.record("shutdown", stopped is not None and stopped.status == 200 and ended is not None
                  and "aborted" in ended and partial.get("completionTokens", 10**9) < 4000
                  and before - after == cost_of(partial),
                  f"stopped after {seen} tokens: status {stopped.status if stopped else None}, "
                  f"usage {partial}, balance {before} -> {after}")

    active0 = gauge(urls, "hearth_completion_active_sequences", model)
    kv0 = gauge(urls, "hearth_completion_kv_cache_in_use_bytes", model)
    conns = []
    for i in range(16):
        c = connect(urls["completion"])
        c.request("POST", "/v1/chat/completions", body=json.dumps({
            "model": model, "stream": True, "max_tokens": 4000, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Tell story number {i}."}]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        conns.append(c)
    for c in conns:
        events = sse_events(c.getresponse())
        for n, _ in enumerate(events):
            if n >= 3:
                break
    peak_active = gauge(urls, "hearth_completion_active_sequences", model)
    peak_kv = gauge(urls, "hearth_completion_kv_cache_in_use_bytes", model)
    for c in conns:
        cut(c)
        c.close()
    deadline, active, kv = time.monotonic() + 10, None, None
    while time.monotonic() < deadline:
        active = gauge(urls, "hearth_completion_active_sequences", model)
        kv = gauge(urls, "hearth_completion_kv_cache_in_use_bytes", model)
        if active <= active0 and kv <= kv0:
            break
        time.sleep(0.1)
    held, charged, released = money_in_flight(urls)["completion"]
    in_flight = held - charged - released
    checks.record("disconnect", peak_active >= 16 + active0 and active <= active0 and kv <= kv0
                  and abs(in_flight) < 1e-9,
                  f"active {active0} -> {peak_active} -> {active}, KV bytes {kv0} -> {peak_kv} -> {kv}, "
                  f"credits held and not settled {in_flight}")

    before = balance(urls, token)
    got = post_json(urls["imagine"], "/", {"serviceToken": token, "prompt": "a lighthouse at dusk",
                                           "width": 512, "height": 512, "steps": 4, "seed": 7})
    doc = got.json() if got.status == 200 else {}
    png = base64.b64decode(doc.get("imageUrl", ",").split(",", 1)[1]) if doc else b""
    after = balance(urls, token)
    cost = Decimal(doc["usage"]["cost"]) if doc else Decimal(-1)
    # The price is per image at the reference size (1024x1024), by area.
    want = IMAGE_PRICE * Decimal(512 * 512) / Decimal(1024 * 1024)
    checks.record("image", got.status == 200 and png.startswith(b"\x89PNG") and cost == want
                  and before - after == cost,
                  f"status {got.status}, {len(png)} PNG bytes, cost {cost}, balance {before} -> {after}"
                  + ("" if got.status == 200 else f": {got.error_text()}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hearth", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cpu: a rehearsal of the whole run here")
    ap.add_argument("--small", action="store_true", help="a 2-layer model instead of the 1.1B one")
    a = ap.parse_args()
    shape = ["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--ff", "512"] \
        if a.small else []
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    for model, weights in MODELS.items():
        t = time.monotonic()
        out = subprocess.run([a.hearth, "dev", "random-model", os.path.join(a.work, model + ".gguf"),
                              "--tokenizer-from", a.tokenizer, "--weights", weights, *shape],
                             capture_output=True, text=True, check=True).stdout.strip()
        print(f"{out} in {time.monotonic() - t:.1f} s", flush=True)

    server = Server(a.hearth, os.path.join(a.work, "run"), os.path.join(a.out, "serve.log"), None,
                    services=("auth", "completion", "imagine"), models_toml=models_toml(a.work, a.device))
    server.env["HEARTH_COMPLETION_MAX_CONCURRENT_PER_USER"] = "0"
    server.env["HEARTH_IMAGINE_MAX_CONCURRENT_PER_USER"] = "0"
    os.makedirs(server.run_dir, exist_ok=True)
    server.prepare()
    server.cli("balance", "credit", "bench", "1000000")
    idp = server.cli("idp", "mint", "bench").strip()
    t = time.monotonic()
    server.start()
    server.wait_ready(timeout=180)
    print(f"hearth serve ready in {time.monotonic() - t:.1f} s: {server.urls}", flush=True)
    urls = dict(server.urls)  # host:port
    token = post_json(urls["auth"], "/token", {"userId": "bench", "idpToken": idp,
                                               "lifetimeSeconds": 3600}).json()["serviceToken"]
    checks = Checks()
    try:
        run_checks(server, urls, token, checks)
    except Exception as e:  # a check that broke is a failed check, and the load still runs
        checks.record("checks", False, f"{type(e).__name__}: {e}")
    load = os.path.join(a.out, "serve-load.jsonl")
    open(load, "w").close()
    for model in MODELS:
        for target in ("hearth", "openai"):
            part = os.path.join(a.work, "part.jsonl")
            cmd = [a.loadgen, "--target", target, "--url", "http://" + urls["completion"],
                   "--token", token, "--model", model, "--streams", a.streams,
                   "--max-tokens", str(a.max_tokens), "--json", part,
                   "--label", f"{model}-{target}"]
            if target == "openai":
                cmd.append("--ignore-eos")
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            print(done.stdout + done.stderr, flush=True)
            if done.returncode == 0:
                with open(part) as src, open(load, "a") as dst:
                    dst.write(src.read())
    text = scrape(urls["completion"])
    print("the server's counters after the load:")
    for k, v in sorted(text.items()):
        if k.startswith(("hearth_completion_", "hearth_billing_")) and "_bucket{" not in k:
            print(f"  {k} {v}")
    t = time.monotonic()
    code = server.stop(timeout=60)
    checks.record("sigterm", code == 0, f"exit status {code} after {time.monotonic() - t:.1f} s")
    with open(os.path.join(a.out, "serve-checks.json"), "w") as f:
        json.dump(checks.results, f, indent=1)
    failed = [k for k, v in checks.results.items() if not v["ok"]]
    print(f"serve checks: {len(checks.results) - len(failed)} of {len(checks.results)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
