#!/usr/bin/env python3
"""Renders Google Benchmark JSON from bench_staging into docs/performance.md and a gnuplot
script for the bind-overhead plot. Every number comes from the JSON given."""
import argparse
import json
import os
import re

parser = argparse.ArgumentParser()
parser.add_argument("json", help="Google Benchmark JSON of bench_staging")
parser.add_argument("markdown", help="the page to write (docs/performance.md)")
parser.add_argument("plot_base", help="where the plot scripts go (docs/bind_overhead)")
parser.add_argument("--instructions", help="output of bench/instructions.sh (mode and instructions per tensor)")
parser.add_argument("--build", help="the build directory, for the compiler of this run")
options = parser.parse_args()
src, md_path, plot_base = options.json, options.markdown, options.plot_base
data = json.load(open(src))
ctx = data["context"]
# With --benchmark_repetitions, the median of the repetitions stands for each benchmark.
rows, repetitions = {}, 1
for b in data["benchmarks"]:
    if b.get("run_type", "iteration") == "iteration":
        rows.setdefault(b["name"].removesuffix("/real_time"), b)
    elif b.get("aggregate_name") == "median":
        rows[b["run_name"].removesuffix("/real_time")] = b
        repetitions = max(repetitions, b.get("repetitions", 1))


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
try:
    memory_gb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal")) / 2**20
    memory = f"{memory_gb:.0f} GiB of memory"
except (OSError, StopIteration, ValueError):
    memory = "memory unknown"
load = ctx.get("load_avg")
load_text = f", load average {load[0]:.2f} at the start" if load else ""
compiler, buildtype = "the compiler unknown", "unknown"
if options.build:
    try:
        log = open(os.path.join(options.build, "meson-logs", "meson-log.txt")).read()
        found = re.search(r"C\+\+ compiler for the host machine: \S+ \((\w+) ([\d.]+)", log)
        if found:
            compiler = f'{ {"gcc": "g++", "clang": "clang++"}.get(found[1], found[1]) } {found[2]}'
        for option in json.load(open(os.path.join(options.build, "meson-info", "intro-buildoptions.json"))):
            if option["name"] == "buildtype":
                buildtype = option["value"]
    except (OSError, KeyError, ValueError):
        pass
instructions = {}
if options.instructions and os.path.exists(options.instructions):
    for line in open(options.instructions):
        parts = line.split()
        if len(parts) == 2:
            instructions[parts[0]] = float(parts[1])

out = []
w = out.append
w("# Performance\n")
w("Numbers on this page were produced by `./dev bench` (bench/bench_staging.cpp, rendered by")
w("bench/render.py) in one run, every comparison side by side in the same process"
  + (f"; each number is the median of {repetitions} repetitions.\n" if repetitions > 1 else ".\n"))
w(f"Machine of this run: {model}, {cpu}, {memory}{load_text}; date {ctx.get('date', '?')}; devstage built "
  f"with `--buildtype={buildtype}` ({compiler}).\n")
w("**The device is simulated.** There is no accelerator: every benchmark runs on `SimBackend`, whose "
  "device memory is this machine's RAM and whose copies are memcpy (on a worker thread per stream), or "
  "on a backend whose copies do nothing. Wall times are therefore this machine's memory system and "
  "threads, not a device's; the ratios are what carries over. Where the number of copies matters "
  "(section 5), the simulator's link model adds up what each copy would cost on an H200 link "
  "(`SimConfig::link`, summed in `SimStats::modeled_ns`; nothing sleeps).\n")
if load and ctx.get("num_cpus") and load[0] > ctx["num_cpus"]:
    w(f"The machine was shared during this run (a load average of {load[0]:.2f} on {ctx['num_cpus']} CPUs): "
      "wall times are noisy, single rows can be outliers; the copy counts, modeled µs and instruction counts "
      "do not depend on the load.\n")

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

w("### Instructions per tensor\n")
w("The same work counted in instructions, which (unlike a clock) do not depend on the machine's load: "
  "bench/instructions.cpp run under valgrind's callgrind by bench/instructions.sh — bind+finish of 1000 "
  "tensors of 512 B to 64 KiB, In, Out and InOut in turn, over a backend whose copies do nothing; 10 runs "
  "after a first run that grows, every instruction of the measured function and what it calls, divided "
  "by runs × tensors. Built at -O2 whatever the build type. Goal: RetainedBump at most 60 instructions per "
  "tensor with g++ -O2; the meson test `instructions_per_tensor` (suite `perf`, g++ builds without "
  "sanitizers where valgrind is installed) fails above it.\n")
if instructions:
    w("Each strategy once with Out args left as they are (`OutputPolicy::kernel_writes_all`) and once zeroed "
      "(`OutputPolicy::zero`, the default); the null backends have no device memset, so zeroing is an upload of "
      "zeros per Out arg, or, packed or mapped, a host memset of the mirror's Out group carried by the packed "
      "upload. `MapSmall<16384>` runs over the same null backends with `map_host` (a mapping's device address is "
      "its host address); every counted run was mapped.\n")
    w("| strategy | `kernel_writes_all` | zeroed (the default) | zeroing adds | `kernel_writes_all` / prefix sum |")
    w("| --- | ---: | ---: | ---: | ---: |")
    prefix = instructions.get("prefix-sum")
    labels = {"retained": "RetainedBump",
              "packed": "RetainedBump + PackSmall<16384> (the host copies into and out of the mirror included)",
              "mapped": "RetainedBump + MapSmall<16384> (the same host copies; nothing uploaded or copied back)",
              "per-tensor": "PerTensorMalloc (glibc's aligned_alloc and free included)",
              "prefix-sum": "prefix sum of the aligned sizes"}
    for mode, label in labels.items():
        if mode in instructions:
            plain = instructions[mode]
            zeroed = instructions.get(mode + "-zeroed")
            ratio = f"{plain / prefix:.1f}x" if prefix else "—"
            z = f"{zeroed:.1f}" if zeroed is not None else "—"
            added = f"{zeroed - plain:.1f}" if zeroed is not None else "—"
            w(f"| {label} | {plain:.1f} | {z} | {added} | {ratio} |")
    if "retained" in instructions:
        r = instructions["retained"]
        zeroed = instructions.get("retained-zeroed")
        with_zeroing = f": with the default zeroing it is {zeroed:.1f}" if zeroed is not None else ""
        w(f"\nGoal in this run: RetainedBump costs {r:.1f} instructions per tensor "
          f"({'met' if r <= 60 else 'not met'}: the goal is at most 60, {compiler} -O2; the goal and the meson "
          f"test are on the `kernel_writes_all` path{with_zeroing}).\n")
    steps = [(label, instructions[mode], instructions.get(mode.replace("-per-step", "-zeroed-per-step")))
             for mode, label in
             (("stream-retained-per-step", "RetainedBump"), ("stream-packed-per-step", "RetainedBump + PackSmall<16384>"),
              ("stream-mapped-per-step", "RetainedBump + MapSmall<16384>"))
             if mode in instructions]
    if steps:
        w("Per step of a pipelined stream loop (bench/instructions.cpp `stream-*`): 16 tensors of 256 B to 4 KiB "
          "per step, two slots on one stream over a backend whose copies do nothing and whose events are always "
          "complete, each slot's steps on host buffers of its own (nothing shared between runs in flight), the "
          "previous step's Completion dropped after the next step is finished; 1000 steps.\n")
        w("| strategy | `kernel_writes_all` | zeroed (the default) | zeroing adds |")
        w("| --- | ---: | ---: | ---: |")
        for label, value, zeroed in steps:
            z = f"{zeroed:.1f}" if zeroed is not None else "—"
            added = f"{zeroed - value:.1f}" if zeroed is not None else "—"
            w(f"| {label} | {value:.1f} | {z} | {added} |")
        w("\nEvery tensor of this loop is packed (or mapped), so zeroing there is a host memset of each step's Out "
          "group in the mirror.\n")
else:
    w("Not measured in this run (valgrind or the `instructions` executable was missing).\n")

w("## 2. Decode steady state on SimBackend\n")
decode_scale = (get("decode/RetainedBump") or {}).get("scale")
at_scale = f" at scale {decode_scale:g}" if decode_scale else ""
w(f"The Qwen3-14B-decode-shaped set (examples/qwen3_decode.hpp){at_scale}, inputs in pinned "
  "memory; time per synchronous bind+finish step after one untimed step (which grows RetainedBump's "
  "buffer), against a raw memcpy of the same bytes in and out on the calling thread (the physical limit "
  "here; the simulator's copies run on its stream's worker thread). Goal: RetainedBump within 1.15x of "
  "raw memcpy.\n")
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

w("\n## 5. Copies per decode step: packing, frames and stream order\n")
w("One copy call costs microseconds whatever its size, so a decode step of many small tensors is "
  "bound by the number of copies. Two input sets in pinned memory: the **small step** of the H200 "
  "measurements in docs/backends.md (four In tensors of 163840, 2048, 128 and 64 bytes, one Out tensor "
  "of 163840 bytes) and the **Qwen3-14B set** of section 2 (19 tensors). Each is staged by RetainedBump "
  "without packing (`NoPacking`), packing args of at most 16 KiB (`PackSmall<16384>`: the two "
  "160 KiB tensors of the small step stay direct), packing every arg of the small step "
  "(`PackSmall<163840>`), and as a frame whose inputs are written in place (`frame`: every tensor in "
  "the pinned mirror; one word per tensor is written each step, standing in for the engine writing its "
  "inputs there, while the other variants reuse inputs written once). **sync** is `bind(args)` + "
  "`finish(run)`; **stream** is `bind(args, stream)` + `finish(run, stream)` + `Completion::wait()` "
  "on two pipeline slots. The **limit** is one H2D of every input byte and one D2H of every output "
  "byte: modeled by the link model, and timed as bare copies on a stream (sync: the host waits after "
  "each, as a synchronous bind and finish must; stream: once).\n")
w("Copies and modeled µs are the simulator's counters over the timed steps (`SimStats` copies and "
  "`modeled_ns` deltas / steps); wall µs is this machine's time per step.\n")
link_row = next((b for n, b in rows.items() if n.startswith("copies/") and "link_latency_ns" in b), None)
if link_row:
    w(f"Link model of this run: {link_row['link_latency_ns'] / 1e3:.3f} µs per copy plus bytes at "
      f"{link_row['link_GBps']:.1f} GB/s from pinned memory, each way.\n")
variants = ["NoPacking", "PackSmall<16384>", "PackSmall<163840>", "frame", "limit"]
copy_summary = {}
for set_name, title in (("small_step", "Small step"), ("qwen3", "Qwen3-14B set")):
    limit_row = get(f"copies/{set_name}/limit/sync")
    if not limit_row:
        continue
    if limit_row.get("scale", 1) != 1:
        title += f" at scale {limit_row['scale']:g}"
    w(f"### {title}: {limit_row['tensors']:.0f} tensors, {limit_row['KB_per_step']:.1f} KB per step; "
      f"modeled limit {limit_row['limit_us']:.1f} µs\n")
    w("| variant | mode | copies per step | modeled µs per step | / modeled limit | wall µs per step | / timed limit | host waits per step | host memcpy KB per step |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("sync", "stream"):
        timed = get(f"copies/{set_name}/limit/{mode}")
        for variant in variants:
            b = get(f"copies/{set_name}/{variant}/{mode}")
            if not b:
                continue
            wall = ns(b) / 1e3
            name = "limit (one H2D + one D2H)" if variant == "limit" else variant
            waits = f"{b['host_waits_per_step']:.1f}" if "host_waits_per_step" in b else "—"
            memcpy = f"{b['mirror_copy_KB_per_step']:.1f}" if "mirror_copy_KB_per_step" in b else "—"
            timed_ratio = f"{wall / (ns(timed) / 1e3):.2f}x" if timed else "—"
            w(f"| {name} | {mode} | {b['copies_per_step']:.0f} | {b['modeled_us_per_step']:.1f} | "
              f"{b['modeled_over_limit']:.2f}x | {wall:.1f} | {timed_ratio} | {waits} | {memcpy} |")
            copy_summary[(set_name, variant, mode)] = b
    w("")
small = {k[1:]: v for k, v in copy_summary.items() if k[0] == "small_step"}
if all(k in small for k in (("NoPacking", "stream"), ("PackSmall<16384>", "stream"), ("PackSmall<163840>", "stream"), ("frame", "stream"))):
    none, pack16, pack_all, frame = (small[(v, "stream")] for v in ("NoPacking", "PackSmall<16384>", "PackSmall<163840>", "frame"))

    def at(b):
        return f"{b['copies_per_step']:.0f} copies, {b['modeled_us_per_step']:.1f} modeled µs ({b['modeled_over_limit']:.2f}x the limit)"

    w(f"In this run the small step, stream-ordered, goes from {at(none)} without packing to {at(pack16)} with "
      f"`PackSmall<16384>`, {at(pack_all)} with `PackSmall<163840>` and {at(frame)} as a frame. "
      f"`PackSmall<163840>` pays for its last copies with a host memcpy of "
      f"{pack_all['mirror_copy_KB_per_step']:.1f} KB per step into and out of the mirror (the last column); "
      f"the frame moves the same bytes with {frame['mirror_copy_KB_per_step']:.1f} KB of host memcpy.\n")
w("On the simulator a step's wall time is mostly handing work to a stream's worker thread and waiting "
  "for it (a synchronous bind and finish wait twice, a stream-ordered step once: the host waits column), "
  "so it measures this machine's thread wake-ups and memcpy, not a device's copy engine; the modeled "
  "µs are the estimate of the copies on an H200 link.\n")

ring_rows = {n: b for n, b in rows.items() if n.startswith("pageable_ring/")}
if ring_rows:
    w("\n## 6. Large pageable args: direct vs the pageable ring\n")
    w("`pageable_ring/*`: one arg per step, staged by a synchronous `bind` + `finish` on "
      "`Stager<SimBackend>` (`RetainedBump<>`): an In arg (the upload) or an Out arg (the copy-back). "
      "Ways: from pageable memory directly (the simulator's bounce buffer), through a `PageableRing` "
      "with its default chunks and `threads` copy threads besides the calling thread, and from pinned "
      "memory directly. The first step is not timed.\n")
    w("- **wall** GB/s: bytes over the wall time of the timed steps, this machine's memcpy and threads "
      "(the simulated device is RAM). Noisy.")
    w("- **modeled** GB/s: bytes over `SimStats::modeled_ns`, the link model's time of the copies. It "
      "counts the link only: the ring's host memcpy into and out of its chunks is wall time and is never "
      "modeled. Deterministic.")
    w("- **caller CPU ms**: the calling thread's CPU time per step.\n")
    names = {"direct": "pageable, direct", "pinned": "pinned, direct (reference)"}
    for way, title in (("upload", "Uploads (one In arg per step)"), ("copy_back", "Copy-backs (one Out arg per step)")):
        mine = {n[len(f"pageable_ring/{way}/"):]: b for n, b in ring_rows.items() if n.startswith(f"pageable_ring/{way}/")}
        sizes = sorted({int(k.split("MiB/")[0]) for k in mine})
        variants = []
        for k in mine:
            v = k.split("MiB/", 1)[1]
            if v not in variants:
                variants.append(v)
        if not sizes:
            continue
        label = lambda mib: f"{mib // 1024} GiB" if mib % 1024 == 0 else f"{mib} MiB"
        w(f"### {title}\n")
        w("| way | " + " | ".join(f"{label(m)} wall | {label(m)} modeled" for m in sizes)
          + f" | chunk copies per {label(sizes[-1])} step | caller CPU ms per {label(sizes[-1])} step |")
        w("| --- |" + " ---: | ---: |" * len(sizes) + " ---: | ---: |")
        for v in variants:
            cells = []
            for m in sizes:
                b = mine.get(f"{m}MiB/{v}")
                cells.append(f"{b['wall_GBps']:.2f} | {b['modeled_GBps']:.2f}" if b else "— | —")
            last = mine.get(f"{sizes[-1]}MiB/{v}")
            chunks = f"{last.get('ring_chunks_per_step', 0):.0f}" if last else "—"
            cpu = f"{last['cpu_time'] * {'ns': 1e-6, 'us': 1e-3, 'ms': 1, 's': 1e3}[last.get('time_unit', 'ns')]:.1f}" if last else "—"
            base = v.split("/")[0]  # less a suffix such as /iterations:8
            name = names.get(base, "pageable, ring, `threads = " + base.split(":")[-1] + "`")
            w(f"| {name} | " + " | ".join(cells) + f" | {chunks} | {cpu} |")
        w("")

w("\n## NVIDIA H200: bench/gpu (unmeasured)\n")
w("**No GPU figure is recorded here: no device was available, so `bench/gpu/run.sh` has not been run on an H200, its mapped rows included.** None of the numbers above come from a GPU. The program builds and runs end to end here against the CUDA stand-in the tests build, whose \"device\" is host memory and whose times mean nothing.\n")
w("The goals on an H200:\n")
w("- the small decode step (4 In + 1 Out, 330 KB) staged as an in-place frame at most 1.10x the raw packed copies (one H2D + one D2H + one wait), the packed-copy limit;\n- the mapped row below that limit: `MapSmall<262144>` (every tensor of the small step in the stager's mapped pinned mirror, no copy call) plus the bytes a kernel reads and writes there, timed at the pinned copy rate measured in the same run, below 1.00x the raw packed copies. No kernel runs in the bench, so the mapped rows' times are the staging alone and the program adds the mapped bytes' link time to them (bench/gpu/README.md);\n- a 1 GiB pageable upload through the pageable ring at 20 GB/s or more.\n")
w("What it measures, each way's bytes checked in one step before it is timed: the small decode step and the Qwen3 set (examples/qwen3_decode.hpp) staged synchronously, stream-ordered on 1 and 2 pipeline slots, with PackSmall, with MapSmall (`CudaBackend::map_host`, `cudaHostGetDevicePointer`), through an in-place frame, and with the copies batched (`cudaMemcpyBatchAsync`, where the runtime has it) or one call per copy; beside them the raw limits through the same backend (`cudaMemcpy` per tensor, `cudaMemcpyAsync` per tensor + one wait, one packed copy each way, one batch each way); PyTorch's `non_blocking` copies of the same sets where `torch` is importable (bench/gpu/torch_copies.py); and a 1 GiB pageable upload directly, through the pageable ring at 0, 1, 2, 4 and 8 copy threads, and from pinned memory.\n")
w("How to run it: `bench/gpu/run.sh --build-only` here (libstdc++ linked in statically, the CUDA runtime loaded at run time, a copy of libcudart.so.13 carried next to it), then `bench/gpu/run.sh` on the GPU machine with `bench/gpu/build/` copied along; it runs in a few minutes and prints the GPU's model, the driver, the runtime and the date, the tables, the ratios and the goal lines. Without a GPU it exits with 77; `DEVSTAGE_CUDART_LIBRARY=$PWD/build/tests/libcudart_shim.so bench/gpu/build/gpu_bench --steps 100 --set-steps 10 --scale 0.002 --scale-steps 2` runs it against the stand-in. bench/gpu/README.md has the options and the columns.\n")
w("\n## Reproduce\n")
w("`./dev bench` (builds with `--buildtype=release` in build-bench/, runs the benchmarks and, where "
  "valgrind is installed, the instruction counts, then rewrites this page and the plots). Extra "
  "arguments go to Google Benchmark, e.g. `./dev bench --benchmark_filter=copies`; "
  "`bench/instructions.sh build-bench/bench/instructions` prints the instruction counts alone.")
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
