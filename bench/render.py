#!/usr/bin/env python3
"""Renders Google Benchmark JSON from bench_staging into docs/performance.md and a gnuplot
script for the bind-overhead plot. Every number comes from the JSON given."""
import json
import os
import sys

src, md_path, plot_base = sys.argv[1], sys.argv[2], sys.argv[3]
data = json.load(open(src))
ctx = data["context"]
rows = {b["name"].removesuffix("/real_time"): b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"}


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
w(f"Machine of this run: {model}, {cpu}, date {ctx.get('date', '?')}; devstage built with "
  "`--buildtype=release` (g++). No accelerator: device memory is the simulator's (host memory), "
  "so absolute times are this machine's; the ratios are what carries over.\n")

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
if plot:
    worst_prefix = max(r[1] / r[5] for r in plot)
    worst_pmr = max(r[1] / min(r[3], r[4]) for r in plot)
    w(f"\nGoals in this run: RetainedBump / prefix sum is at most {worst_prefix:.1f}x "
      f"({'met' if worst_prefix <= 2 else 'not met'}: the goal is 2x); against the faster pmr peer it is at most "
      f"{worst_pmr:.1f}x ({'met' if worst_pmr < 1 else 'not met'}: the goal is below 1x). A bind+finish does more "
      "than either peer — a plan with overflow checks, a lease and a device arg per tensor, the upload and "
      "copy-back calls, the release pass — and that bookkeeping is what this measures.")
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
    retained = get("decode/RetainedBump")
    if retained:
        ratio = ns(retained) / ns(raw)
        w(f"\nGoal in this run: RetainedBump at {ratio:.2f}x of raw memcpy "
          f"({'met' if ratio <= 1.15 else 'not met'}: the goal is 1.15x).")

w("\n## 3. Prefill with a growing sequence\n")
w("64 steps, 128 → 8192 tokens in steps of 128, two activations sized by the length; one "
  "iteration is the whole sweep.\n")
prefill_table = ["| growth policy | ms per sweep | regrows | peak device MB |", "| --- | ---: | ---: | ---: |"]
for name, b in rows.items():
    if name.startswith("prefill/"):
        prefill_table.append(
            f"| {name.split('/', 1)[1]} | {ns(b) / 1e6:.2f} | {b.get('regrows', 0):.0f} | {b.get('peak_retained_MB', 0):.1f} |")
out.extend(prefill_table)

w("\n### Step time against sequence length\n")
w("Steady state at each length (one activation of tokens × 5120 bf16 and a KV slice of tokens × 1024 "
  "bf16, in pinned memory), per strategy.\n")
w("| tokens | RetainedBump ms | PerTensorMalloc ms | ratio | PerTensorMalloc mallocs/step |")
w("| ---: | ---: | ---: | ---: | ---: |")
seq_plot = []
for n in (128, 512, 1024, 2048, 4096, 8192):
    r, p = get(f"prefill_step/RetainedBump/{n}"), get(f"prefill_step/PerTensorMalloc/{n}")
    if r and p:
        w(f"| {n} | {ns(r) / 1e6:.3f} | {ns(p) / 1e6:.3f} | {ns(p) / ns(r):.2f}x | {p.get('mallocs_per_step', 0):.0f} |")
        seq_plot.append((n, ns(r) / 1e6, ns(p) / 1e6))
w("\n![step time vs sequence length](step_time.svg)\n")

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

# docs/growth.md carries the same prefill table between markers.
growth_path = os.path.join(os.path.dirname(md_path), "growth.md")
begin, end = "<!-- prefill-table: written by bench/render.py -->", "<!-- /prefill-table -->"
if os.path.exists(growth_path):
    text = open(growth_path).read()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        table = "\n".join([f"Measured by `./dev bench` on {model}, {ctx.get('date', '?')}:", ""] + prefill_table)
        open(growth_path, "w").write(head + begin + "\n" + table + "\n" + end + tail)

docs = os.path.dirname(plot_base)


def plot_script(name, rows, title, xlabel, ylabel, series):
    base = os.path.join(docs, name)
    with open(base + ".dat", "w") as f:
        for row in rows:
            f.write(" ".join(str(x) for x in row) + "\n")
    lines = ", \\\n     ".join(
        f"'{base}.dat' using 1:{i + 2} with linespoints title '{label}'" for i, label in enumerate(series))
    with open(base + ".gp", "w") as f:
        f.write(f"""set terminal svg size 720,420 dynamic background rgb "white"
set output '{base}.svg'
set title '{title} ({model})'
set xlabel '{xlabel}'
set ylabel '{ylabel}'
set logscale xy
set key top left
set grid
plot {lines}
""")


plot_script("bind_overhead", plot, "bind+finish overhead per run, copies excluded", "tensors per run", "ns per run",
            ["RetainedBump", "PerTensorMalloc", "pmr monotonic", "pmr unsync pool", "prefix sum"])
plot_script("step_time", seq_plot, "prefill step time on SimBackend", "tokens", "ms per step",
            ["RetainedBump", "PerTensorMalloc"])
