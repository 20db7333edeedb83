#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A decode step's staging from Python against the same step in C, plain NumPy and plain torch.

The step (M = 32, V = 512): six inputs of a vLLM model runner — token ids int32 [B], positions
int64 [B], block table int32 [B, M], slot mapping int64 [B], temperature and top_p float32 [B] —
written into a frame, bound on a stream, finished on it, waited for, and the logits (float32
[B, V]) read back out. No kernel runs: what is timed is the staging (the logits are not zeroed
before it: output_policy "kernel_writes_all", as a model writes every logit). Variants, interleaved round
by round so that a shared machine's noise falls on all of them alike:

  python  the steady-state path: a Layout made once, frame(layout), the six inputs written by
          frame.write_all (checked, one call), bind, finish, wait, the logits copied out of
          frame.arrays (each slot's views made once), close;
  naive   frame(shapes) with the list of TensorShapes, numpy.asarray(frame[i])[:] = x, bind,
          finish, wait, the logits copied out, close;
  c       the same step in C (bench/c_step.c, built with the benchmarks);
  numpy   six copies into preallocated arrays and one back, the same bytes;
  torch   six copy_ into preallocated tensors and one back; with a GPU, into pinned tensors and
          .to('cuda', non_blocking=True), the logits back to the host, synchronized;
  python_ctypes  the steady-state path with the package's calls made through ctypes (where
          devstage._native is built; else the python column is that already).

On the simulator and on the CUDA stand-in (tests/cuda_shim, whose copies are memcpy) for B = 8,
64, 256 it prints one line per configuration with the median µs per step of each variant and, after
"p90", their 90th percentiles; then a cached device-tensor export (Run.tensors() of a slot already
exported) and a host-function launch (a no-op on a simulator stream), and the goals. --markdown
writes the section of docs/performance.md.

  python3 bench/python_step.py [--build build-bench] [--rounds 10] [--steps 300] [--markdown docs/performance.md]
"""
import argparse
import datetime
import glob
import importlib.util
import os
import platform
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
M, V = 32, 512
VARIANTS = ("python", "naive", "c", "numpy", "torch", "python_ctypes")


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build-bench"), help="the Meson build directory")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every variant, interleaved")
    parser.add_argument("--steps", type=int, default=300, help="timed steps of a variant per round")
    parser.add_argument("--batches", default="8,64,256")
    parser.add_argument("--backends", default="sim,stand-in")
    parser.add_argument("--markdown", help="the page whose Python-step section to write (docs/performance.md)")
    return parser.parse_args()


def find(build, *patterns):
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(build, pattern)))
        if found:
            return found[0]
    return None


def environment(build):
    """Points the package at the build's library and compiled calls; the stand-in's path."""
    library = find(build, "src/c/libdevstage_c.so")
    if library is None:
        sys.exit(f"python_step: no libdevstage_c.so under {build}: build it first (./dev bench does)")
    os.environ["DEVSTAGE_C_LIBRARY"] = library
    native = find(build, "python/_native*.so")
    os.environ.setdefault("DEVSTAGE_PY_NATIVE", native or "0")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    return find(build, "tests/libcudart_shim.so", "bench/libcudart_shim.so"), find(build, "bench/c_step")


def percentile(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Step:
    """One configuration: a backend and a batch size, and each variant's per-step µs."""

    def __init__(self, np, devstage, kind, batch, standin, c_step):
        self.np, self.devstage, self.kind, self.batch = np, devstage, kind, batch
        self.standin, self.c_step = standin, c_step
        self.backend = devstage.sim() if kind == "sim" else devstage.cuda(0, standin)
        self.stager = devstage.Stager(self.backend, pack_limit=16384, pipeline_slots=2,
                                      output_policy="kernel_writes_all")  # a model writes every logit
        self.stream = self.backend.create_stream()
        In, Out = devstage.IN, devstage.OUT
        self.shapes = [devstage.TensorShape(batch, "int32", In), devstage.TensorShape(batch, "int64", In),
                       devstage.TensorShape((batch, M), "int32", In), devstage.TensorShape(batch, "int64", In),
                       devstage.TensorShape(batch, "float32", In), devstage.TensorShape(batch, "float32", In),
                       devstage.TensorShape((batch, V), "float32", Out)]
        self.layout = self.stager.layout(self.shapes)
        rng = np.random.default_rng(batch)
        self.inputs = [rng.integers(0, 32000, batch).astype(np.int32), rng.integers(0, 4096, batch).astype(np.int64),
                       rng.integers(0, 1 << 20, (batch, M)).astype(np.int32),
                       rng.integers(0, 1 << 24, batch).astype(np.int64), rng.random(batch).astype(np.float32),
                       rng.random(batch).astype(np.float32)]
        self.logits = np.empty((batch, V), np.float32)
        self.samples = {variant: [] for variant in VARIANTS}
        self.on_device = []
        self.torch = self._torch_setup()

    def _torch_setup(self):
        try:
            import torch  # pylint: disable=import-outside-toplevel
        except ImportError:
            return None
        gpu = torch.cuda.is_available()
        sources = [torch.from_numpy(x) for x in self.inputs]
        host = [torch.empty_like(s) for s in sources]
        if gpu:
            host = [h.pin_memory() for h in host]
            device = [torch.empty_like(s, device="cuda") for s in sources]
            logits_device = torch.zeros((self.batch, V), dtype=torch.float32, device="cuda")
        else:
            device = [torch.empty_like(s) for s in sources]
            logits_device = torch.zeros((self.batch, V), dtype=torch.float32)
        return torch, gpu, sources, host, device, logits_device, torch.from_numpy(self.logits)

    def python(self, steps):
        stager, stream, layout, inputs, logits = self.stager, self.stream, self.layout, self.inputs, self.logits
        out = []
        clock = time.perf_counter
        for _ in range(steps):
            start = clock()
            frame = stager.frame(layout)
            frame.write_all(inputs)
            run = stager.bind(frame, stream)
            done = stager.finish(run, stream)
            done.wait()
            logits[:] = frame.arrays[6]
            done.close()
            out.append(clock() - start)
        return out

    def naive(self, steps):
        np, stager, stream, shapes, inputs, logits = self.np, self.stager, self.stream, self.shapes, self.inputs, \
            self.logits
        out = []
        clock = time.perf_counter
        for _ in range(steps):
            start = clock()
            frame = stager.frame(shapes)
            for i in range(6):
                np.asarray(frame[i])[:] = inputs[i]
            run = stager.bind(frame, stream=stream)
            done = stager.finish(run, stream=stream)
            done.wait()
            logits[:] = np.asarray(frame[6])
            done.close()
            out.append(clock() - start)
        return out

    def c(self, steps):
        target = "sim" if self.kind == "sim" else self.standin
        done = subprocess.run([self.c_step, target, str(self.batch), str(steps), str(M), str(V)], capture_output=True,
                              text=True, check=True)
        return [float(line) / 1e6 for line in done.stdout.split()]

    def numpy(self, steps):
        inputs, logits = self.inputs, self.logits
        targets = [x.copy() for x in inputs]
        device_logits = self.np.zeros_like(logits)
        out = []
        clock = time.perf_counter
        for _ in range(steps):
            start = clock()
            for target, source in zip(targets, inputs):
                target[:] = source
            logits[:] = device_logits
            out.append(clock() - start)
        return out

    def torch_copies(self, steps):
        if self.torch is None:
            return []
        torch, gpu, sources, host, device, logits_device, logits = self.torch
        out = []
        clock = time.perf_counter
        for _ in range(steps):
            start = clock()
            for h, s in zip(host, sources):
                h.copy_(s)
            if gpu:
                self.on_device = [h.to("cuda", non_blocking=True) for h in host]  # what the model would read
                logits.copy_(logits_device)  # synchronizes: the copy to pageable host memory
            else:
                for d, h in zip(device, host):
                    d.copy_(h)
                logits.copy_(logits_device)
            out.append(clock() - start)
        return out

    def python_ctypes(self, steps):
        calls = self.devstage._calls  # pylint: disable=protected-access
        if calls.native is None:
            return []
        calls.select("ctypes")
        try:
            return self.python(steps)
        finally:
            calls.select("native")

    def round(self, steps):
        variants = {"python": self.python, "naive": self.naive, "c": self.c, "numpy": self.numpy,
                    "torch": self.torch_copies, "python_ctypes": self.python_ctypes}
        order = list(VARIANTS)
        random.shuffle(order)
        for variant in order:
            self.samples[variant] += variants[variant](steps)

    def medians(self):
        return {variant: (percentile(s, 0.5) * 1e6, percentile(s, 0.9) * 1e6) if s else (float("nan"),) * 2
                for variant, s in self.samples.items()}

    def close(self):
        self.stager.close()
        self.stream.close()


def cached_export_and_launch(np, devstage, steps):
    """The median µs of a cached export (Run.arrays() of a slot exported before; torch's
    Run.tensors() when torch is there) and of a host-function launch on a simulator stream."""
    backend = devstage.sim()
    stager = devstage.Stager(backend, pack_limit=16384, pipeline_slots=2)
    stream = backend.create_stream()
    layout = stager.layout([devstage.TensorShape(8, "int32"), devstage.TensorShape((8, V), "float32", devstage.OUT)])
    export = "tensors" if importlib.util.find_spec("torch") is not None else "arrays"
    exports, launches = [], []
    clock = time.perf_counter

    def noop():
        pass

    for step in range(steps):
        frame = stager.frame(layout)
        run = stager.bind(frame, stream)
        getattr(run, export)()
        start = clock()
        getattr(run, export)()
        exports.append(clock() - start)
        start = clock()
        backend.launch_host_function(stream, noop)
        launches.append(clock() - start)
        done = stager.finish(run, stream)
        done.wait()
        done.close()
        if step % 64 == 63:
            stream.synchronize()
    stager.close()
    stream.close()
    return export, percentile(exports, 0.5) * 1e6, percentile(launches, 0.5) * 1e6


def machine(load):
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load:.1f} as the run started"


def main():
    options = parse()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    standin, c_step = environment(options.build)
    import numpy as np  # pylint: disable=import-outside-toplevel
    import devstage  # pylint: disable=import-outside-toplevel
    if c_step is None:
        sys.exit(f"python_step: no bench/c_step under {options.build}: build the benchmarks first (./dev bench does)")
    kinds = options.backends.split(",")
    if "stand-in" in kinds and standin is None:
        sys.exit(f"python_step: no libcudart_shim.so under {options.build} (the CUDA stand-in)")
    batches = [int(b) for b in options.batches.split(",")]
    steps = [Step(np, devstage, kind, batch, standin, c_step) for kind in kinds for batch in batches]
    for step in steps:  # warm: every slot grown, every view made
        step.round(20)
        step.samples = {variant: [] for variant in VARIANTS}
    for _ in range(options.rounds):
        for step in steps:
            step.round(options.steps)
    lines, rows = [], []
    for step in steps:
        m = step.medians()
        line = (f"B={step.batch} backend={step.kind} " + " ".join(f"{v}_us={m[v][0]:.1f}" for v in VARIANTS) + " p90: "
                + " ".join(f"{v}={m[v][1]:.1f}" for v in VARIANTS))
        lines.append(line)
        rows.append((step, m))
        print(line, flush=True)
        step.close()
    export, export_us, launch_us = cached_export_and_launch(np, devstage, 2000)
    print(f"cached export (Run.{export}()) {export_us:.2f} us; host-function launch {launch_us:.2f} us "
          f"(calls: {devstage._calls.IMPLEMENTATION})")  # pylint: disable=protected-access
    goals = goal_lines(rows, export_us, launch_us)
    for goal in goals:
        print(goal)
    if options.markdown:
        write_section(options.markdown, rows, lines, export, export_us, launch_us, goals, options,
                      devstage._calls.IMPLEMENTATION, load)  # pylint: disable=protected-access


def goal_lines(rows, export_us, launch_us):
    worst_steady = max(m["python"][0] - m["c"][0] for _, m in rows)
    worst_naive = max(m["naive"][0] - m["c"][0] for _, m in rows)
    slower = [(s.kind, s.batch, m["python"][0] - m["numpy"][0]) for s, m in rows if m["python"][0] > m["numpy"][0]]

    def verdict(value, limit):
        return "met" if value <= limit else f"missed by {value - limit:.1f} µs"

    return [
        f"goal: steady Python − C ≤ 5 µs at every B on both backends: worst {worst_steady:.1f} µs, "
        f"{verdict(worst_steady, 5)}",
        f"goal: naive Python − C ≤ 15 µs: worst {worst_naive:.1f} µs, {verdict(worst_naive, 15)}",
        f"goal: a cached device-tensor export ≤ 1 µs: {export_us:.2f} µs, {verdict(export_us, 1)}",
        f"goal: a host-function launch ≤ 10 µs: {launch_us:.2f} µs, {verdict(launch_us, 10)}",
        "goal: the steady Python step no slower than plain NumPy copies: " + (
            "met" if not slower else "missed where " + ", ".join(f"{k} B={b} (by {d:.1f} µs)" for k, b, d in slower)),
    ]


BEGIN, END = "<!-- python_step: begin -->", "<!-- python_step: end -->"


def write_section(path, rows, lines, export, export_us, launch_us, goals, options, implementation, load):
    out = [BEGIN, "## 7. A decode step from Python (bench/python_step.py)\n",
           f"Measured {datetime.date.today().isoformat()} on {machine(load)}, a machine shared with other work "
           f"(medians over {options.rounds} interleaved rounds of {options.steps} steps per variant; the package's "
           f"calls through `{implementation}`). The step: frame, the six inputs of a vLLM model runner written in "
           f"place (M = {M}), bind on a stream, finish, wait, the logits (float32 [B, {V}]) copied out; no kernel "
           "(and the logits not zeroed before it: `output_policy=\"kernel_writes_all\"`, as a model writes every one). "
           "`python` is the steady-state path (a Layout, `frame.write_all`, each slot's views made once), `naive` the "
           "frame of a list of TensorShapes with `numpy.asarray(frame[i])[:] = x` every step, `c` the same step in "
           "C (bench/c_step.c), `numpy` and `torch` six copies into preallocated arrays or tensors and one back "
           "(no GPU here: torch on the CPU), `python, ctypes calls` the steady-state path with the package's calls "
           "made through ctypes instead of `devstage._native`. The stand-in is tests/cuda_shim, whose copies are "
           "memcpy. `./dev bench` runs it after the other benchmarks; alone, after a build: "
           "`python3 bench/python_step.py --build build-bench --markdown docs/performance.md`.\n",
           "| backend | B | python | naive | C | NumPy | torch | python, ctypes calls | python − C | naive − C |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for step, m in rows:
        cells = " | ".join(f"{m[v][0]:.1f} (p90 {m[v][1]:.1f})" for v in VARIANTS)
        out.append(f"| {step.kind} | {step.batch} | {cells} | {m['python'][0] - m['c'][0]:.1f} | "
                   f"{m['naive'][0] - m['c'][0]:.1f} |")
    out.append(f"\nµs per step. A cached device-tensor export (`Run.{export}()` of a slot exported before): "
               f"{export_us:.2f} µs; a host-function launch (a no-op on a simulator stream, the launch call): "
               f"{launch_us:.2f} µs.\n")
    out += [f"- {goal.removeprefix('goal: ')}" for goal in goals]
    out.append("\nWhere the difference comes from. Each call of the package (frame, write_all, bind, finish, wait, "
               "close) is one crossing into C, and around it the interpreter does the run's bookkeeping: the "
               "one-thread lock, the Frame, Run and Completion objects, a weak reference as the slot passes from one "
               "to the next; the C step has none of it. `python, ctypes calls` shows what the crossings cost without "
               "`devstage._native`. The logits are copied out by NumPy in the Python variants and by memcpy in C. "
               "On the simulator each step also waits for the stream's worker thread, which the time between calls "
               "lets fall asleep: its medians and p90s spread most. The NumPy and torch rows copy host memory to "
               "host memory once; a staged step writes the inputs into the frame, uploads them (on the stand-in a "
               "memcpy), and copies the logits back and out, so at a large B it moves more bytes than they do.")
    out.append("\nThe lines the run printed:\n\n```\n" + "\n".join(lines) + "\n```\n")
    out.append(END)
    section = "\n".join(out)
    with open(path, encoding="utf-8") as page:
        text = page.read()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    elif "\n## Reproduce" in text:
        at = text.index("\n## Reproduce")
        text = text[:at] + "\n" + section + "\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w", encoding="utf-8") as page:
        page.write(text)


if __name__ == "__main__":
    main()
