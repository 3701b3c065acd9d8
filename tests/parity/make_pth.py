#!/usr/bin/env python3
"""torch.save files for the .pth reader's tests (tests/unit/model/test_pth.cpp), made at test time.

Writes into --out:
  resnet50.pth            torchvision resnet50 state dict, zip format, as torchvision ships it
                          (BatchNorm statistics calibrated by one training-mode forward)
  resnet50_io.safetensors 'input' (2x3x64x64) and torchvision's eval-mode 'logits' on it
  resnet18.pth            torchvision resnet18, zip format; the same state dict also as
  resnet18_legacy.pth       the legacy (pre-1.6) stream, _use_new_zipfile_serialization=False
  resnet18_proto4.pth       pickle protocol 4
  resnet18_checkpoint.pth   a torchvision reference-script checkpoint: {"model", "optimizer",
                            "lr_scheduler", "epoch", "args" (an argparse.Namespace)}
  resnet18_ddp.pth          keys under "module." (saved from DistributedDataParallel)
  resnet18.safetensors      the expected tensors
  views.pth, views.safetensors  non-contiguous and shared-storage tensors, f16/bf16/f64/i64/bool,
                            0-dim and empty tensors, saved as is, and their expected values
  scripted.pt             a TorchScript archive (torch.jit.save), which is not a state dict
  list.pth                torch.save([1, 2, 3])
  evil.pth                a dict whose entry unpickles by calling os.system('touch MARKER')
                          with Python's pickle; the reader must refuse it without running it

Depends on torch, torchvision and torchvision_parity.py (its safetensors writer). Exits 0, or 2
when torch is missing.
"""
import argparse
import copy
import os
import sys

try:
    import torch
    import torchvision
except ImportError as e:  # pragma: no cover
    print(f"make_pth.py: cannot import {e.name}: run scripts/install-deps.sh "
          f"(python3-torch python3-torchvision)", file=sys.stderr)
    sys.exit(2)

from torchvision_parity import write_safetensors  # noqa: E402  (the same directory)


def calibrated(arch, seed):
    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)()
    with torch.no_grad():
        model.train()
        model(torch.randn(4, 3, 64, 64))
    model.eval()
    return model


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--marker", required=True, help="the file evil.pth would create")
    args = p.parse_args()
    torch.set_num_threads(2)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731

    r50 = calibrated("resnet50", 50)
    torch.save(r50.state_dict(), out("resnet50.pth"))
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        write_safetensors(out("resnet50_io.safetensors"), {"input": x, "logits": r50(x)})

    r18 = calibrated("resnet18", 18)
    sd = copy.deepcopy(r18.state_dict())  # an OrderedDict with _metadata, not aliasing the
    # parameters that opt.step() below changes
    torch.save(r18.state_dict(), out("resnet18.pth"))
    torch.save(sd, out("resnet18_legacy.pth"), _use_new_zipfile_serialization=False)
    torch.save(sd, out("resnet18_proto4.pth"), pickle_protocol=4)
    opt = torch.optim.SGD(r18.parameters(), lr=0.1, momentum=0.9)
    r18(torch.randn(2, 3, 64, 64)).sum().backward()
    opt.step()
    torch.save({"model": sd, "optimizer": opt.state_dict(),
                "lr_scheduler": {"last_epoch": 3}, "epoch": 3,
                "args": argparse.Namespace(model="resnet18", lr=0.1)},
               out("resnet18_checkpoint.pth"))
    torch.save({"module." + k: v for k, v in sd.items()}, out("resnet18_ddp.pth"))
    write_safetensors(out("resnet18.safetensors"), sd)

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = {
        "transposed": base.t(),                      # strides (1, 6)
        "sliced": base[1:3, ::2],                    # offset 6, strides (6, 2), shares storage
        "base": base,
        "half": torch.linspace(-2, 2, 7).half(),
        "bfloat16": torch.linspace(-3, 3, 5).bfloat16(),
        "double": torch.tensor([[1.5, -2.25]], dtype=torch.float64),
        "long_scalar": torch.tensor(1234567890123, dtype=torch.int64),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
    }
    torch.save(views, out("views.pth"))
    write_safetensors(out("views.safetensors"), views)

    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), out("scripted.pt"))
    torch.save([1, 2, 3], out("list.pth"))
    torch.save({"conv1.weight": torch.zeros(1), "payload": Evil(args.marker)}, out("evil.pth"))
    print(f"torch={torch.__version__} torchvision={torchvision.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
