#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A decode loop shaped like vLLM's input preparation, staged through a devstage frame.

Every step the engine prepares, per request, the token ids (int32 [B]), positions (int64 [B]),
the block table (int32 [B, M]), the slot mapping (int64 [B]) and the sampling parameters
(temperature and top_p, float32 [B]); the model reads them and two weight tables resident on the
device, and writes the logits (float32 [B, V]); the engine samples the next tokens from them.

With devstage the inputs are written in place into a frame (the stager's pinned mirror), bound
with one upload, and the logits come back with one copy; the weights are device-resident
tensors of the frame, passed through. The loop is the steady-state path: the frame's layout is
made once, and each pipeline slot's NumPy views of the frame and tensors of the staged args are
made the first time the slot is used and reused after (nothing rebuilt per step). On the
simulator the model is a Python host function enqueued on the stager's stream, reading the
staged memory as NumPy arrays (Run.arrays(), DLPack kDLCPU); on CUDA it is torch on torch's
current stream, reading the staged args as torch tensors (Run.tensors()), and the same loop
written with plain torch (pin_memory() and .to('cuda', non_blocking=True)) runs beside it, both
timed. Every step's logits are checked against a host reference (bit for bit on the
simulator) and the run ends with PASS or FAIL (exit status 1).

    python3 python/examples/decode_loop.py                       # the simulator
    python3 python/examples/decode_loop.py --backend cuda        # a GPU: devstage and plain torch
"""
import argparse
import sys
import time

import numpy as np

import devstage

BLOCK = 16  # tokens per KV-cache block


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max-blocks", type=int, default=16)
    parser.add_argument("--cuda-library", default=None, help="libcudart to load (default: the usual search)")
    return parser.parse_args()


class Requests:
    """The engine's per-request state, and the inputs of a step made from it."""

    def __init__(self, batch, max_blocks, vocab, rng):
        self.tokens = rng.integers(0, vocab, batch).astype(np.int32)
        self.positions = rng.integers(0, 8 * BLOCK, batch).astype(np.int64)
        self.block_table = np.zeros((batch, max_blocks), np.int32)
        self.next_block = 1
        for b in range(batch):
            for j in range(int(self.positions[b]) // BLOCK + 1):
                self._allocate(b, j)
        self.temperature = rng.uniform(0.5, 1.5, batch).astype(np.float32)
        self.top_p = rng.uniform(0.8, 1.0, batch).astype(np.float32)

    def _allocate(self, b, j):
        self.block_table[b, j] = self.next_block
        self.next_block += 1

    def slot_mapping(self):
        blocks = self.block_table[np.arange(len(self.positions)), self.positions // BLOCK].astype(np.int64)
        return blocks * BLOCK + self.positions % BLOCK

    def write(self, views):
        """Writes the step's inputs into (NumPy views of) the six input tensors."""
        tokens, positions, table, slots, temperature, top_p = views
        tokens[:] = self.tokens
        positions[:] = self.positions
        table[:] = self.block_table
        slots[:] = self.slot_mapping()
        temperature[:] = self.temperature
        top_p[:] = self.top_p

    def advance(self, logits):
        """Greedy sampling of the next tokens; positions move on, a block is added when one fills."""
        self.tokens = np.argmax(logits, axis=1).astype(np.int32)
        self.positions += 1
        for b in np.nonzero(self.positions % BLOCK == 0)[0]:
            self._allocate(b, int(self.positions[b]) // BLOCK)


def model_numpy(tokens, positions, table, slots, temperature, top_p, embedding, weights, out):
    """The model in NumPy (the reference, and the simulator's kernel): logits from the token's
    embedding, scaled by the position, shifted by the request's blocks and slot, times the output
    weights, over the temperature, plus log(top_p)."""
    context = (table.sum(axis=1, dtype=np.int64) % 97).astype(np.float32) / np.float32(97)
    slot = (slots % 89).astype(np.float32) / np.float32(89)
    hidden = embedding[tokens] * np.cos(positions.astype(np.float32) * np.float32(0.01))[:, None]
    hidden = hidden + (context + slot)[:, None]
    out[:] = (hidden @ weights) / temperature[:, None] + np.log(top_p)[:, None]


def shapes_of(args, embedding_device, weights_device):
    In, Out = devstage.IN, devstage.OUT
    return [
        devstage.TensorShape(args.batch, "int32", In),
        devstage.TensorShape(args.batch, "int64", In),
        devstage.TensorShape((args.batch, args.max_blocks), "int32", In),
        devstage.TensorShape(args.batch, "int64", In),
        devstage.TensorShape(args.batch, "float32", In),
        devstage.TensorShape(args.batch, "float32", In),
        devstage.TensorShape((args.vocab, args.hidden), "float32", In, device=embedding_device),
        devstage.TensorShape((args.hidden, args.vocab), "float32", In, device=weights_device),
        devstage.TensorShape((args.batch, args.vocab), "float32", Out),
    ]


def run_sim(args, embedding, weights):
    """The loop on the simulator: the model is a host function on the stager's stream."""
    backend = devstage.sim()
    embedding_device = backend.device_malloc(embedding.nbytes)
    weights_device = backend.device_malloc(weights.nbytes)
    backend.copy_to_device(embedding_device, embedding.ctypes.data, embedding.nbytes)
    backend.copy_to_device(weights_device, weights.ctypes.data, weights.nbytes)
    stager = devstage.Stager(backend, pack_limit=16384, pipeline_slots=2)
    stream = backend.create_stream()
    layout = stager.layout(shapes_of(args, embedding_device, weights_device))  # made once
    reference = Requests(args.batch, args.max_blocks, args.vocab, np.random.default_rng(7))
    engine = Requests(args.batch, args.max_blocks, args.vocab, np.random.default_rng(7))
    failures = 0
    start = time.perf_counter()
    for step in range(args.steps):
        frame = stager.frame(layout)
        engine.write(frame.arrays[:6])
        run = stager.bind(frame, stream=stream)
        device = run.arrays()  # the staged memory (kDLCPU), ordered on `stream`; made once per slot
        backend.launch_host_function(stream, lambda device=device: model_numpy(*device))
        del device
        done = stager.finish(run, stream=stream)
        done.wait()
        logits = frame.arrays[8]
        expected = np.empty((args.batch, args.vocab), np.float32)
        model_numpy(reference.tokens, reference.positions, reference.block_table, reference.slot_mapping(),
                    reference.temperature, reference.top_p, embedding, weights, expected)
        if not np.array_equal(logits, expected):
            failures += 1
            print(f"step {step}: logits differ from the reference in {np.sum(logits != expected)} places")
        engine.advance(logits)
        reference.advance(expected)
        del logits
        done.close()
    elapsed = time.perf_counter() - start
    stats = stager.stats
    print(f"devstage on the simulator: {args.steps} steps in {elapsed * 1e3:.1f} ms; per step "
          f"{stats['uploads'] / args.steps:.0f} upload(s), {stats['copy_backs'] / args.steps:.0f} copy-back(s), "
          f"{stats['device_mallocs']} device malloc(s) in all")
    if backend.callback_errors:
        print(backend.callback_errors[0])
        failures += 1
    stream.close()
    stager.close()
    backend.device_free(embedding_device)
    backend.device_free(weights_device)
    return failures


def run_cuda(args, embedding, weights):
    """The loop on a GPU: devstage, then plain torch, both timed in this run."""
    import torch  # pylint: disable=import-outside-toplevel
    if not torch.cuda.is_available():
        print("decode_loop: --backend cuda needs a CUDA build of torch and a GPU", file=sys.stderr)
        sys.exit(77)
    torch.cuda.set_device(args.device)
    backend = devstage.cuda(args.device, args.cuda_library)
    e = torch.from_numpy(embedding).cuda()
    w = torch.from_numpy(weights).cuda()

    def model_torch(tokens, positions, table, slots, temperature, top_p, out):
        context = (table.sum(dim=1) % 97).float() / 97.0
        slot = (slots % 89).float() / 89.0
        hidden = e[tokens.long()] * torch.cos(positions.float() * 0.01)[:, None] + (context + slot)[:, None]
        torch.matmul(hidden, w, out=out)
        out.div_(temperature[:, None]).add_(torch.log(top_p)[:, None])

    stager = devstage.Stager(backend, pack_limit=16384, pipeline_slots=2)
    stream = torch.cuda.current_stream()
    engine = Requests(args.batch, args.max_blocks, args.vocab, np.random.default_rng(7))
    plain = Requests(args.batch, args.max_blocks, args.vocab, np.random.default_rng(7))
    failures = 0
    layout = stager.layout(shapes_of(args, e, w))
    times = {"devstage": 0.0, "torch": 0.0}
    logits_plain = torch.empty((args.batch, args.vocab), dtype=torch.float32).pin_memory()
    for step in range(args.steps):
        start = time.perf_counter()
        frame = stager.frame(layout)
        engine.write(frame.arrays[:6])
        run = stager.bind(frame, stream=stream)
        tensors = run.tensors()  # torch tensors of the staged args, made once per slot
        model_torch(*tensors[:6], tensors[8])
        del tensors
        done = stager.finish(run, stream=stream)
        done.wait()
        logits = frame.arrays[8].copy()
        done.close()
        times["devstage"] += time.perf_counter() - start

        start = time.perf_counter()
        inputs = [torch.from_numpy(a).pin_memory() for a in (plain.tokens, plain.positions, plain.block_table,
                                                             plain.slot_mapping(), plain.temperature, plain.top_p)]
        on_device = [t.to("cuda", non_blocking=True) for t in inputs]
        out = torch.empty((args.batch, args.vocab), dtype=torch.float32, device="cuda")
        model_torch(*on_device, out)
        logits_plain.copy_(out, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        times["torch"] += time.perf_counter() - start
        if not np.allclose(logits, logits_plain.numpy(), rtol=1e-4, atol=1e-4):
            failures += 1
            print(f"step {step}: devstage's logits differ from plain torch's")
        engine.advance(logits)
        plain.advance(logits_plain.numpy())
    name = torch.cuda.get_device_name(args.device)
    for way, seconds in times.items():
        print(f"{way} on {name}: {seconds / args.steps * 1e6:.1f} us per step over {args.steps} steps")
    return failures


def main():
    args = parse()
    rng = np.random.default_rng(11)
    embedding = rng.standard_normal((args.vocab, args.hidden), dtype=np.float32)
    weights = (rng.standard_normal((args.hidden, args.vocab), dtype=np.float32) / np.float32(8))
    failures = run_sim(args, embedding, weights) if args.backend == "sim" else run_cuda(args, embedding, weights)
    print("PASS" if failures == 0 else f"FAIL: {failures} step(s) wrong")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
