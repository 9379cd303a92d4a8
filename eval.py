"""Evaluate runs across lengths, and run the named experiments that reproduce each paper's claims.

    python eval.py runs/NAME --lengths 24,48,96,192          # accuracy table with 95 % intervals
    python eval.py runs/NAME --delays 0:60 --plot delays.png  # delay tasks: accuracy at each delay
    python eval.py runs/NAME --lengths 64,128 --scaling yarn --factor 4   # inference-time YaRN
    python eval.py --experiment retrieval                    # writes results/retrieval.{md,json,png}

An experiment trains its models through train.py's own functions (the same settings a user would type),
writes results/NAME.md (claim, what the paper says, what we measured, verdict), results/NAME.json and
results/NAME.png, prints the table and states its command and runtime.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import lengen
import tasks
import train
from train import UsageError

# ---------------------------------------------------------------------------------------------------------
# Plotting: optional. Without matplotlib every command still runs and says how to get the figure.
# ---------------------------------------------------------------------------------------------------------


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("(no figure: pip install matplotlib to get it)", file=sys.stderr)
        return None


def plot_curves(ax, curves: dict[str, list[dict]], key: str, train_range=None, log_x=True):
    """One line per label: accuracy (with its 95 % band) against length or delay."""
    for label, rows in curves.items():
        xs = [r[key] for r in rows]
        ax.plot(xs, [r["accuracy"] for r in rows], marker="o", ms=3, label=label)
        ax.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.15)
    if train_range:
        ax.axvspan(*train_range, color="grey", alpha=0.15, lw=0, label="trained")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(key)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------------------
# Evaluating one run
# ---------------------------------------------------------------------------------------------------------


def evaluate_run(model, cfg: dict, lengths=None, delays=None, samples: int = 256, device: str = "cpu"):
    """Rows of {length|delay, accuracy, low, high, samples}; delays keep the run's training window."""
    options = cfg["task_options"]
    if delays is not None:
        if "delays" not in options:
            raise UsageError(f"--delays needs a delay task; '{cfg['task']}' has none (use --lengths)")
        window = cfg["train_len"][1]
        rows = []
        for d in delays:
            try:
                rows.append({"delay": d, **train.evaluate(model, cfg["task"], window, {**options, "delays": (d,)},
                                                          samples, device=device)})
            except ValueError as e:
                raise UsageError(f"delay {d}: {e}") from None
        return rows, "delay"
    rows = []
    for n in lengths:
        try:
            rows.append(train.evaluate(model, cfg["task"], n, options, samples, device=device))
        except ValueError as e:
            raise UsageError(f"length {n}: {e}") from None
    return rows, "length"


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got '{text}'") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive, got '{text}'")
    return values


def eval_command(args) -> None:
    overrides = {k: v for k, v in (("scaling", args.scaling), ("factor", args.factor),
                                   ("original_len", args.original_len)) if v is not None}
    model, cfg = train.load_run(args.run, args.device, **overrides)
    if args.lengths is None and args.delays is None:
        hi = cfg["train_len"][1]
        if "delays" in cfg["task_options"]:
            args.delays = list(range(0, 4 * max(cfg["task_options"]["delays"]) + 1, 2))
        else:
            args.lengths = [hi, 2 * hi, 4 * hi, 8 * hi]
    start = time.perf_counter()
    rows, key = evaluate_run(model, cfg, args.lengths, args.delays, args.samples, args.device)
    label = os.path.basename(os.path.normpath(args.run)) + (f" ({args.scaling} x{args.factor:g})" if overrides else "")
    print(f"{label}: {cfg['task']}, {cfg['encoding']}, trained on {key}s "
          + (f"{cfg['train_len'][0]}..{cfg['train_len'][1]}" if key == "length"
             else ",".join(map(str, cfg["task_options"]["delays"]))))
    print(train.markdown_table(rows, key))
    print(f"({args.samples} sequences per {key}, {time.perf_counter() - start:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "config": cfg, "rows": rows}, f, indent=1)
    if args.plot and (plt := pyplot()):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        trained = cfg["train_len"] if key == "length" else (min(cfg["task_options"]["delays"]),
                                                             max(cfg["task_options"]["delays"]))
        plot_curves(ax, {label: rows}, key, trained, log_x=key == "length")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"figure: {args.plot}")


# ---------------------------------------------------------------------------------------------------------
# Experiments share one way of reporting: results/NAME.md, .json, .png, with the command and its runtime.
# ---------------------------------------------------------------------------------------------------------


def write_results(name: str, markdown: str, data: dict, figure=None, out_dir: str = "results") -> None:
    """Write results/NAME.md and .json; figure(plt) draws results/NAME.png when matplotlib is there."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    if figure is not None and (plt := pyplot()):
        fig = figure(plt)
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        plt.close(fig)
    print(markdown)
    print(f"wrote {out_dir}/{name}.md, .json" + (", .png" if figure is not None else ""))


EXPERIMENTS: dict = {}  # name -> function(args); each section below registers its own


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = train.Parser(description="Evaluate a run, or run a named experiment (see README).")
    p.add_argument("run", nargs="?", help="a run directory written by train.py")
    p.add_argument("--lengths", type=int_list, default=None, help="e.g. 24,48,96,192")
    p.add_argument("--delays", type=train.int_set, default=None, help="delay tasks: e.g. 0:60")
    p.add_argument("--samples", type=int, default=256, help="sequences per length or delay")
    p.add_argument("--scaling", choices=tuple(lengen.SCHEDULES), default=None,
                   help="evaluate with another rotary schedule (e.g. inference-time YaRN)")
    p.add_argument("--factor", type=float, default=None)
    p.add_argument("--original-len", type=int, default=None)
    p.add_argument("--plot", default=None, metavar="PNG")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--experiment", default=None, help="a named experiment: " + ", ".join(EXPERIMENTS))
    p.add_argument("--quick", action="store_true", help="experiment: a small version for the tests")
    p.add_argument("--full", action="store_true", help="experiment: closer to paper scale (a GPU helps)")
    p.add_argument("--out-dir", default="results", help="experiment: where results go")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.experiment:
            if args.experiment not in EXPERIMENTS:
                raise UsageError(f"unknown experiment '{args.experiment}'; choose from {', '.join(EXPERIMENTS)}")
            EXPERIMENTS[args.experiment](args)
        elif args.run:
            if args.samples < 1:
                raise UsageError("--samples must be >= 1")
            eval_command(args)
        else:
            raise UsageError("give a run directory, --experiment NAME or --bench")
    except UsageError as e:
        print(f"eval.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eval.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
