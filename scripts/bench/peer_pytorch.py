#!/usr/bin/python3
"""PyTorch peer of the trainer for scripts/bench/vs_pytorch.sh (a benchmark, not a test).

Trains torchvision's ResNet50 the way the trainer's benchmark job does: ImageFolder, Resize((S, S)),
ToTensor, Normalize(ImageNet), DataLoader(batch_size=B, shuffle=True, num_workers=--workers (1),
drop_last=True, persistent_workers=True), Adam lr 1e-3, cross-entropy, torch.set_num_threads(T),
optionally channels_last (model and input) and bf16 autocast. Runs --steps steps, going round
the data as often as needed, and prints ONE JSON line on stdout: medians over the steps after
the first --warmup (2) of

  images_per_sec  B / step time (the whole step: waiting for the batch, forward, backward, Adam)
  step_time_s     wall time from the end of the previous step to the end of this one
  data_wait_s     the part of it spent waiting for the DataLoader
  minor_faults    getrusage(RUSAGE_SELF).ru_minflt delta (this process only, not the
                  DataLoader worker, which is a child process)
  sys_time_s      getrusage(RUSAGE_SELF).ru_stime delta (kernel time of this process)

plus peak_rss_mib = ru_maxrss of this process + ru_maxrss of its children (the DataLoader
worker, counted once it has been shut down and reaped).

--ddp N runs the same training as N processes (DistributedDataParallel over Gloo on 127.0.0.1,
DistributedSampler, the same per-process batch and threads) and prints one JSON line with rank
0's medians, images_per_sec over all processes and each rank's own record. The processes are
this script again, started with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in the environment.

--device cuda trains on the GPU the way PyTorch's users do there (scripts/gpu-check.sh, on the
lent GPU machines with pip's PyTorch): DataLoader(num_workers=--workers, pin_memory=True), batches
copied with non_blocking=True, bf16 autocast on CUDA, cuDNN benchmark mode on (as torchvision's
reference training script, references/classification/train.py, unless it is asked for
deterministic algorithms). loss.item() each step, as on CPU, ends each timed step on the host.

--workers N sets the DataLoader's worker processes (default 1, as the trainer's benchmark job's
data.num_workers: 1 on CPU; gpu-check.sh uses one per core).

--compile wraps the model (after DistributedDataParallel, where --ddp) in torch.compile, default
mode (TorchInductor; on CPU it compiles C++/OpenMP kernels with g++ and needs Python.h, Debian's
python3.X-dev, for the Python version that runs it). torch.compile exists from torch 2.0 on: with
an older torch --compile exits 2 with a message. The forward and backward graphs are compiled in
the first step (and again wherever Dynamo recompiles), so that step is part of the warm-up:
--compile needs --warmup >= 1 (2 by default). The JSON line then has "compile": true,
"compile_first_step_s" (the first step's wall time, compilation included) and, where the torch
has them, Dynamo's counters ("dynamo": unique_graphs, graph_breaks, recompiles); "first_step_s"
and "warmup_step_times_s" are there with or without --compile, so a compiled and an eager run of
the same configuration show what compiling cost.

Besides the per-step medians the JSON line has "epochs": each epoch the run completed, with its
steps, its wall time (from asking the DataLoader for the epoch's first batch to the end of its
last step; the first epoch includes the warm-up) and images_per_sec over that time, which counts
the time the DataLoader needs to refill at every epoch start and shows an input pipeline slower
than the model even where its prefetch queue hides it from the median of the steps.

Run it with /usr/bin/python3 (Debian's python3-torch and python3-torchvision: torch 1.13 and
torchvision 0.14 on Debian 12) and with the venv of scripts/torch-flavour.sh (pip's torch 2.11 and
torchvision 0.26) here, and with `python3` (pip's torch and torchvision) on the GPU machines. The
calls it makes are the same in both: torchvision.models.<--arch>(num_classes=...) (resnet50 by
default) without pretrained weights (neither the old pretrained= nor the new weights= argument),
torch.autocast(device_type, dtype=bfloat16).
"""
import argparse
import datetime
import gc
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="ImageFolder root: DIR/<class>/*.jpg")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=16, help="per-process batch size")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--num-classes", type=int, default=5)
    p.add_argument("--arch", default="resnet50", help="torchvision.models.<ARCH> (the trainer's "
                   "model.arch)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ddp", type=int, default=0, metavar="N",
                   help="train as N DistributedDataParallel processes over Gloo")
    p.add_argument("--timeout-s", type=float, default=1800,
                   help="--ddp: seconds before a stuck process group is given up")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the GPU, with pinned batches, non_blocking copies, cuDNN benchmark")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (default mode, inductor; torch >= 2.0); the "
                        "first step, which compiles, must be a warm-up step")
    return p.parse_args()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_or_none(values):
    return statistics.median(values) if values else None


def train(args, rank=0, world_size=1):
    import torch
    import torch.nn.functional as F
    import torchvision
    from torchvision import transforms

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("peer_pytorch: --device cuda, but torch.cuda.is_available() is False")
        torch.backends.cudnn.benchmark = True
    distributed = world_size > 1
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=args.timeout_s))

    tf = transforms.Compose([
        transforms.Resize((args.image_size, args.image_size)),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=tf)
    sampler = None
    if distributed:
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, shuffle=sampler is None, sampler=sampler,
        num_workers=args.workers, drop_last=True, persistent_workers=True, pin_memory=cuda)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        sys.exit(f"peer_pytorch: {len(dataset)} images in {args.data} make no batch of "
                 f"{args.batch} per process (x{world_size} processes)")

    model = getattr(torchvision.models, args.arch)(num_classes=args.num_classes)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    model.train()
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)  # 25 MB buckets, as the trainer
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if args.compile:
        if not hasattr(torch, "compile"):
            print(f"peer_pytorch: --compile needs torch.compile (torch >= 2.0); this is torch "
                  f"{torch.__version__}", file=sys.stderr)
            sys.exit(2)
        model = torch.compile(model)  # compiles lazily, in the first step

    records = []
    epochs = []  # complete epochs: steps, wall time, images/s
    epoch = 0
    if sampler is not None:
        sampler.set_epoch(epoch)
    it = iter(loader)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    step_start = time.perf_counter()
    epoch_start, epoch_steps = step_start, 0
    for step in range(args.steps):
        t_wait = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            epoch += 1
            if sampler is not None:
                sampler.set_epoch(epoch)
            epoch_start, epoch_steps = t_wait, 0
            it = iter(loader)
            images, labels = next(it)
        data_wait = time.perf_counter() - t_wait
        if cuda:
            images = images.to(device, non_blocking=True, memory_format=memory_format)
            labels = labels.to(device, non_blocking=True)
        else:
            images = images.to(memory_format=memory_format)
        optimizer.zero_grad(set_to_none=True)
        if args.precision == "bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(images)
                loss = F.cross_entropy(logits, labels)
        else:
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        loss_v = loss.item()
        now = time.perf_counter()
        epoch_steps += 1
        if epoch_steps == steps_per_epoch:
            epochs.append({"epoch": epoch + 1, "steps": epoch_steps, "time_s": now - epoch_start,
                           "images_per_sec": epoch_steps * args.batch * world_size
                           / (now - epoch_start)})
        ru_now = resource.getrusage(resource.RUSAGE_SELF)
        dt = now - step_start
        records.append({
            "step": step + 1, "loss": loss_v, "step_time_s": dt,
            "images_per_sec": args.batch * world_size / dt, "data_wait_s": data_wait,
            "minor_faults": ru_now.ru_minflt - ru.ru_minflt,
            "sys_time_s": ru_now.ru_stime - ru.ru_stime,
        })
        ru = ru_now
        step_start = now

    # Shut the DataLoader worker down and reap it so RUSAGE_CHILDREN counts it.
    try:
        it._shutdown_workers()
    except AttributeError:
        pass
    del it, loader
    gc.collect()
    if distributed:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()

    measured = records[args.warmup:]
    warmup_times = [r["step_time_s"] for r in records[:args.warmup]]
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = {k: median_or_none([r[k] for r in measured])
           for k in ("images_per_sec", "step_time_s", "data_wait_s", "minor_faults", "sys_time_s")}
    out.update({
        "peak_rss_mib": (self_kib + children_kib) / 1024.0,
        "peak_rss_self_mib": self_kib / 1024.0,
        "peak_rss_children_mib": children_kib / 1024.0,
        "steps": len(records), "measured_steps": len(measured), "final_loss": records[-1]["loss"],
        "rank": rank, "world_size": world_size, "epochs": epochs,
        "config": {"image_size": args.image_size, "batch": args.batch, "threads": args.threads,
                   "precision": args.precision, "channels_last": args.channels_last,
                   "num_images": len(dataset), "device": args.device, "workers": args.workers,
                   "steps_per_epoch": steps_per_epoch},
        "allocator": "jemalloc" if "jemalloc" in os.environ.get("LD_PRELOAD", "") else "glibc",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "compile": args.compile,
        "first_step_s": records[0]["step_time_s"],
        "warmup_step_times_s": warmup_times,
    })
    if args.compile:
        out["compile_first_step_s"] = records[0]["step_time_s"]
        out["dynamo"] = dynamo_counters()
    if cuda:
        out["gpu"] = torch.cuda.get_device_name(device)
        out["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["cudnn"] = torch.backends.cudnn.version()
    return out


def dynamo_counters():
    """Dynamo's counters of this process (graphs compiled, graph breaks, recompiles), or None
    where this torch keeps them elsewhere."""
    try:
        from torch._dynamo.utils import counters
        return {"unique_graphs": counters["stats"].get("unique_graphs", 0),
                "graph_breaks": sum(counters["graph_break"].values()),
                "recompiles": sum(counters["recompiles"].values())}
    except Exception:  # a private API: its absence must not fail the benchmark
        return None


def launch_ddp(args):
    """Starts args.ddp copies of this script as the ranks of one Gloo group; returns rank 0's
    record with every rank's record under "ranks"."""
    port = free_port()
    argv = [a for a in sys.argv[1:]]
    procs = []
    for rank in range(args.ddp):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(args.ddp))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                      env=env, stdout=subprocess.PIPE))
    outputs, failed = [], None
    try:
        for rank, p in enumerate(procs):
            out, _ = p.communicate()
            outputs.append(out.decode())
            if p.returncode != 0 and failed is None:
                failed = (rank, p.returncode)
                for q in procs:
                    if q.poll() is None:
                        q.terminate()
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
    if failed is not None:
        sys.exit(f"peer_pytorch: --ddp rank {failed[0]} exited {failed[1]}")
    ranks = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
    result = dict(ranks[0])
    result["ranks"] = ranks
    result["peak_rss_mib"] = sum(r["peak_rss_mib"] for r in ranks)
    return result


def main():
    args = parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"peer_pytorch: --steps {args.steps} leaves no step after {args.warmup} warm-up")
    if args.workers < 1:
        sys.exit(f"peer_pytorch: --workers {args.workers}: at least 1")
    if args.compile and args.warmup < 1:
        sys.exit("peer_pytorch: --compile compiles in the first step: --warmup must be at least 1")
    if args.ddp > 1 and args.device != "cpu":
        sys.exit("peer_pytorch: --ddp trains on CPUs (over Gloo); leave out --device cuda")
    if args.ddp > 1 and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        result = train(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    elif args.ddp > 1:
        result = launch_ddp(args)
    else:
        result = train(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
