#!/usr/bin/env python3
"""Renders Google Benchmark JSON from bench_staging into docs/performance.md and a gnuplot
script for the bind-overhead plot. Every number comes from the JSON given."""
import json
import sys

src, md_path, plot_base = sys.argv[1], sys.argv[2], sys.argv[3]
data = json.load(open(src))
ctx = data["context"]
rows = {b["name"]: b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"}


def get(name):
    return rows.get(name)


def ns(b):
    scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


machine = ctx.get("host_name", "?")
cpu = f'{ctx.get("num_cpus", "?")} CPUs at {ctx.get("mhz_per_cpu", "?")} MHz'
try:
    model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
except (OSError, StopIteration):
    model = "unknown CPU"

out = []
w = out.append
w("# Performance\n")
w("Numbers on this page were produced by `./dev bench` (bench/bench_staging.cpp, rendered by")
w("bench/render.py) in one run, every comparison side by side in the same process.\n")
w(f"Machine of this run: {model}, {cpu}, date {ctx.get('date', '?')}, "
  f"library build type {ctx.get('library_build_type', '?')}. No accelerator: device memory is "
  "the simulator's (host memory), so absolute times are this machine's; the ratios are what carries over.\n")

w("## 1. Bind+finish overhead per run, copies excluded\n")
w("A backend whose copies do nothing, so only the staging bookkeeping is timed. Peers: "
  "`std::pmr::monotonic_buffer_resource` and `std::pmr::unsynchronized_pool_resource` handing "
  "out 1024-aligned pieces of the same device buffer; the limit: a bare prefix sum of the "
  "aligned sizes. Goal: RetainedBump within 2x of the prefix sum and faster than both pmr peers.\n")
w("| tensors | RetainedBump ns | PerTensorMalloc ns | pmr monotonic ns | pmr unsync pool ns | prefix sum ns | RetainedBump / prefix sum | RetainedBump / pmr monotonic |")
w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
plot = []
for n in (1, 19, 256, 4096):
    names = ["RetainedBump", "PerTensorMalloc", "pmr_monotonic", "pmr_unsync_pool", "prefix_sum"]
    b = [get(f"overhead/{x}/{n}") for x in names]
    if any(x is None for x in b):
        continue
    t = [ns(x) for x in b]
    w(f"| {n} | {t[0]:.0f} | {t[1]:.0f} | {t[2]:.0f} | {t[3]:.0f} | {t[4]:.0f} | {t[0] / t[4]:.2f}x | {t[0] / t[2]:.2f}x |")
    plot.append((n, *t))
w("\n![bind overhead vs tensor count](bind_overhead.svg)\n")

w("## 2. Decode steady state on SimBackend\n")
w("The Qwen3-14B-decode-shaped set (examples/qwen3_decode.hpp) at scale 0.001, inputs in pinned "
  "memory; time per bind+finish step, against a raw memcpy of the same bytes in and out "
  "(the physical limit here). Goal: RetainedBump within 1.15x of raw memcpy.\n")
w("| variant | ms per step | / raw memcpy | device mallocs per step | MB moved per step |")
w("| --- | ---: | ---: | ---: | ---: |")
raw = get("decode/raw_memcpy")
for name in ("RetainedBump", "PerTensorMalloc"):
    b = get(f"decode/{name}")
    if b and raw:
        w(f"| {name} | {ns(b) / 1e6:.3f} | {ns(b) / ns(raw):.2f}x | {b.get('mallocs_per_step', 0):.2f} | {b.get('MB_per_step', 0):.1f} |")
if raw:
    w(f"| raw memcpy | {ns(raw) / 1e6:.3f} | 1.00x | — | — |")

w("\n## 3. Prefill with a growing sequence\n")
w("64 steps, 128 → 8192 tokens in steps of 128, two activations sized by the length; one "
  "iteration is the whole sweep.\n")
w("| growth policy | ms per sweep | regrows | peak device MB |")
w("| --- | ---: | ---: | ---: |")
for name, b in rows.items():
    if name.startswith("prefill/"):
        w(f"| {name.split('/', 1)[1]} | {ns(b) / 1e6:.2f} | {b.get('regrows', 0):.0f} | {b.get('peak_retained_MB', 0):.1f} |")

w("\n## 4. Pinned vs pageable host memory, and the pinned cache\n")
w("| host memory | ms per step | bounced MB per step |")
w("| --- | ---: | ---: |")
for name in ("pinned", "pageable"):
    b = get(f"host_memory/{name}")
    if b:
        w(f"| {name} | {ns(b) / 1e6:.3f} | {b.get('bounced_MB_per_step', 0):.1f} |")
w("\n| pinned pool, 1 MiB allocate+release | ns per pair | backend allocations in the run |")
w("| --- | ---: | ---: |")
for name in ("CachingPinned", "DirectPinned"):
    b = get(f"pinned_pool/{name}/1048576")
    if b:
        w(f"| {name} | {ns(b):.0f} | {b.get('backend_allocations', 0):.0f} |")

w("\n## Reproduce\n")
w("`./dev bench` (builds with `--buildtype=release` in build-bench/, runs, rewrites this page "
  "and the plot). Extra arguments go to Google Benchmark, e.g. `./dev bench --benchmark_filter=decode`.")
open(md_path, "w").write("\n".join(out) + "\n")

with open(plot_base + ".dat", "w") as f:
    for row in plot:
        f.write(" ".join(str(x) for x in row) + "\n")
with open(plot_base + ".gp", "w") as f:
    f.write(f"""set terminal svg size 720,420 dynamic
set output '{plot_base}.svg'
set title 'bind+finish overhead per run (copies excluded)'
set xlabel 'tensors per run'
set ylabel 'ns per run'
set logscale xy
set key top left
set grid
plot '{plot_base}.dat' using 1:2 with linespoints title 'RetainedBump', \\
     '' using 1:3 with linespoints title 'PerTensorMalloc', \\
     '' using 1:4 with linespoints title 'pmr monotonic', \\
     '' using 1:5 with linespoints title 'pmr unsync pool', \\
     '' using 1:6 with linespoints title 'prefix sum'
""")
