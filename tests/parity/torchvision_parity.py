#!/usr/bin/env python3
"""Parity of trainer's C++ networks with torchvision (run by tests/unit/model/test_parity.cpp).

1. Loads the C++ model's state dict (--ours-state) into torchvision.models.<arch>() with
   load_state_dict(strict=True), checks the key order, evaluates the input from --ours-io in eval
   mode and asserts max |logits - C++ logits| <= --tol.
2. Builds a fresh torchvision model (torch.manual_seed(--seed)), runs one training-mode forward
   without grad so the BatchNorm statistics are not trivial, and writes its state dict
   (--theirs-state) and its eval-mode logits on the same input (--theirs-io) for the C++ side.

Depends only on torch, torchvision, numpy, json and struct (safetensors read/written by hand).
Prints `key=value` result lines; exits 0 on success, 1 on a mismatch, 2 when torch is missing.
"""
import argparse
import json
import struct
import sys
import time

try:
    import numpy as np  # noqa: F401  (torch.frombuffer needs nothing else, but numpy is required)
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"torchvision_parity.py: cannot import {e.name}: run scripts/install-deps.sh "
          f"(python3-torch python3-torchvision python3-numpy)", file=sys.stderr)
    sys.exit(2)

DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    """Returns ({name: tensor} in header order, metadata)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def build(arch, num_classes, head_hidden):
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    if head_hidden > 0:
        def hidden(features):
            return [torch.nn.Linear(features, head_hidden), torch.nn.ReLU(),
                    torch.nn.Linear(head_hidden, num_classes)]
        if arch.startswith("efficientnet"):  # after torchvision's Dropout: classifier.1, .3
            dropout, linear = model.classifier[0], model.classifier[1]
            model.classifier = torch.nn.Sequential(dropout, *hidden(linear.in_features))
        else:  # fc.0, fc.2
            model.fc = torch.nn.Sequential(*hidden(model.fc.in_features))
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", required=True)
    p.add_argument("--num-classes", type=int, required=True)
    p.add_argument("--head-hidden", type=int, default=0)
    p.add_argument("--ours-state", required=True)
    p.add_argument("--ours-io", required=True, help="safetensors with 'input' and 'logits'")
    p.add_argument("--theirs-state", required=True)
    p.add_argument("--theirs-io", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--init-seed", type=int, default=None,
                   help="the torch seed the C++ model was built with: reports (never fails on) "
                        "whether torchvision draws the same initial parameters from it")
    args = p.parse_args()
    start = time.monotonic()
    torch.set_num_threads(2)
    print(f"torch={torch.__version__} torchvision={torchvision.__version__}")

    # 1. Our weights in torchvision.
    ours, _ = read_safetensors(args.ours_state)
    io, _ = read_safetensors(args.ours_io)
    x, our_logits = io["input"], io["logits"]
    model = build(args.arch, args.num_classes, args.head_hidden)
    expected_keys = list(model.state_dict().keys())
    model.load_state_dict(ours, strict=True)
    model.eval()
    with torch.no_grad():
        tv_logits = model(x)
    diff = (tv_logits - our_logits).abs().max().item()
    order_ok = list(ours.keys()) == expected_keys
    print(f"ours_in_torchvision_max_abs_diff={diff:.3e}")
    print(f"ours_key_order_matches={'yes' if order_ok else 'no'}")
    print(f"logits_max_abs={our_logits.abs().max().item():.3e}")
    ok = diff <= args.tol and order_ok and tv_logits.shape == our_logits.shape

    if args.init_seed is not None and args.head_hidden == 0:
        # Informational: with one libtorch underneath, the same seed should give the same draws
        # when the modules are created and initialised in torchvision's order.
        torch.manual_seed(args.init_seed)
        same_seed = build(args.arch, args.num_classes, 0)
        init_diff = max((p - ours[n]).abs().max().item() for n, p in same_seed.named_parameters())
        print(f"same_seed_init_max_abs_diff={init_diff:.3e}")

    # 2. torchvision's own weights for the C++ side.
    torch.manual_seed(args.seed)
    fresh = build(args.arch, args.num_classes, args.head_hidden)
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        fresh.train()
        fresh(torch.randn(4, 3, x.shape[2], x.shape[3], generator=gen))
        fresh.eval()
        logits = fresh(x)
    write_safetensors(args.theirs_state, fresh.state_dict(), {"source": "torchvision"})
    write_safetensors(args.theirs_io, {"input": x, "logits": logits})
    print(f"elapsed_s={time.monotonic() - start:.1f}")
    if not ok:
        print(f"MISMATCH: max |diff| {diff:.3e} > tol {args.tol:.1e} or key order differs",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
