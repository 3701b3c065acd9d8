#!/usr/bin/python3
"""Plots a job's TensorBoard scalars to a PNG without TensorFlow or TensorBoard.

    /usr/bin/python3 scripts/plot-events.py JOB_DIR/logs curves.png

Reads every events file of the runs under LOGS (train, validation), checks each record's framing
(lengths and masked CRC-32C), decodes the tensorflow.Event messages with a small protobuf
wire-format reader (TensorFlow's field numbers), and draws the per-step training loss and
accuracy and the per-epoch epoch_loss / epoch_accuracy of both runs. Needs python3-matplotlib
(Debian); a tool for looking at runs, not a dependency of the trainer.
"""
import os
import struct
import sys

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        (len_crc,) = struct.unpack_from("<I", data, at + 8)
        if len_crc != masked(crc32c(data[at:at + 8])):
            raise ValueError(f"{path}: bad length CRC at byte {at}")
        body = data[at + 12:at + 12 + length]
        if len(body) < length or at + 16 + length > len(data):
            return  # cut short: the writer is still at it
        (data_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if data_crc != masked(crc32c(body)):
            raise ValueError(f"{path}: bad data CRC at byte {at}")
        yield body
        at += 16 + length


def varint(buf, at):
    value, shift = 0, 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def fields(buf):
    """(number, wire type, value) of a message's fields."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            n, at = varint(buf, at)
            value, at = buf[at:at + n], at + n
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def scalars(run_dir):
    """{tag: [(step, value)]} over the run's files in name order (as TensorBoard reads them)."""
    out = {}
    names = sorted(n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents."))
    for name in names:
        for record in records(os.path.join(run_dir, name)):
            step, summary = 0, None
            for number, _, value in fields(record):  # tensorflow.Event
                if number == 2:
                    step = value
                elif number == 5:
                    summary = value
            if summary is None:
                continue
            for number, _, value in fields(summary):  # Summary.value = 1
                if number != 1:
                    continue
                tag, x = None, None
                for vn, vw, vv in fields(value):  # Summary.Value
                    if vn == 1:
                        tag = vv.decode()
                    elif vn == 2 and vw == 5:  # simple_value
                        (x,) = struct.unpack("<f", vv)
                    elif vn == 8:  # tensor: tensor_content = 4 (TF2's and ours), float_val = 5
                        dtype = 1
                        for tn, tw, tv in fields(vv):
                            if tn == 1 and tw == 0:
                                dtype = tv
                            elif tn in (4, 5) and tw == 2 and len(tv) == 4 and dtype == 1:
                                (x,) = struct.unpack("<f", tv)
                if tag is not None and x is not None:
                    out.setdefault(tag, []).append((step, x))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot-events.py JOB_DIR/logs OUT.png")
    logs, png = sys.argv[1], sys.argv[2]
    runs = {run: scalars(os.path.join(logs, run))
            for run in ("train", "validation") if os.path.isdir(os.path.join(logs, run))}
    if "train" not in runs:
        sys.exit(f"plot-events.py: no run '{logs}/train'")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, what in zip(axes, ("loss", "accuracy")):
        steps = runs["train"].get(what, [])
        if steps:
            ax.plot(*zip(*steps), color="#9ecae1", lw=1, label=f"train {what} (per step)")
        for run, colour in (("train", "#08519c"), ("validation", "#e6550d")):
            points = runs.get(run, {}).get("epoch_" + what, [])
            if points:
                ax.plot(*zip(*points), "o-", color=colour, label=f"{run} epoch_{what}")
        ax.set_xlabel("step")
        ax.set_title(what)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"read back from {logs}")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    for run, tags in runs.items():
        for tag, points in sorted(tags.items()):
            steps = [s for s, _ in points]
            order = "increasing" if all(a < b for a, b in zip(steps, steps[1:])) else "NOT increasing"
            print(f"{run}/{tag}: {len(points)} points, steps {steps[0]}..{steps[-1]} {order}, "
                  f"last {points[-1][1]:.4f}")


if __name__ == "__main__":
    main()
