#!/usr/bin/env python3
"""Parity of trainer's training augmentation with torchvision (run by
tests/unit/data/augment_parity_test.cpp, which writes the --manifest directory).

1. Ops: the C++ side wrote a textured uint8 RGB image (input.rgb, H x W x 3) and, per case, its
   output for fixed parameters. This applies torchvision's functional op (the uint8 tensor path,
   _functional_tensor) or autoaugment._apply_op to the same [3, H, W] tensor with the same
   parameters and compares:
     - vflip, rot90, posterize, solarize, invert, equalize, erase: exactly;
     - point and colour ops, bilinear geometry, AugMix's mix: max |diff| <= 1 (we replay
       torchvision 0.14's float32 steps, Debian's; newer torchvision, 0.26 here, converts
       adjust_hue's result with convert_image_dtype, x * 255.999 truncated, where 0.14 truncates
       x * 255: hue is then within 1 level, and a ColorJitter chain whose later brightness or
       contrast factor amplifies that level within 2);
     - nearest-neighbour geometry (rotate, shear, translate): |diff| <= 1 except at most 0.5 % of
       the pixels, where float32 rounding of a source coordinate within an ulp of a .5 tie can
       pick the neighbouring pixel (torch's grid and bmm order of float operations are not ours).
2. Tables: our augmentation spaces (op names and order, signedness, magnitudes) against
   _augmentation_space of TrivialAugmentWide, RandAugment, AutoAugment and AugMix (magnitudes
   within 1e-5 relative: torch's float32 linspace differs from the exactly rounded value by an
   ulp on a few bins, and differently between torch versions).
3. Distributions: our TrivialAugmentWide and RandAugment(num_ops=2, magnitude=9) draws against
   the frequencies the op table defines (op uniform, bin uniform, sign fair): Pearson's
   chi-square over the (op, signed magnitude) cells, failing when the Wilson-Hilferty z > 4.5
   (p < 4e-6; the draws are seeded, so the result is reproducible).

Depends only on torch, torchvision, numpy and json. Prints one line per check; exits 0 on
success, 1 on a mismatch, 2 when torch is missing.
"""
import argparse
import importlib
import inspect
import json
import math
import os
import sys
from collections import Counter

try:
    import numpy as np
    import torch
    import torchvision
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode, autoaugment
except ImportError as e:  # pragma: no cover
    print(f"augment_parity.py: cannot import {e.name}: run scripts/install-deps.sh "
          f"(python3-torch python3-torchvision python3-numpy)", file=sys.stderr)
    sys.exit(2)

NEAREST_MISMATCH = 0.005
EXACT = {"vflip", "rot90", "erase"}
EXACT_OPS = {"Identity", "Posterize", "Solarize", "Invert", "Equalize"}
GEOMETRIC_OPS = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def _functional_tensor():
    try:  # torchvision >= 0.15
        return importlib.import_module("torchvision.transforms._functional_tensor")
    except ImportError:
        return importlib.import_module("torchvision.transforms.functional_tensor")


# torchvision > 0.14: adjust_hue ends in convert_image_dtype (see the docstring).
HUE_CONVERTS = "convert_image_dtype" in inspect.getsource(_functional_tensor().adjust_hue)


def load_rgb(path, h, w):
    data = np.fromfile(path, dtype=np.uint8)
    if data.size != h * w * 3:
        raise SystemExit(f"{path}: {data.size} bytes, expected {h * w * 3}")
    return torch.from_numpy(data.reshape(h, w, 3)).permute(2, 0, 1).contiguous()


def interpolation(name):
    return InterpolationMode.NEAREST if name == "nearest" else InterpolationMode.BILINEAR


def theirs(kind, args, img):
    """torchvision's result for one case (uint8 [3, H, W])."""
    if kind == "vflip":
        return F.vflip(img)
    if kind == "rot90":
        return torch.rot90(img, args["k"], [-2, -1])
    if kind == "rotate_fill0":  # RandomRotation: fill 0 given per channel
        return F.rotate(img, args["angle"], interpolation=InterpolationMode.NEAREST,
                        fill=[0.0, 0.0, 0.0])
    if kind == "brightness":
        return F.adjust_brightness(img, args["factor"])
    if kind == "contrast":
        return F.adjust_contrast(img, args["factor"])
    if kind == "saturation":
        return F.adjust_saturation(img, args["factor"])
    if kind == "hue":
        return F.adjust_hue(img, args["factor"])
    if kind == "op":
        return autoaugment._apply_op(img, args["op"], float(args["magnitude"]),
                                     interpolation=interpolation(args["interpolation"]), fill=None)
    if kind == "color_jitter":  # ColorJitter.forward with drawn parameters
        out = img
        for fn in args["order"]:
            if fn == 0 and args["brightness"] >= 0:
                out = F.adjust_brightness(out, args["brightness"])
            elif fn == 1 and args["contrast"] >= 0:
                out = F.adjust_contrast(out, args["contrast"])
            elif fn == 2 and args["saturation"] >= 0:
                out = F.adjust_saturation(out, args["saturation"])
            elif fn == 3 and args["hue"] >= -1:
                out = F.adjust_hue(out, args["hue"])
        return out
    if kind == "augmix":  # AugMix.forward's mixing with drawn weights and chains
        batch = img.view(1, *img.shape)
        mix = torch.tensor([args["original"]], dtype=torch.float32).view(1, 1, 1, 1) * batch
        for weight, chain in zip(args["weights"], args["chains"]):
            aug = batch
            for name, magnitude in chain:
                aug = autoaugment._apply_op(aug, name, float(magnitude),
                                            interpolation=InterpolationMode.BILINEAR, fill=None)
            mix.add_(torch.tensor([weight], dtype=torch.float32).view(1, 1, 1, 1) * aug)
        return mix.view(img.shape).to(dtype=img.dtype)
    if kind == "erase":
        v = torch.tensor(args["rgb"], dtype=torch.uint8)[:, None, None]
        return F.erase(img, args["y"], args["x"], args["h"], args["w"], v)
    raise SystemExit(f"unknown case kind {kind}")


def tolerance(kind, args):
    """(max |diff| allowed, fraction of pixels allowed beyond it)."""
    if kind in EXACT:
        return 0, 0.0
    if kind == "op":
        if args["op"] in EXACT_OPS:
            return 0, 0.0
        if args["op"] in GEOMETRIC_OPS and args["interpolation"] == "nearest":
            return 1, NEAREST_MISMATCH
        return 1, 0.0
    if kind == "rotate_fill0":
        return 1, NEAREST_MISMATCH
    if kind == "color_jitter" and HUE_CONVERTS:
        return 2, 0.0
    return 1, 0.0


def check_ops(manifest, root):
    h, w = manifest["h"], manifest["w"]
    img = load_rgb(os.path.join(root, manifest["input"]), h, w)
    failures = 0
    for case in manifest["cases"]:
        ours = load_rgb(os.path.join(root, case["file"]), case["h"], case["w"])
        ref = theirs(case["kind"], case["args"], img)
        label = case["kind"] + " " + json.dumps(case["args"], sort_keys=True)
        if tuple(ref.shape) != tuple(ours.shape):
            print(f"FAIL {label}: shape {tuple(ours.shape)} vs torchvision {tuple(ref.shape)}")
            failures += 1
            continue
        diff = (ours.to(torch.int32) - ref.to(torch.int32)).abs()
        max_diff, allowed_frac = tolerance(case["kind"], case["args"])
        beyond = (diff > max_diff).any(dim=0).float().mean().item()  # fraction of pixels
        changed = (ref != img).any().item() if ref.shape == img.shape else True
        ok = beyond <= allowed_frac
        if case["kind"] == "op" and case["args"]["op"] == "Identity":
            changed = True  # nothing to change
        if not changed:
            print(f"FAIL {label}: torchvision left the image unchanged (a vacuous case)")
            failures += 1
        print(f"{'ok  ' if ok else 'FAIL'} {label}: max |diff| {diff.max().item()}, "
              f"pixels beyond {max_diff}: {100 * beyond:.3f} % (allowed {100 * allowed_frac:.1f} %), "
              f"pixels differing: {100 * (diff > 0).any(dim=0).float().mean().item():.3f} %")
        failures += 0 if ok else 1
    return failures


def their_spaces(h, w):
    return {
        "trivial_augment_wide": autoaugment.TrivialAugmentWide()._augmentation_space(31),
        "rand_augment": autoaugment.RandAugment()._augmentation_space(31, (h, w)),
        "auto_augment": autoaugment.AutoAugment()._augmentation_space(10, (h, w)),
        "augmix": autoaugment.AugMix()._augmentation_space(10, (h, w)),
    }


def check_tables(manifest):
    failures = 0
    spaces = their_spaces(manifest["h"], manifest["w"])
    for name, rows in manifest["spaces"].items():
        ref = spaces[name]
        names = [r[0] for r in rows]
        if names != list(ref.keys()):
            print(f"FAIL table {name}: ops {names} vs torchvision {list(ref.keys())}")
            failures += 1
            continue
        worst = 0.0
        for op, signed, mags in rows:
            ref_mags, ref_signed = ref[op]
            ref_list = ref_mags.tolist() if ref_mags.ndim > 0 else []
            if signed != ref_signed or len(mags) != len(ref_list):
                print(f"FAIL table {name} {op}: signed {signed}/{ref_signed}, "
                      f"{len(mags)}/{len(ref_list)} bins")
                failures += 1
                continue
            for a, b in zip(mags, ref_list):
                worst = max(worst, abs(a - b) / max(1.0, abs(b)))
        ok = worst <= 1e-5
        failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} table {name}: {len(rows)} ops in torchvision's order, "
              f"max relative magnitude difference {worst:.2e}")
    return failures


def expected_cells(space, magnitude_bin=None):
    """{(op, signed magnitude): probability} from a torchvision op table: op uniform, bin uniform
    (or fixed), sign fair for signed ops."""
    cells = Counter()
    p_op = 1.0 / len(space)
    for op, (mags, signed) in space.items():
        values = [0.0] if mags.ndim == 0 else [float(v) for v in mags.tolist()]
        if magnitude_bin is not None and mags.ndim > 0:
            values = [values[magnitude_bin]]
        for v in values:
            p = p_op / len(values)
            if signed:
                cells[(op, round(v, 4))] += p / 2
                cells[(op, -round(v, 4) if v != 0 else "-0")] += p / 2
            else:
                cells[(op, round(v, 4))] += p
    return cells


def observed_key(op, magnitude, signed):
    if signed and magnitude == 0 and math.copysign(1.0, magnitude) < 0:
        return (op, "-0")
    return (op, round(magnitude, 4))


def chi_square(name, draws_path, space, magnitude_bin=None):
    expected = expected_cells(space, magnitude_bin)
    counts = Counter()
    n = 0
    with open(draws_path) as f:
        for line in f:
            op, magnitude = line.split()
            counts[observed_key(op, float(magnitude), space[op][1])] += 1
            n += 1
    unknown = set(counts) - set(expected)
    if unknown:
        print(f"FAIL draws {name}: cells torchvision cannot produce: {sorted(unknown, key=str)[:5]}")
        return 1
    stat = 0.0
    for cell, p in expected.items():
        e = n * p
        stat += (counts.get(cell, 0) - e) ** 2 / e
    k = len(expected) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    ok = z <= 4.5
    print(f"{'ok  ' if ok else 'FAIL'} draws {name}: {n} ops over {len(expected)} (op, magnitude) "
          f"cells, chi-square {stat:.1f} with {k} dof, Wilson-Hilferty z = {z:.2f} (fail > 4.5)")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", required=True)
    args = parser.parse_args()
    root = os.path.dirname(os.path.abspath(args.manifest))
    with open(args.manifest) as f:
        manifest = json.load(f)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"image {manifest['h']}x{manifest['w']}")
    failures = check_ops(manifest, root)
    failures += check_tables(manifest)
    spaces = their_spaces(manifest["h"], manifest["w"])
    failures += chi_square("trivial_augment_wide",
                           os.path.join(root, manifest["draws"]["trivial_augment_wide"]),
                           spaces["trivial_augment_wide"])
    failures += chi_square("rand_augment", os.path.join(root, manifest["draws"]["rand_augment"]),
                           spaces["rand_augment"], manifest["rand_augment_magnitude"])
    print(f"result={'ok' if failures == 0 else 'FAIL'} failures={failures}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
