"""What the GPU itself spends on about one decode step, from Nsight Compute's CSV: the kernels
`ncu --metrics gpu__time_duration.sum --csv --print-units base` timed (a window of launches in
bench_device's one-stream decode loop), their summed durations, and the kernels that took most.
Set beside bench_device's wall time of a step, it says how much of a step is the GPU computing
and how much is the host issuing work.

    ncu ... bench_device --streams 1 ... | python3 scripts/gpu/step_profile.py LAYERS [TOP]

A step is counted by its attention: LAYERS launches of the decode attention kernel (not of its
merge, `_combine`). Then the TOP kernels by launch shape (grid and block): a matrix product's
launches by the matrix they read, with their mean, least and most.
"""
import csv
import sys
from collections import defaultdict


def main():
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    rows = [r for r in csv.reader(line for line in sys.stdin if line.startswith('"'))]
    if not rows:
        print("step profile: ncu printed no kernels")
        return
    head = rows[0]
    name, metric, value = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    grid = head.index("Grid Size") if "Grid Size" in head else None
    block = head.index("Block Size") if "Block Size" in head else None
    total, count, by_name = 0.0, 0, defaultdict(lambda: [0, 0.0])
    by_shape = defaultdict(list)
    for r in rows[1:]:
        if r[metric] != "gpu__time_duration.sum":
            continue
        ns = float(r[value].replace(",", ""))
        total += ns
        count += 1
        short = r[name].split("(")[0].split("<")[0][:60]
        by_name[short][0] += 1
        by_name[short][1] += ns
        if grid is not None and block is not None:
            by_shape[(short, r[grid], r[block])].append(ns)
    steps = sum(n for k, (n, _) in by_name.items() if k.startswith("decode_attn") and not k.endswith("_combine")) / layers
    print(f"step profile: {count} kernels, {total / 1e3:.1f} us of GPU time"
          + (f"; {steps:.1f} steps: {total / steps / 1e3:.1f} us and {count / steps:.0f} launches a step"
             if steps else ""))
    for k, (n, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {ns / 1e3:9.1f} us  {n:4d}x  {k}")
    if by_shape:
        print("by launch shape (grid, block): total, launches, mean, least, most (us)")
        for (k, g, b), v in sorted(by_shape.items(), key=lambda kv: -sum(kv[1]))[:top]:
            print(f"  {sum(v) / 1e3:9.1f}  {len(v):4d}x  {sum(v) / len(v) / 1e3:7.2f}  "
                  f"{min(v) / 1e3:7.2f}  {max(v) / 1e3:7.2f}  {k} {g} {b}")


if __name__ == "__main__":
    main()
