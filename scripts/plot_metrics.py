#!/usr/bin/python3
"""Plot one or more pretrain_gpt runs from their metrics.jsonl into one PNG.

    scripts/plot_metrics.py RUN_DIR... [--output FILE.png]

Three panels against the step: loss (train solid, eval dashed with dots), tokens/s and MFU (%).
One colour per run; the legend names each run by its directory. RUN_DIR may also be a
metrics.jsonl file itself.

The trainer writes two kinds of lines (src/train/metrics.cpp):
    {"step": 50, "loss": 2.61, "lr": ..., "tokens_per_sec": 21100.0, "mfu": 0.509, ...}
    {"step": 300, "eval_loss": 2.47}
Non-finite values are written as null. Lines that do not parse, values that are null or not
numbers, and missing fields are skipped (a count goes to stderr); a step logged twice (a run
resumed from an earlier checkpoint appends the replayed steps) keeps its last value.

Needs matplotlib (Debian: python3-matplotlib, `./scripts/install-deps.sh --with-plots`).
"""

import argparse
import json
import math
import os
import sys

PROG = "plot_metrics"
# field in a metrics line -> series name; scale turns the MFU fraction into percent
SERIES = {"loss": ("loss", 1.0), "eval_loss": ("eval_loss", 1.0), "tokens_per_sec": ("tokens_per_sec", 1.0),
          "mfu": ("mfu", 100.0)}


def fail(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(1)


def number(value):
    """A finite int or float from JSON, else None (null, strings, booleans, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def metrics_path(arg):
    if os.path.isfile(arg):
        return arg
    if not os.path.isdir(arg):
        fail(f"{arg}: no such run directory")
    path = os.path.join(arg, "metrics.jsonl")
    if not os.path.isfile(path):
        fail(f"{arg}: no metrics.jsonl in this directory (is it a pretrain_gpt train.output_dir?)")
    return path


def read_run(path):
    """{series: {step: value}} from one metrics.jsonl, and the number of lines skipped."""
    series = {name: {} for name, _ in SERIES.values()}
    skipped = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        step = number(record.get("step")) if isinstance(record, dict) else None
        if step is None:
            skipped += 1
            continue
        used = False
        for field, (name, scale) in SERIES.items():
            value = number(record.get(field))
            if value is not None:
                series[name][int(step)] = value * scale
                used = True
        if not used:
            skipped += 1
    return series, skipped


def run_labels(args):
    """The run directory's name; the path as given where two runs share a name."""
    dirs = [os.path.dirname(os.path.abspath(a)) if os.path.isfile(a) else os.path.abspath(a) for a in args]
    names = [os.path.basename(d) or d for d in dirs]
    return [n if names.count(n) == 1 else a for n, a in zip(names, args)]


def main():
    parser = argparse.ArgumentParser(
        prog="plot_metrics.py",
        description="Plot loss (train and eval), tokens/s and MFU against steps from pretrain_gpt runs' "
        "metrics.jsonl into one PNG, one colour per run.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a train.output_dir (or a metrics.jsonl)")
    parser.add_argument("--output", "-o", default="metrics.png", metavar="FILE.png",
                        help="the image to write (default: metrics.png)")
    parser.add_argument("--title", default=None, help="a title above the panels")
    args = parser.parse_args()

    paths = [metrics_path(arg) for arg in args.runs]  # every run is there before any is read
    runs = []
    for path, label in zip(paths, run_labels(args.runs)):
        series, skipped = read_run(path)
        if skipped:
            print(f"{PROG}: {path}: skipped {skipped} line(s) that were malformed or had no usable value",
                  file=sys.stderr)
        if not any(series.values()):
            print(f"{PROG}: {path}: no metrics to plot", file=sys.stderr)
        runs.append((label, series))
    if not any(any(series.values()) for _, series in runs):
        fail("no metrics to plot in any run")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        fail(f"matplotlib is missing for {sys.executable}: install Debian's python3-matplotlib "
             "(./scripts/install-deps.sh --with-plots) and run with /usr/bin/python3")

    fig, (ax_loss, ax_tps, ax_mfu) = plt.subplots(3, 1, figsize=(8, 8.5), sharex=True,
                                                  gridspec_kw={"height_ratios": [2, 1, 1]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def draw(ax, values, colour, **style):
        if values:
            steps = sorted(values)
            ax.plot(steps, [values[s] for s in steps], color=colour, **style)

    for i, (label, s) in enumerate(runs):
        colour = colours[i % len(colours)]
        draw(ax_loss, s["loss"], colour, linewidth=1.4)
        draw(ax_loss, s["eval_loss"], colour, linestyle="--", marker="o", markersize=4, linewidth=1.2)
        draw(ax_tps, s["tokens_per_sec"], colour, linewidth=1.2)
        draw(ax_mfu, s["mfu"], colour, linewidth=1.2)

    ax_loss.set_ylabel("loss")
    ax_tps.set_ylabel("tokens/s")
    ax_mfu.set_ylabel("MFU (%)")
    ax_mfu.set_xlabel("step")
    ax_mfu.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_loss, ax_tps, ax_mfu):
        ax.grid(True, alpha=0.3)
    ax_tps.set_ylim(bottom=0)
    ax_mfu.set_ylim(bottom=0)

    # Runs by colour, and what the line styles mean.
    handles = [Line2D([], [], color=colours[i % len(colours)], linewidth=2, label=label)
               for i, (label, _) in enumerate(runs)]
    if any(s["eval_loss"] for _, s in runs):
        handles += [Line2D([], [], color="0.3", linewidth=1.4, label="train"),
                    Line2D([], [], color="0.3", linestyle="--", marker="o", markersize=4, label="eval")]
    ax_loss.legend(handles=handles, loc="upper right", fontsize="small")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()

    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        fail(f"{args.output}: the directory {out_dir} does not exist")
    try:
        fig.savefig(args.output, format="png", dpi=80)
    except OSError as e:
        fail(f"{args.output}: {e.strerror}")
    print(f"{PROG}: wrote {args.output} ({len(runs)} run(s))")


if __name__ == "__main__":
    main()
