#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own copies of the decode steps gpu_bench measures, for comparison.

Reads the tensors of each set from stdin, one "<set> <In|InOut|Out> <bytes>" line each (what
`gpu_bench --list-sets` prints), and times one step per set: every In/InOut tensor copied from
pinned host memory to the GPU with `copy_(..., non_blocking=True)`, every InOut/Out tensor back
the same way, then one synchronization of the current stream. Before the measured steps, one
step is checked: the device holds the uploaded bytes and the InOut bytes come back unchanged.
Prints one row per set (copies, bytes, median and 90th percentile in microseconds). Exits 77
when torch or a CUDA device is missing.

Usage: gpu_bench --list-sets | torch_copies.py [--steps N] [--set-steps N]
"""
import argparse
import collections
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000, help="measured steps of the small step")
    parser.add_argument("--set-steps", type=int, default=300, help="measured steps of the Qwen3 set")
    options = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch: not importable here")
        return 77
    if not torch.cuda.is_available():
        print("torch %s: no CUDA device" % torch.__version__)
        return 77

    sets = collections.OrderedDict()
    for line in sys.stdin:
        name, direction, size = line.split()
        sets.setdefault(name, []).append((direction, int(size)))

    device = torch.device("cuda", 0)
    stream = torch.cuda.current_stream(device)
    print("\ntorch %s (CUDA %s) on %s: copy_(non_blocking=True) per tensor from pinned memory + one "
          "stream synchronize" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(device)))
    print("%-14s %6s %10s %10s %10s" % ("set", "copies", "KiB", "us median", "us p90"))
    for name, tensors in sets.items():
        steps = options.steps if name == "small" else options.set_steps
        host = [torch.randint(0, 256, (size,), dtype=torch.uint8).pin_memory() for _, size in tensors]
        dev = [torch.empty(size, dtype=torch.uint8, device=device) for _, size in tensors]
        ups = [i for i, (d, _) in enumerate(tensors) if d != "Out"]
        downs = [i for i, (d, _) in enumerate(tensors) if d != "In"]

        def step():
            for i in ups:
                dev[i].copy_(host[i], non_blocking=True)
            for i in downs:
                host[i].copy_(dev[i], non_blocking=True)
            stream.synchronize()

        before = [host[i].clone() for i in ups]
        step()
        for k, i in enumerate(ups):
            if not torch.equal(dev[i].cpu(), before[k]) or not torch.equal(host[i], before[k]):
                print("torch: the checked step of set %s: tensor %d differs" % (name, i))
                return 1
        for _ in range(max(steps // 10, 5)):
            step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e6)
        times.sort()
        moved = sum(tensors[i][1] for i in ups) + sum(tensors[i][1] for i in downs)
        print("%-14s %6d %10.1f %10.1f %10.1f" % (name, len(ups) + len(downs), moved / 1024,
                                                 statistics.median(times), times[int(0.9 * (len(times) - 1))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
