#!/usr/bin/env python3
"""torchvision's evaluation preprocessing for trainer's data.eval_resize: shorter_side parity test
(run by tests/unit/data/eval_preset_parity_test.cpp).

For each image path given, runs what torchvision's reference ClassificationPresetEval does before
the float conversion, on a PIL image:
    transforms.Compose([Resize(resize, interpolation, antialias=True), CenterCrop(crop),
                        PILToTensor()])
and writes the result, [crop, crop, 3] uint8 RGB (HWC), as raw bytes to OUT/<i>.rgb (i = the
image's position on the command line). The C++ side compares them with its own pipeline.

Depends only on torch, torchvision and PIL. Exits 0 on success, 2 when an import fails.
"""
import argparse
import os
import sys

try:
    import torch  # noqa: F401
    from PIL import Image
    from torchvision import transforms
    from torchvision.transforms import InterpolationMode
except ImportError as e:  # pragma: no cover
    print(f"eval_preset_parity.py: cannot import {e.name}: run scripts/install-deps.sh "
          f"(python3-torch python3-torchvision python3-pil)", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resize", type=int, required=True)
    ap.add_argument("--crop", type=int, required=True)
    ap.add_argument("--interpolation", choices=["bilinear", "bicubic"], default="bilinear")
    ap.add_argument("--out", required=True)
    ap.add_argument("images", nargs="+")
    a = ap.parse_args()
    mode = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}
    preset = transforms.Compose([
        transforms.Resize(a.resize, interpolation=mode[a.interpolation], antialias=True),
        transforms.CenterCrop(a.crop),
        transforms.PILToTensor(),
    ])
    for i, path in enumerate(a.images):
        with Image.open(path) as im:
            chw = preset(im.convert("RGB"))
        hwc = chw.permute(1, 2, 0).contiguous()
        with open(os.path.join(a.out, f"{i}.rgb"), "wb") as f:
            f.write(hwc.numpy().tobytes())
    print(f"wrote {len(a.images)} images")


if __name__ == "__main__":
    main()
