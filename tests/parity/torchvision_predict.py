#!/usr/bin/env python3
"""A trained model directory in torchvision's own class (run by tests/integration/test_efficientnet.cpp).

Loads <model-dir>/model.safetensors into torchvision.models.<arch>(num_classes=N) with
load_state_dict(strict=True), feeds it the images `trainer predict` wrote probabilities for
(JSON lines from --predictions), preprocessed as model.json's "preprocessing" contract says
(images already at its image_size; x / 255; mean/std), and asserts that torchvision's softmax
probabilities are predict's within --tol. Prints key=value lines; exit 0 on success, 1 on a
mismatch, 2 when torch, torchvision or PIL is missing.
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
except ImportError as e:  # pragma: no cover
    print(f"torchvision_predict.py: cannot import {e.name}: run scripts/install-deps.sh",
          file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchvision_parity import build, read_safetensors  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--predictions", required=True, help="trainer predict's JSON lines")
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args()
    torch.set_num_threads(2)
    with open(os.path.join(args.model_dir, "model.json")) as f:
        info = json.load(f)
    contract = info["preprocessing"]
    model = build(info["arch"], info["num_classes"], info["head_hidden"])
    state, _ = read_safetensors(os.path.join(args.model_dir, info["weights"]))
    model.load_state_dict(state, strict=True)
    model.eval()
    size = contract["image_size"]
    worst = 0.0
    count = 0
    with open(args.predictions) as f:
        for line in f:
            rec = json.loads(line)
            image = Image.open(rec["path"]).convert("RGB")
            if image.size != (size, size):
                print(f"{rec['path']}: {image.size}, the test wants images at {size}x{size}",
                      file=sys.stderr)
                return 1
            x = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1)
            x = x / 255.0
            if contract["mean"] is not None:
                mean = torch.tensor(contract["mean"], dtype=torch.float32).view(3, 1, 1)
                std = torch.tensor(contract["std"], dtype=torch.float32).view(3, 1, 1)
                x = (x - mean) / std
            with torch.no_grad():
                probs = torch.softmax(model(x.unsqueeze(0)), dim=1)[0]
            ours = torch.tensor(rec["probabilities"], dtype=torch.float32)
            worst = max(worst, (probs - ours).abs().max().item())
            count += 1
    print(f"torchvision={torchvision.__version__} arch={info['arch']} images={count} "
          f"max_abs_diff={worst:.3e}")
    return 0 if count > 0 and worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
