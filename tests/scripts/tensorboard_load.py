#!/usr/bin/env python3
"""Reads a train.tensorboard_dir with TensorBoard's own loaders and compares it with metrics.jsonl.

  tensorboard_load.py METRICS_JSONL TENSORBOARD_DIR FILES

- event_file_loader.EventFileLoader (TensorBoard's raw reader, CRCs checked) on each of the FILES
  event files: the first event is file_version "brain.Event:2";
- event_accumulator.EventAccumulator on the directory (what TensorBoard's scalar dashboard shows):
  every scalar of metrics.jsonl (null: NaN or infinity; true: 1; arrays as KEY/INDEX) is there at
  its step, once, with the same value as float32, and there are no other tags. A step logged twice
  (a resumed run appends to metrics.jsonl) is compared with its last line.
Exit 0 with one summary line; 1 with a line per problem.
"""
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def as_float32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def main():
    metrics, tb_dir, want_files = sys.argv[1], sys.argv[2], int(sys.argv[3])
    problems = []
    files = sorted(f for f in os.listdir(tb_dir) if "tfevents" in f)
    if len(files) != want_files:
        problems.append(f"{tb_dir}: {len(files)} event files, expected {want_files}")
    for name in files:
        events = list(event_file_loader.EventFileLoader(os.path.join(tb_dir, name)).Load())
        if not events or events[0].file_version != "brain.Event:2":
            problems.append(f"{name}: the first event is not file_version brain.Event:2")

    expected = {}  # (tag, step) -> value from metrics.jsonl; the last line of a step wins
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            step = j.pop("step")
            for key, value in j.items():
                if isinstance(value, list):
                    for i, v in enumerate(value):
                        expected[(f"{key}/{i}", step)] = v
                else:
                    expected[(key, step)] = value

    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            if (tag, e.step) in got:
                problems.append(f"{tag} at step {e.step} shows twice")
            got[(tag, e.step)] = e.value
    for (tag, step), value in sorted(expected.items()):
        if (tag, step) not in got:
            problems.append(f"{tag} at step {step} is not in TensorBoard's scalars")
            continue
        v = got[(tag, step)]
        if value is None:
            ok = not math.isfinite(v)
        else:
            ok = v == as_float32(float(value))
        if not ok:
            problems.append(f"{tag} at step {step}: {v} in TensorBoard, {value} in metrics.jsonl")
    for key in sorted(set(got) - set(expected)):
        problems.append(f"{key[0]} at step {key[1]} is in TensorBoard, not in metrics.jsonl")
    if problems:
        print("\n".join(problems))
        return 1
    tags = len({tag for tag, _ in got})
    print(f"tensorboard's EventAccumulator: {len(got)} scalars ({tags} tags, {len(files)} event files) "
          f"equal metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
