#!/usr/bin/env python3
"""torchvision's side of scripts/bench/augment_pipeline.sh (run by the hidden "[.augbench]" case
of unit_data): the reference training preprocessing on the PIL path, PIL decode ->
RandomResizedCrop(SIZE) -> RandomHorizontalFlip -> TrivialAugmentWide -> PILToTensor ->
RandomErasing(P) (uint8, value 0), in a torch DataLoader (batch 32, NUM_WORKERS processes, one
torch thread each as DataLoader sets), over the JPEGs under DIR (ImageFolder layout). Times one
epoch after a warm-up epoch with persistent workers and prints `images_per_second=<x>`.
Exit 2 when torch or torchvision is missing.
"""
import argparse
import sys
import time

try:
    import torch
    from torchvision import datasets, transforms
except ImportError as e:  # pragma: no cover
    print(f"torchvision_augment.py: cannot import {e.name}", file=sys.stderr)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--erasing", type=float, default=0.25)
    args = p.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.TrivialAugmentWide(),
        transforms.PILToTensor(),
        transforms.RandomErasing(p=args.erasing),
    ])
    data = datasets.ImageFolder(args.dir, transform=tf)
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True,
                                         num_workers=args.workers, persistent_workers=True,
                                         prefetch_factor=2)
    for _ in loader:  # warm-up: workers started, files in the page cache
        pass
    t0 = time.perf_counter()
    n = 0
    for images, _ in loader:
        n += images.shape[0]
    seconds = time.perf_counter() - t0
    print(f"images_per_second={n / seconds:.2f} images={n} seconds={seconds:.3f}")


if __name__ == "__main__":
    main()
