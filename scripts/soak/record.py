"""Bookkeeping: every answer by class (Recorder), latency percentiles, the soak users, and the
per-interval table."""

import math
import threading
from decimal import Decimal

from common import USER_COMPLETIONS, USER_IMAGES, fmt_elapsed

# The classes of the table, in its column order; `cut` and `stop` (client disconnects and
# /stream/shutdown) are counted but have no latency column: their time is the driver's choice.
LATENCY_COLUMNS = ["auth", "complete", "stream", "v1", "v1-stream", "markdown", "hostile", "image", "metrics"]


class Recorder:
    """Every answer (or failure to get one), by class; drained once per table row."""

    def __init__(self):
        self.lock = threading.Lock()
        self.window = []           # (class, status, ms) since the last row
        self.totals = {}           # class -> {status or "error": count}
        self.latencies = {}        # class -> [ms] over the whole run
        self.unexpected = {}       # "class status message" -> count
        self.unexpected_count = 0
        self.drained_unexpected = 0
        self.errors = 0            # requests that got no answer at all
        self.tolerated = {}        # "class status" -> count (429s)
        self.skipped = {}          # class -> requests not sent because the class was backed up

    def answer(self, cls, status, ms, verdict, note=""):
        """verdict: "ok", "tolerated" (a 429: reported, not a failure) or "unexpected"."""
        with self.lock:
            self.window.append((cls, status, ms))
            self.totals.setdefault(cls, {}).setdefault(status, 0)
            self.totals[cls][status] += 1
            self.latencies.setdefault(cls, []).append(ms)
            if verdict == "tolerated":
                key = f"{cls} {status}"
                self.tolerated[key] = self.tolerated.get(key, 0) + 1
            elif verdict == "unexpected":
                self.unexpected_count += 1
                key = f"{cls} {status} {note[:160]}"
                self.unexpected[key] = self.unexpected.get(key, 0) + 1

    def error(self, cls, ms, exc):
        with self.lock:
            self.window.append((cls, "error", ms))
            self.totals.setdefault(cls, {}).setdefault("error", 0)
            self.totals[cls]["error"] += 1
            self.errors += 1
            self.unexpected_count += 1
            key = f"{cls} no answer: {type(exc).__name__}: {str(exc)[:120]}"
            self.unexpected[key] = self.unexpected.get(key, 0) + 1

    def skip(self, cls):
        with self.lock:
            self.skipped[cls] = self.skipped.get(cls, 0) + 1

    def drain(self):
        """The answers since the last call, and how many of them were unexpected."""
        with self.lock:
            window, self.window = self.window, []
            unexpected, self.drained_unexpected = self.unexpected_count - self.drained_unexpected, self.unexpected_count
        return window, unexpected


def percentiles(values):
    if not values:
        return None
    s = sorted(values)
    nearest_rank = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]
    return nearest_rank(0.50), nearest_rank(0.99)


def fmt_pp(values):
    p = percentiles(values)
    if p is None:
        return "–"
    fmt = lambda ms: f"{ms / 1000:.1f}s" if ms >= 10000 else f"{ms:.0f}"
    return f"{fmt(p[0])}/{fmt(p[1])}"


class User:
    """A soak user: its tokens, its driver-side slots and what the answers said it was charged.
    A `cutter` user also hangs up on requests mid-answer; only the ledger knows what those cost."""

    def __init__(self, name, cutter):
        self.name, self.cutter = name, cutter
        self.idp = None
        self.token = None
        self.completions = threading.BoundedSemaphore(USER_COMPLETIONS)
        self.images = threading.BoundedSemaphore(USER_IMAGES)
        self.lock = threading.Lock()
        self.reported = []  # Decimal costs of the answers that said what they cost
        self.cuts = 0       # requests this user hung up on
        self.cut_bound = Decimal(0)  # the most those could have cost together

    def charged(self, cost):
        with self.lock:
            self.reported.append(Decimal(cost))


class Table:
    """The per-interval table: printed to stdout and appended to the report as it goes."""

    HEADER = (["elapsed", "RSS MiB min/median/max", "fds", "threads", "workers (MiB)", "answers", "2xx", "4xx", "5xx", "unexpected"]
              + [f"{c} p50/p99 ms" for c in LATENCY_COLUMNS])

    def __init__(self, path):
        self.path = path
        self.rows = []

    def write(self, text):
        print(text, flush=True)
        with open(self.path, "a") as f:
            f.write(text + "\n")

    def start(self):
        self.write("| " + " | ".join(self.HEADER) + " |")
        self.write("|" + "|".join("---:" if i else "---" for i in range(len(self.HEADER))) + "|")

    def row(self, elapsed, proc, window, unexpected):
        by_class = {}
        classes = {"2xx": 0, "4xx": 0, "5xx": 0}
        for cls, status, ms in window:
            by_class.setdefault(cls, []).append(ms)
            if isinstance(status, int) and 200 <= status < 600:
                classes[f"{status // 100}xx"] = classes.get(f"{status // 100}xx", 0) + 1
        rss = ("/".join(f"{proc[f'rss_{w}_kib'] / 1024:.0f}" for w in ("min", "med", "max"))
               if "rss_med_kib" in proc else f"{proc['rss_kib'] / 1024:.0f}")
        cells = [fmt_elapsed(elapsed), rss, str(proc["fds"]), str(proc["threads"]),
                 f"{proc['workers']} ({proc['workers_rss_kib'] / 1024:.0f})", str(len(window)),
                 str(classes["2xx"]), str(classes["4xx"]), str(classes["5xx"]), str(unexpected)]
        cells += [fmt_pp(by_class.get(c, [])) for c in LATENCY_COLUMNS]
        self.rows.append((elapsed, proc))
        self.write("| " + " | ".join(cells) + " |")
