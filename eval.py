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
from tqdm import tqdm

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
# Experiment "ryarn": Paper R (Randomized YaRN, arXiv 2606.23687) on the small GPT
#
# Paper R fine-tunes a model pretrained at context L on short data, giving every token a YaRN rotary encoding
# (factor s) at a position drawn from a range that a curriculum widens from L to sL, and evaluates with
# ordinary contiguous positions far beyond L. Here the "pretrained model" is a small RoPE GPT trained on the
# task itself at lengths <= L with contiguous positions; every method then fine-tunes it for the same number
# of steps on the same lengths, and all are evaluated at L, 2L, 4L and 8L.
# ---------------------------------------------------------------------------------------------------------

# Three sizes; the default finishes in minutes on one CPU thread.
RYARN_SIZES = {
    "quick": {"length": 8, "factor": 4, "pretrain": 60, "finetune": 30, "seeds": (0,), "samples": 32},
    "default": {"length": 16, "factor": 8, "pretrain": 1200, "finetune": 800, "seeds": (0, 1, 2), "samples": 256},
    "full": {"length": 32, "factor": 8, "pretrain": 6000, "finetune": 3000, "seeds": (0, 1, 2, 3, 4),
             "samples": 512},
}
# copy: an algorithmic task where RoPE fails past its training length (Ruoss et al., arXiv 2305.16843);
# retrieval: Paper A's fixed-offset task, where RoPE extrapolates only partly (attention dilution).
RYARN_TASKS = ("copy", "retrieval")
RYARN_THRESHOLD = 0.05  # a gain counts when it is >= 5 accuracy points on average and positive in every seed
# Every curve of the comparison: Paper R's baselines, its method and its ablation.
RYARN_LABELS = {
    "zero-shot": "the pretrained model, no fine-tuning, plain RoPE",
    "zero-shot+yarn": "the same weights read with YaRN (factor s) at inference only",
    "ft": "plain fine-tuning: plain RoPE, contiguous positions",
    "yarn": "fine-tuning with YaRN (factor s), contiguous positions",
    "rpe": "fine-tuning with randomized positions from [0, sL), plain RoPE",
    "ryarn": "Randomized YaRN: YaRN + randomized positions, range widened from L to sL",
    "ryarn-nocurr": "Randomized YaRN without the curriculum: positions from [0, sL) from the first step",
}


def ryarn_methods(L: int, s: int) -> dict[str, list[str]]:
    """The fine-tuning flags of each method in Paper R's comparison (train.py options)."""
    yarn = ["--scaling", "yarn", "--factor", str(s), "--original-len", str(L)]
    return {
        "ft": [],                                                            # plain fine-tuning
        "yarn": yarn,                                                        # "trained YaRN"
        "rpe": ["--positions", "randomized", "--max-position", str(s * L)],  # random positions, no YaRN
        "ryarn": yarn + ["--positions", "randomized", "--curriculum", f"{L}:{s * L}"],
        "ryarn-nocurr": yarn + ["--positions", "randomized", "--max-position", str(s * L)],  # the ablation
    }


def ryarn_argv(task: str, method: str, size: dict, seed: int, root: str, threads=None, device="cpu") -> list[str]:
    """The train.py command line of one run: "pretrain" or one of ryarn_methods, which start from it.

    --force retrains every run, so the committed numbers always come from this command; fine-tuning starts
    from trained weights, so a short warm-up suffices.
    """
    L = size["length"]
    argv = ["--task", task, "--train-len", f"{L // 2}:{L}", "--seed", str(seed), "--eval-samples",
            str(size["samples"]), "--device", device, "--out", os.path.join(root, method), "--force", "--quiet"]
    argv += ["--threads", str(threads)] if threads else []
    if method == "pretrain":
        return argv + ["--steps", str(size["pretrain"])]
    return argv + ["--steps", str(size["finetune"]), "--init", os.path.join(root, "pretrain"),
                   "--warmup", "20"] + ryarn_methods(L, size["factor"])[method]


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation and range over seeds."""
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values), "values": values}


def ryarn_experiment(args) -> None:
    if args.quick and args.full:
        raise UsageError("choose one of --quick and --full")
    name = "quick" if args.quick else "full" if args.full else "default"
    size = RYARN_SIZES[name]
    L, s = size["length"], size["factor"]
    lengths = [L, 2 * L, 4 * L, 8 * L]  # train.py's final table: 1, 2, 4 and 8 times the longest training length
    methods = list(RYARN_LABELS)
    flags = [("--quick", args.quick), ("--full", args.full), (f"--threads {args.threads}", args.threads),
             (f"--device {args.device}", args.device != "cpu"),
             (f"--out-dir {args.out_dir}", args.out_dir != "results")]
    command = " ".join(["python eval.py --experiment ryarn"] + [flag for flag, given in flags if given])
    start, cpu_start = time.perf_counter(), time.process_time()
    # accuracy[task][method][seed] = accuracies at `lengths`
    accuracy = {task: {m: [] for m in methods} for task in RYARN_TASKS}
    runs = ["pretrain", *ryarn_methods(L, s)]  # every fine-tune starts from this seed's pretrained run
    bar = tqdm(total=len(RYARN_TASKS) * len(size["seeds"]) * len(runs), desc="ryarn")
    for task in RYARN_TASKS:
        for seed in size["seeds"]:
            root = os.path.join("runs", "ryarn", name, task, f"s{seed}")
            for method in runs:
                bar.set_postfix_str(f"{task} seed {seed} {method}")
                rows = train.run(ryarn_argv(task, method, size, seed, root, args.threads, args.device))["rows"]
                accuracy[task]["zero-shot" if method == "pretrain" else method].append([r["accuracy"] for r in rows])
                bar.update(1)
            # Paper R's zero-shot baseline with inference-time YaRN: the pretrained weights, stretched by s
            model, cfg = train.load_run(os.path.join(root, "pretrain"), args.device, scaling="yarn", factor=s,
                                        original_len=L)
            accuracy[task]["zero-shot+yarn"].append(
                [train.evaluate(model, task, n, cfg["task_options"], size["samples"], device=args.device)["accuracy"]
                 for n in lengths])
    bar.close()
    # wall time depends on what else the machine runs; CPU time is what the experiment itself costs
    runtime = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu_start, 1)}

    # "beyond L" for one seed: its mean accuracy at 2L, 4L and 8L; spreads are then taken over seeds
    beyond = {task: {m: [sum(acc[1:]) / 3 for acc in by_method[m]] for m in methods}
              for task, by_method in accuracy.items()}

    def gain(task, better, worse):
        """Seed-paired difference of beyond-L accuracy; it holds when large on average and positive in every seed."""
        stats = spread([b - w for b, w in zip(beyond[task][better], beyond[task][worse])])
        return {"task": task, "better": better, "worse": worse, **stats,
                "holds": stats["mean"] >= RYARN_THRESHOLD and stats["min"] > 0}

    claims = {
        "ryarn > yarn > ft beyond L": [gain(t, b, w) for t in RYARN_TASKS for b, w in (("ryarn", "yarn"),
                                                                                       ("yarn", "ft"))],
        "the curriculum matters": [gain(t, "ryarn", "ryarn-nocurr") for t in RYARN_TASKS],
    }
    verdicts = {claim: "reproduced" if all(g["holds"] for g in gains) else
                "partly reproduced" if any(g["holds"] for g in gains) else "not reproduced"
                for claim, gains in claims.items()}

    def figure(plt):
        fig, axes = plt.subplots(1, len(RYARN_TASKS), figsize=(5 * len(RYARN_TASKS) + 1.5, 4.2))
        for ax, task in zip(axes, RYARN_TASKS):
            curves = {m: [{"length": n, "accuracy": spread(list(a))["mean"], "low": min(a), "high": max(a)}
                          for n, a in zip(lengths, zip(*accuracy[task][m]))] for m in methods}
            plot_curves(ax, curves, "length", (L // 2, L))
            for line in ax.get_lines():
                if line.get_label().startswith("zero-shot"):  # no fine-tuning: dashed and on top, so it
                    line.set_linestyle("--")                    # stays visible where it overlaps another
                    line.set_zorder(3)
                if line.get_label() == "ryarn":
                    line.set_linewidth(2.5)
            ax.axhline(1 / tasks.task_options(task)["symbols"], color="black", ls=":", lw=1, label="chance")
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.get_legend().remove()  # one legend for both panels, beside them, so no curve is hidden
            ax.set_title(f"{task}: fine-tuned at lengths {L // 2}..{L}, YaRN factor {s}", fontsize=9)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=8)
        fig.suptitle(f"Randomized YaRN on a small GPT: mean of {len(size['seeds'])} seed(s), band = range over "
                     "seeds", fontsize=10)
        fig.tight_layout(rect=(0, 0, 0.87, 1))
        return fig

    data = {"command": command, "runtime": runtime, "size": name, "settings": size,
            "tasks": RYARN_TASKS, "lengths": lengths, "threshold": RYARN_THRESHOLD, "accuracy": accuracy,
            "beyond_L": {t: {m: spread(v) for m, v in by.items()} for t, by in beyond.items()},
            "claims": claims, "verdicts": verdicts}
    markdown = ryarn_markdown(size, command, runtime, lengths, accuracy, beyond, claims, verdicts, args.device)
    write_results("ryarn", markdown, data, figure, args.out_dir)


def ryarn_markdown(size, command, runtime, lengths, accuracy, beyond, claims, verdicts, device) -> str:
    L, s, seeds = size["length"], size["factor"], size["seeds"]

    def pm(values):
        stats = spread(values)
        return f"{stats['mean']:.3f} ± {stats['sd']:.3f}"

    def diff(g):
        return (f"{g['task']}: {g['better']} − {g['worse']} = {g['mean']:+.3f} ± {g['sd']:.3f} "
                f"[{g['min']:+.3f}, {g['max']:+.3f}]")

    paper = {
        "ryarn > yarn > ft beyond L": "OOD average, trained YaRN → Randomized YaRN: BABILong 81.3 → 90.3, MRCR "
                                      "59.3 → 72.7 (Qwen2.5-7B; secondary source); fine-tuning with YaRN beats "
                                      "plain fine-tuning",
        "the curriculum matters": "removing the curriculum costs up to 18.3 points on MRCR (secondary source)",
    }
    out = [
        "# Randomized YaRN (Paper R, arXiv 2606.23687) on a small GPT", "",
        f"Command: `{command}`  ",
        f"Runtime: {runtime['wall_s'] / 60:.1f} min wall clock, {runtime['cpu_s'] / 60:.1f} min of CPU time, on "
        f"{device} with {torch.get_num_threads()} torch thread(s).", "",
        f"**Setup.** A RoPE GPT (train.py's defaults: 2 layers, 2 heads, d_model 64) is pretrained for "
        f"{size['pretrain']} steps on each task at lengths {L // 2}..{L} with contiguous positions, so its original "
        f"context is L = {L}. Each method below then fine-tunes it for {size['finetune']} steps at the same "
        f"lengths. YaRN uses factor s = {s} (target {s * L}) with original length {L}; randomized positions are "
        f"n sorted distinct ids from [0, M) for n tokens, with M = {s * L}, or M widened linearly from {L} to "
        f"{s * L} by the curriculum. Evaluation uses contiguous positions at lengths "
        f"{', '.join(map(str, lengths))}, on the same {size['samples']} held-out sequences per length for every "
        f"method; seeds {', '.join(map(str, seeds))}. \"Beyond L\" is a seed's mean accuracy at "
        f"{', '.join(map(str, lengths[1:]))}; ± is the standard deviation over seeds, brackets the range.", "",
        "## Claims", "",
        "| claim | Paper R | measured beyond L: seed-paired difference, mean ± sd [min, max] | threshold | verdict |",
        "|---|---|---|---|---|",
    ]
    for claim, gains in claims.items():
        out.append(f"| {claim} | {paper[claim]} | {'<br>'.join(diff(g) for g in gains)} | every difference "
                   f">= +{RYARN_THRESHOLD} on average and > 0 in every seed | **{verdicts[claim]}** |")
    out += ["", f"## Accuracy by length (mean ± sd over {len(seeds)} seed(s))", ""]
    for task, by_method in accuracy.items():
        out += [f"### {task}", "", "| method | " + " | ".join(map(str, lengths)) + " | beyond L |",
                "|---|" + "---:|" * (len(lengths) + 1)]
        for m, per_seed in by_method.items():
            cells = [pm(list(a)) for a in zip(*per_seed)] + [pm(beyond[task][m])]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    chance = ", ".join(f"{t} 1/{tasks.task_options(t)['symbols']}" for t in accuracy)
    out += ["Methods: " + "; ".join(f"`{m}`: {what}" for m, what in RYARN_LABELS.items()) + f". Chance: {chance}.",
            "", "## What did not reproduce at this scale", ""]
    failed = [g for gains in claims.values() for g in gains if not g["holds"]]
    def shortfall(g):
        if g["mean"] < 0:
            return f"{g['better']} trails {g['worse']}"
        if g["mean"] < RYARN_THRESHOLD:
            return f"{g['better']} leads {g['worse']} by less than {RYARN_THRESHOLD}"
        return f"{g['better']} leads {g['worse']} on average, but not in every seed"

    out += [f"- {diff(g)}: {shortfall(g)}." for g in failed] or ["- Every comparison above held."]
    # Paper R's claims are about long context; what each method costs at the training length is part of the story
    out += ["", "At the original length L itself (mean over seeds): " + "; ".join(
        f"{task} " + ", ".join(f"{m} {spread([acc[0] for acc in accuracy[task][m]])['mean']:.3f}"
                               for m in ("ft", "yarn", "rpe", "ryarn", "ryarn-nocurr"))
        for task in accuracy) + "."]
    return "\n".join(out) + "\n"


EXPERIMENTS["ryarn"] = ryarn_experiment


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
