"""Parses a Prometheus text exposition (format 0.0.4) from stdin with the official Python client's
parser, checks what the parser leaves to the reader, and prints the samples as JSON.

    python tests/clients/prometheus_check.py < metrics.txt

Output: {"families": [{"name", "type", "documentation"}], "samples": [{"name", "labels",
"value"}]}; non-finite values are written as strings ("+Inf", "-Inf", "NaN") so that the JSON is
strict. Exits 1 with a message on stderr when the text does not parse or breaks a rule:
every family typed, no series twice, histogram buckets cumulative and ending in +Inf, which
equals _count. Used by tests/metrics.rs.
"""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def fail(message):
    print(f"prometheus_check: {message}", file=sys.stderr)
    sys.exit(1)


def value_of(v):
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return v


def check_histogram(family):
    series = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        entry = series.setdefault(key, {"buckets": [], "count": None})
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            entry["count"] = s.value
    for key, entry in series.items():
        buckets = entry["buckets"]
        if not buckets or not math.isinf(buckets[-1][0]):
            fail(f"{family.name}{dict(key)}: no +Inf bucket last")
        bounds = [b for b, _ in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            fail(f"{family.name}{dict(key)}: bucket bounds not increasing")
        counts = [c for _, c in buckets]
        if any(a > b for a, b in zip(counts, counts[1:])):
            fail(f"{family.name}{dict(key)}: bucket counts not cumulative")
        if entry["count"] != counts[-1]:
            fail(f"{family.name}{dict(key)}: _count {entry['count']} != +Inf bucket {counts[-1]}")


def main():
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and others on bad input
        fail(f"does not parse: {e!r}")
    out = {"families": [], "samples": []}
    seen = set()
    for family in families:
        if family.type in ("unknown", "untyped"):
            fail(f"{family.name}: no TYPE")
        if family.type == "histogram":
            check_histogram(family)
        out["families"].append(
            {"name": family.name, "type": family.type, "documentation": family.documentation}
        )
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                fail(f"series twice: {s.name}{s.labels}")
            seen.add(key)
            out["samples"].append({"name": s.name, "labels": s.labels, "value": value_of(s.value)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
