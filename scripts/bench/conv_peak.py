#!/usr/bin/python3
"""Convolution peak of this machine for scripts/bench/vs_pytorch.sh (a benchmark, not a test).

Times a few large 3x3 convolutions (stride 1, padding 1, no bias) in PyTorch, FORWARD +
BACKWARD (gradient of the input and of the weight, as in training), and counts 3x the forward
FLOPs (2 * N * Cout * Cin * 9 * H * W per forward). fp32 is timed in NCHW and channels_last,
bf16 (bf16 input and weight, not autocast) in channels_last; each precision's peak is the best
GFLOP/s over its shapes and layouts, each shape's time the median of --iters timed passes after
one untimed one. Prints ONE JSON line: {"fp32": GFLOP/s, "bf16": GFLOP/s or null when this
CPU/torch cannot do it, "mode": "forward+backward", "threads", "batch", "shapes": [...]}.

Run it with /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import statistics
import sys
import time

import torch

SHAPES = [(256, 56), (512, 28)]  # (channels in = out, height = width)


def time_conv(n, c, hw, dtype, channels_last, iters):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).to(dtype=dtype, memory_format=fmt)
    x = torch.randn(n, c, hw, hw).to(dtype=dtype, memory_format=fmt).requires_grad_(True)
    times = []
    for i in range(iters + 1):
        conv.zero_grad(set_to_none=True)
        x.grad = None
        t = time.perf_counter()
        y = conv(x)
        y.backward(torch.ones_like(y))
        dt = time.perf_counter() - t
        if i > 0:
            times.append(dt)
    flops = 3 * 2.0 * n * c * c * 9 * hw * hw
    return flops / statistics.median(times) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--batch", type=int, default=16, help="N of every convolution")
    p.add_argument("--iters", type=int, default=3, help="timed passes per shape")
    p.add_argument("--precisions", default="fp32,bf16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"mode": "forward+backward", "threads": args.threads, "batch": args.batch,
              "shapes": [], "torch": torch.__version__}
    for precision in args.precisions.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
        layouts = [False, True] if precision == "fp32" else [True]
        best = None
        try:
            for c, hw in SHAPES:
                for cl in layouts:
                    g = time_conv(args.batch, c, hw, dtype, cl, args.iters)
                    result["shapes"].append({
                        "precision": precision, "shape": f"{args.batch}x{c}x{hw}x{hw} -> {c}, 3x3",
                        "layout": "channels_last" if cl else "nchw", "gflops": g})
                    best = g if best is None else max(best, g)
        except RuntimeError as e:  # e.g. no bf16 convolution on this CPU
            print(f"conv_peak: {precision}: {e}".splitlines()[0], file=sys.stderr)
            best = None
        result[precision] = best
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
