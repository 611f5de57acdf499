#!/usr/bin/env python3
"""trace_step.py - what one decode step spends on the GPU, from a kernel
timeline: the "start_ns end_ns name" lines of bench/cupti/trace.c
(scripts/gpu-run.sh trace).

A decode step begins with the embedding kernel. The last STEPS steps of the
trace (default 5) are taken; for each kernel name the script prints its
calls per step and its mean in-graph duration, and for the step as a whole
the span (first start to last end), the time some kernel ran (the union of
their intervals: programmatic launch overlaps them), and the time none ran. Unlike
ncu's replay of each kernel alone with flushed caches, these are the
durations inside the replayed graph, with programmatic dependent launch.

usage: trace_step.py TRACE.txt [STEPS]
"""
import re
import sys
from collections import defaultdict


def short(name):
    """A kernel's name without its template arguments and parameters."""
    n = re.sub(r"\(.*", "", name)
    n = re.sub(r"^void ", "", n)
    base = re.sub(r"<.*", "", n)
    args = re.search(r"<(.*)>", n)
    return base + ("<" + args.group(1)[:40] + ">" if args else "")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    steps_wanted = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = []
    with open(sys.argv[1]) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                start, end = int(parts[0]), int(parts[1])
                rows.append((start, end - start, parts[2]))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if "embed" in r[2]]
    if len(starts) < steps_wanted + 1:
        sys.exit("trace_step: %d embedding kernels in the trace, want %d" % (len(starts), steps_wanted + 1))
    # the last step ends with the last kernel of the trace
    bounds = starts[-steps_wanted:] + [len(rows)]
    per = defaultdict(lambda: [0, 0])
    span = busy = 0
    for s in range(steps_wanted):
        seg = rows[bounds[s]:bounds[s + 1]]
        end = max(r[0] + r[1] for r in seg)
        span += end - seg[0][0]
        cur_s, cur_e = seg[0][0], seg[0][0]
        for r in seg:  # the union of the kernels' intervals: they overlap under programmatic launch
            if r[0] > cur_e:
                busy += cur_e - cur_s
                cur_s = r[0]
            cur_e = max(cur_e, r[0] + r[1])
        busy += cur_e - cur_s
        for r in seg:
            p = per[short(r[2])]
            p[0] += 1
            p[1] += r[1]
    n = steps_wanted
    print("decode step (mean of the last %d): span %.1f us, some kernel running %.1f us, none %.1f us, %d kernels"
          % (n, span / n / 1e3, busy / n / 1e3, (span - busy) / n / 1e3, sum(p[0] for p in per.values()) // n))
    print("%-64s %6s %10s %9s" % ("kernel", "calls", "us/step", "us each"))
    for k, (c, d) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print("%-64s %6.1f %10.1f %9.2f" % (k[:64], c / n, d / n / 1e3, d / c / 1e3))


if __name__ == "__main__":
    main()
