#!/usr/bin/env python3
"""Parity of trainer's training-recipe pieces with PyTorch and torchvision (run by
tests/unit/loop/recipe_parity_test.cpp with TRAINER_PYTHON, and with the pip venv's Python where
it exists).

Subcommands (each prints one JSON object on stdout):
  plateau --mode min|max --factor F --patience P --min-lr M --lr L --trace v1,v2,...
      torch.optim.lr_scheduler.ReduceLROnPlateau stepped on the trace: {"lrs": [lr after each]}.
  mix --kind mixup|cutmix --lam L [--box x1,y1,x2,y2] --shape B,C,H,W --classes K
      --images IN.f32 --labels l0,l1,... --out-images OUT.f32 --out-targets OUT.f32
      torchvision.transforms.v2.MixUp/CutMix's transform for the given parameters where v2 has
      them (torchvision >= 0.16), else the classification reference's RandomMixup/RandomCutmix
      arithmetic; writes the mixed images and targets as raw float32: {"source": "..."}.
  clip --max-norm N --grads IN.f32 --sizes n1,n2,...
      torch.nn.utils.clip_grad_norm_ over tensors of those sizes: {"total": t, "grads": [...]}
      (the clipped gradients are written back to IN.f32.out).
  ema --decay D --batch B --steps S --epochs E
      torchvision reference's adjusted decay: {"decay": d}.
  batch --cases FILE.json
      FILE.json holds a list of argument lists, each one of the above: one JSON list of their
      results, in order (one interpreter start for many cases).
Exits 2 when torch is missing.
"""
import argparse
import json
import sys

try:
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"recipe_parity.py: cannot import {e.name}", file=sys.stderr)
    sys.exit(2)


def floats(s):
    return [float(x) for x in s.split(",") if x]


def ints(s):
    return [int(x) for x in s.split(",") if x]


def plateau(a):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=a.lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode=a.mode, factor=a.factor, patience=a.patience, min_lr=a.min_lr)
    lrs = []
    for v in floats(a.trace):
        sched.step(v)
        lrs.append(opt.param_groups[0]["lr"])
    return {"lrs": lrs}


def mix(a):
    shape = ints(a.shape)
    images = torch.from_file(a.images, size=shape[0] * shape[1] * shape[2] * shape[3],
                             dtype=torch.float32).view(*shape)
    labels = torch.tensor(ints(a.labels), dtype=torch.int64)
    try:
        import torchvision.transforms.v2 as v2
    except ImportError:
        v2 = None
    if v2 is not None and hasattr(v2, "MixUp"):
        if a.kind == "mixup":
            t = v2.MixUp(alpha=1.0, num_classes=a.classes)
            params = {"lam": a.lam, "labels": labels, "batch_size": shape[0]}
        else:
            x1, y1, x2, y2 = ints(a.box)
            lam = float(1.0 - (x2 - x1) * (y2 - y1) / (shape[3] * shape[2]))
            t = v2.CutMix(alpha=1.0, num_classes=a.classes)
            params = {"box": (x1, y1, x2, y2), "lam_adjusted": lam, "labels": labels,
                      "batch_size": shape[0]}
        call = getattr(t, "transform", None) or getattr(t, "_transform")
        out_images = call(images, params)
        out_targets = call(labels, params)
        source = "torchvision.transforms.v2 " + torchvision.__version__
    else:
        target = torch.nn.functional.one_hot(labels, num_classes=a.classes).to(images.dtype)
        batch = images.clone()
        batch_rolled = batch.roll(1, 0)
        target_rolled = target.roll(1, 0)
        if a.kind == "mixup":
            lam = a.lam
            batch_rolled.mul_(1.0 - lam)
            batch.mul_(lam).add_(batch_rolled)
        else:
            x1, y1, x2, y2 = ints(a.box)
            batch[:, :, y1:y2, x1:x2] = batch_rolled[:, :, y1:y2, x1:x2]
            lam = float(1.0 - (x2 - x1) * (y2 - y1) / (shape[3] * shape[2]))
        target_rolled.mul_(1.0 - lam)
        target.mul_(lam).add_(target_rolled)
        out_images, out_targets = batch, target
        source = "references/classification/transforms.py arithmetic, torch " + torch.__version__
    out_images.contiguous().numpy().tofile(a.out_images)
    out_targets.to(torch.float32).contiguous().numpy().tofile(a.out_targets)
    return {"source": source}


def clip(a):
    sizes = ints(a.sizes)
    flat = torch.from_file(a.grads, size=sum(sizes), dtype=torch.float32)
    params = []
    at = 0
    for n in sizes:
        p = torch.nn.Parameter(torch.zeros(n))
        p.grad = flat[at:at + n].clone()
        params.append(p)
        at += n
    total = torch.nn.utils.clip_grad_norm_(params, a.max_norm)
    torch.cat([p.grad for p in params]).numpy().tofile(a.grads + ".out")
    return {"total": float(total)}


def ema(a):
    # references/classification/train.py
    adjust = a.batch * a.steps / a.epochs
    alpha = 1.0 - a.decay
    alpha = min(1.0, alpha * adjust)
    return {"decay": 1.0 - alpha}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plateau")
    p.add_argument("--mode", required=True)
    p.add_argument("--factor", type=float, required=True)
    p.add_argument("--patience", type=int, required=True)
    p.add_argument("--min-lr", type=float, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--trace", required=True)
    m = sub.add_parser("mix")
    m.add_argument("--kind", required=True)
    m.add_argument("--lam", type=float, default=1.0)
    m.add_argument("--box", default="")
    m.add_argument("--shape", required=True)
    m.add_argument("--classes", type=int, required=True)
    m.add_argument("--images", required=True)
    m.add_argument("--labels", required=True)
    m.add_argument("--out-images", required=True)
    m.add_argument("--out-targets", required=True)
    c = sub.add_parser("clip")
    c.add_argument("--max-norm", type=float, required=True)
    c.add_argument("--grads", required=True)
    c.add_argument("--sizes", required=True)
    e = sub.add_parser("ema")
    e.add_argument("--decay", type=float, required=True)
    e.add_argument("--batch", type=int, required=True)
    e.add_argument("--steps", type=int, required=True)
    e.add_argument("--epochs", type=int, required=True)
    b = sub.add_parser("batch")
    b.add_argument("--cases", required=True)
    run = {"plateau": plateau, "mix": mix, "clip": clip, "ema": ema}
    a = ap.parse_args()
    if a.cmd == "batch":
        with open(a.cases) as f:
            cases = json.load(f)
        results = []
        for argv in cases:
            c = ap.parse_args(argv)
            results.append(dict(run[c.cmd](c), torch=torch.__version__))
        print(json.dumps(results))
        return
    out = run[a.cmd](a)
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
