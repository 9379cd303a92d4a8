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
import copy
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

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
# Distance generalization (python eval.py --experiment distance): Paper D (arXiv 2609.11913). The window is
# fixed; what changes between training and test is the delay d, the number of filler tokens between the two
# control tokens of a delay_copy (C) or selective_copy (S) episode (see tasks.py). Every model is trained by
# train.run exactly as `python train.py ...` would, then evaluated at every delay from 0 to `top`:
#   size  NoPE, RoPE and ALiBi at a few widths (Paper D: small NoPE models fail even in range)
#   (A)   encodings: C and S each trained on a middle band of delays
#   (B)   diversity: C trained on [0, d_max] for several d_max
#   (C)   transfer: C and S trained together (mixed_copy), S on an adjacent or a separated band, against C alone
# ---------------------------------------------------------------------------------------------------------

DISTANCE_ENCODINGS = ("nope", "rope", "alibi")
DISTANCE_COLORS = {"nope": "tab:blue", "rope": "tab:orange", "alibi": "tab:green"}  # the same in every panel

# Paper D: window 256, data tokens 0..127, m = 10, C and S on [15, 25], transfer with S on [25, 35] or [45, 55],
# evaluation at d = 1..120; 8 layers x 512, 8 heads, 40K steps of batch 64, lr 3e-4, 3K warm-up, wd 0.05,
# best of 5 seeds. "default" shrinks all of it until its 35 small models train in ~20 minutes on 2 shared
# CPU cores; results/distance.md lists every change. Bands keep the paper's shape: a middle band, evaluation
# to 4x its top, an adjacent band just above it and a separated one further out.
DISTANCE_SCALES = {
    "quick": dict(window=24, symbols=16, m=2, band=(4, 4), adjacent=(5, 6), separated=(9, 10), top=16,
                  layers=2, heads=4, widths=(32,), width=32, steps=200, batch=32, lr=3e-3, warmup=20, wd=0.05,
                  seeds=1, diversity=(2, 8), diversity_encodings=("rope",), diversity_seeds=1,
                  transfer_encodings=("rope",), transfer_seeds=1, samples=64),
    "default": dict(window=32, symbols=16, m=2, band=(3, 5), adjacent=(6, 8), separated=(12, 14), top=20,
                    layers=2, heads=4, widths=(32, 64), width=32, steps=1100, batch=32, lr=2e-3, warmup=100,
                    wd=0.05, seeds=3, diversity=(1, 3, 6, 10), diversity_encodings=("rope", "alibi"),
                    diversity_seeds=1, transfer_encodings=DISTANCE_ENCODINGS, transfer_seeds=1, samples=128),
    "full": dict(window=256, symbols=128, m=10, band=(15, 25), adjacent=(25, 35), separated=(45, 55), top=120,
                 layers=8, heads=8, widths=(128, 256, 512), width=512, steps=40000, batch=64, lr=3e-4,
                 warmup=3000, wd=0.05, seeds=5, diversity=(5, 10, 20, 30, 50),
                 diversity_encodings=DISTANCE_ENCODINGS, diversity_seeds=5, transfer_encodings=DISTANCE_ENCODINGS,
                 transfer_seeds=5, samples=256),
}

# A region's transfer counts as positive or negative only beyond this accuracy difference: one seed's accuracy
# at one delay, over 128 sequences, has a standard error up to ~0.04, and a region averages several delays.
TRANSFER_MARGIN = 0.05


def span(band: tuple[int, int]) -> str:
    return f"[{band[0]}, {band[1]}]"


def distance_curve(s: dict, scale: str, args, task: str, encoding: str, seed: int, delays: tuple[int, int],
                   selective: tuple[int, int] | None = None, width: int | None = None) -> list[dict]:
    """Train one model (runs/distance/SCALE/NAME) and return its accuracy at every delay 0..top: on S for a
    selective_copy model, otherwise on C alone (so a mixed_copy model is measured on the task it shares with
    its single-task twin)."""
    width = width or s["width"]
    name = f"{task}-{encoding}-w{width}-d{delays[0]}-{delays[1]}" + \
        (f"-s{selective[0]}-{selective[1]}" if selective else "") + f"-seed{seed}"
    out = os.path.join("runs", "distance", scale, name)
    argv = ["--task", task, "--train-len", str(s["window"]), "--symbols", str(s["symbols"]), "--m", str(s["m"]),
            "--delays", f"{delays[0]}:{delays[1]}", "--encoding", encoding, "--layers", str(s["layers"]),
            "--heads", str(s["heads"]), "--dim", str(width), "--steps", str(s["steps"]), "--batch", str(s["batch"]),
            "--lr", str(s["lr"]), "--warmup", str(s["warmup"]), "--wd", str(s["wd"]), "--seed", str(seed),
            "--eval-samples", str(s["samples"]), "--device", args.device, "--out", out, "--force", "--quiet",
            # one thread: on a small shared CPU a tiny model trains fastest single-threaded (README)
            "--threads", str(args.threads or 1)]
    if selective:
        argv += ["--selective-delays", f"{selective[0]}:{selective[1]}"]
    start = time.perf_counter()
    train.run(argv)
    model, cfg = train.load_run(out, args.device)
    measured = "selective_copy" if task == "selective_copy" else "delay_copy"
    cfg = {**cfg, "task": measured, "task_options": {"symbols": s["symbols"], "m": s["m"], "delays": delays}}
    rows, _ = evaluate_run(model, cfg, delays=range(s["top"] + 1), samples=s["samples"], device=args.device)
    print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows


def over_seeds(curves: list[list[dict]], inside) -> dict:
    """Accuracy at every delay as the mean and sd over seeds, and the best seed's curve. Paper D reports the
    best of 5 seeds without naming the criterion; here "best" is the seed with the highest cumulative
    accuracy (sum over every evaluated delay). inside(d) tells the training range, for the in/out sums."""
    delays = [r["delay"] for r in curves[0]]
    acc = torch.tensor([[r["accuracy"] for r in rows] for rows in curves])  # (seeds, delays)
    trained = torch.tensor([inside(d) for d in delays])
    in_sum, out_sum = acc[:, trained].sum(1), acc[:, ~trained].sum(1)
    best = int(acc.sum(1).argmax())
    spread = acc.std(0) if len(curves) > 1 else torch.zeros(len(delays))
    return {"delays": delays, "mean": acc.mean(0).tolist(), "sd": spread.tolist(), "best_seed": best,
            "best": acc[best].tolist(), "per_seed": acc.tolist(), "in_mean": acc[:, trained].mean(1).tolist(),
            "in_sum": in_sum.tolist(), "out_sum": out_sum.tolist(),
            "ratio": (out_sum / in_sum.clamp(min=1e-9)).tolist()}


def mean_sd(values: list[float], digits: int = 2) -> str:
    """'0.93 ± 0.02' over seeds; a single seed shows just its value."""
    t = torch.tensor(values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{float(t.mean()):.{digits}f} ± {float(t.std()):.{digits}f}"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def transfer_regions(delta: list[float], delays: list[int], band, s_band) -> dict:
    """Mean accuracy change of C (mixed minus alone) where C trained, at every delay C never trained on, where
    only S trained, below C's band, between the two bands (the separated setting), and beyond S's band."""
    regions = {"C range": lambda d: band[0] <= d <= band[1],
               "unseen": lambda d: not band[0] <= d <= band[1],
               "S range": lambda d: s_band[0] <= d <= s_band[1],
               "below": lambda d: d < band[0],
               "between": lambda d: band[1] < d < s_band[0],
               "beyond": lambda d: d > s_band[1]}
    out = {}
    for name, inside in regions.items():
        values = [x for x, d in zip(delta, delays) if inside(d)]
        if values:
            out[name] = mean(values)
    return out


def sign(x: float) -> str:
    return "positive" if x > TRANSFER_MARGIN else "negative" if x < -TRANSFER_MARGIN else "none"


def verdict(checks: list[tuple[str, str, bool | None]]) -> str:
    """Every checked sub-claim holds: reproduced; none: not reproduced; otherwise partly. None = not measured."""
    measured = [ok for _, _, ok in checks if ok is not None]
    if not measured:
        return "not measured"
    return "reproduced" if all(measured) else "not reproduced" if not any(measured) else "partly reproduced"


def check_table(checks: list[tuple[str, str, bool | None]]) -> list[str]:
    rows = ["| sub-claim | measured | holds |", "|---|---|---|"]
    return rows + [f"| {claim} | {measured} | {'—' if ok is None else 'yes' if ok else 'no'} |"
                   for claim, measured, ok in checks]


PAPER_D_FINDINGS = {
    "size": "small NoPE models fail even inside the training range; RoPE and ALiBi stay stable when small",
    "A, delay copy": "trained on d in [15, 25], all encodings fit in range; at unseen d NoPE is best, RoPE worst, "
                     "ALiBi between",
    "A, selective copy": "the same ordering on the selective copy task",
    "B": "with d in [0, d_max], out-of-range accuracy rises with d_max, but relative to in-range accuracy it falls "
         "(diminishing returns)",
    "C": "C on [15, 25] with S on [25, 35]: RoPE mostly negative transfer, NoPE/ALiBi positive at moderate unseen d "
         "and negative further out; with S on [45, 55]: NoPE/ALiBi damage C even in its own range, RoPE transfers "
         "weakly without in-range damage",
}


def distance_checks(s, size, part_a, part_b, part_c) -> dict[str, list[tuple[str, str, bool | None]]]:
    """Each of Paper D's findings split into sub-claims, each with what we measured and whether it holds."""
    small, large = min(s["widths"]), max(s["widths"])
    in_mean = {w: {e: mean(size[w][e]["in_mean"]) for e in DISTANCE_ENCODINGS} for w in s["widths"]}
    explicit = min(in_mean[small]["rope"], in_mean[small]["alibi"])
    checks = {"size": [
        (f"NoPE fails in range at the smallest width ({small}): in-range accuracy < 0.5",
         f"{in_mean[small]['nope']:.2f}", in_mean[small]["nope"] < 0.5),
        (f"RoPE and ALiBi stay stable at width {small}: both >= 0.9 in range", f"{explicit:.2f} (the lower)",
         explicit >= 0.9),
        # Paper D's (A) models are large enough that NoPE fits: failure is a matter of size
        (f"NoPE learns once larger: >= 0.9 in range at width {large}", f"{in_mean[large]['nope']:.2f}",
         in_mean[large]["nope"] >= 0.9)]}
    for task, label in (("delay_copy", "A, delay copy"), ("selective_copy", "A, selective copy")):
        runs = part_a[task]
        fit = min(max(runs[e]["in_mean"]) for e in DISTANCE_ENCODINGS)  # best seed of the weakest encoding
        out = {e: mean(runs[e]["out_sum"]) for e in DISTANCE_ENCODINGS}
        order = " > ".join(f"{e} {out[e]:.2f}" for e in sorted(out, key=out.get, reverse=True))
        checks[label] = [
            ("every encoding fits its training band (best seed >= 0.9 in range)", f"weakest {fit:.2f}", fit >= 0.9),
            ("NoPE best at unseen delays (out-of-range sum, mean over seeds)", order, max(out, key=out.get) == "nope"),
            ("RoPE worst at unseen delays", order, min(out, key=out.get) == "rope")]
    checks["B"] = []
    for e, by_max in part_b.items():
        first, last = min(by_max), max(by_max)
        out = [mean(by_max[d]["out_sum"]) for d in (first, last)]
        ratio = [mean(by_max[d]["ratio"]) for d in (first, last)]
        checks["B"] += [
            (f"{e}: out-of-range sum rises from d_max {first} to {last}", f"{out[0]:.2f} -> {out[1]:.2f}",
             out[1] > out[0]),
            (f"{e}: out-of-range / in-range falls from d_max {first} to {last}", f"{ratio[0]:.2f} -> {ratio[1]:.2f}",
             ratio[1] < ratio[0])]

    def claim(text, setting, encodings, name, holds):
        """C's mean accuracy change (mixed minus alone) in one region, per encoding; holds for each?"""
        if any(e not in part_c[setting] for e in encodings):
            return text, "not run at this scale", None
        values = [part_c[setting][e]["regions"][name] for e in encodings]
        return text, ", ".join(f"{e} {v:+.2f}" for e, v in zip(encodings, values)), all(holds(v) for v in values)

    checks["C"] = [
        claim("adjacent: RoPE's transfer is negative at C's unseen delays", "adjacent", ("rope",), "unseen",
              lambda v: v < -TRANSFER_MARGIN),
        claim("adjacent: NoPE and ALiBi gain at moderate unseen delays (S's band)", "adjacent", ("nope", "alibi"),
              "S range", lambda v: v > TRANSFER_MARGIN),
        claim("adjacent: NoPE and ALiBi lose further out (beyond S's band)", "adjacent", ("nope", "alibi"),
              "beyond", lambda v: v < -TRANSFER_MARGIN),
        claim("separated: NoPE and ALiBi damage C inside its own band", "separated", ("nope", "alibi"),
              "C range", lambda v: v < -TRANSFER_MARGIN),
        claim("separated: RoPE keeps C's own band (change >= -margin)", "separated", ("rope",), "C range",
              lambda v: v >= -TRANSFER_MARGIN)]
    return checks


def distance_markdown(s, scale, command, runtime, part_a, size, part_b, part_c):
    """results/distance.md: setup and every change from Paper D, then per question the paper's finding, our
    numbers and a verdict computed from sub-claims. Returns (markdown, checks)."""
    lo, hi = s["band"]
    checks = distance_checks(s, size, part_a, part_b, part_c)
    verdicts = {name: verdict(c) for name, c in checks.items()}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    width, layers, heads = s["width"], s["layers"], s["heads"]
    md = [f"# Distance generalization (Paper D, arXiv 2609.11913)\n",
          f"`{command}` took {runtime / 60:.1f} minutes on {machine}, one model at a time, one torch thread "
          f"(load average {os.getloadavg()[0]:.1f} at the end). Every number below "
          "comes from that run; per-delay curves of every seed are in `distance.json`.\n",
          "Paper D asks whether a positional encoding helps a transformer copy tokens across delays it never saw "
          "in training, at a fixed context length. A delay copy episode (task C) is m source tokens, a control "
          "token, d filler tokens, the control token again, then the m source tokens; selective copy (task S) "
          "reproduces only the even-valued source tokens. **d is the number of filler tokens strictly between the "
          "two control tokens** (C-to-C distance minus 1), so in task C every source token is reproduced "
          f"m + d + 2 positions later; Paper D does not say which it counts. Accuracy: teacher-forced, per "
          f"reproduced token, {s['samples']} windows per delay (chance is about 1/{s['symbols']}).\n",
          "## Setup: Paper D and this run\n",
          "| | Paper D | here |", "|---|---|---|",
          f"| window T | 256 | {s['window']} |",
          f"| data tokens | 128 | {s['symbols']} |",
          f"| m (tokens copied) | 10 | {s['m']} |",
          f"| C and S training band (A) | [15, 25] | {span(s['band'])} |",
          f"| delays evaluated | 1..120 | 0..{s['top']} (4 x the band's top = {4 * hi}) |",
          f"| diversity d_max (B) | 5, 10, 20, 30, 50 | {', '.join(map(str, s['diversity']))} |",
          f"| S bands in transfer (C) | [25, 35], [45, 55] | {span(s['adjacent'])}, {span(s['separated'])} |",
          f"| model | 8 layers x 512, 8 heads | {layers} layers x {width}, {heads} heads |",
          f"| widths in the size sweep | smaller than 512 (sizes not in our sources) | "
          f"{', '.join(map(str, s['widths']))} |",
          "| MLP, dropout | ReLU, 0.1 | GELU, none (lengen's GPT; train.py has no dropout flag) |",
          f"| steps x batch | 40K x 64 | {s['steps']} x {s['batch']} |",
          f"| lr, warm-up, weight decay | 3e-4, 3K, 0.05 (AdamW) | {s['lr']:g}, {s['warmup']}, {s['wd']:g} (AdamW, "
          "cosine decay to a tenth) |",
          "| loss mask | R tokens, control tokens, first 18 positions | everything but reproduced tokens whose "
          "source lies inside the window (exact, instead of the first 18) |",
          f"| seeds | best of 5 | (A) {s['seeds']}, size 1, (B) {s['diversity_seeds']}, (C) {s['transfer_seeds']}; "
          "mean ± sd and the best seed (highest cumulative accuracy) |",
          f"| encodings | NoPE, RoPE, ALiBi | all three in size and (A); (B) "
          f"{', '.join(s['diversity_encodings'])}; (C) {', '.join(s['transfer_encodings'])} |"]
    if scale != "full":
        md.append("\nWhere a part has fewer than 3 seeds or fewer than the three encodings, that is a cut made to "
                  "fit the time budget, not a finding; `--full` runs every part with 5 seeds and all three "
                  "encodings, at Paper D's sizes (a GPU helps).")
    md += ["\n## Verdicts\n", "| question | Paper D | verdict |", "|---|---|---|"]
    md += [f"| {name} | {PAPER_D_FINDINGS[name]} | **{v}** |" for name, v in verdicts.items()]
    md.append("\nA verdict is *reproduced* when every sub-claim below holds, *not reproduced* when none does, "
              f"*partly* otherwise. Transfer counts as positive or negative only beyond ±{TRANSFER_MARGIN} "
              "accuracy.\n")

    md += ["## Size\n", f"Paper D: {PAPER_D_FINDINGS['size']}. Here: C trained on {span(s['band'])}, seed 0 at "
           "each width. In range: mean accuracy over the training band; cumulative: the sum of accuracy over every "
           f"evaluated delay (at most {s['top'] + 1}).\n",
           "| width | " + " | ".join(f"{e} in range | {e} cumulative" for e in DISTANCE_ENCODINGS) + " |",
           "|---:|" + "---:|" * 2 * len(DISTANCE_ENCODINGS)]
    for w, runs in size.items():
        cells = [f"{runs[e]['in_mean'][0]:.2f} | {runs[e]['in_sum'][0] + runs[e]['out_sum'][0]:.1f}"
                 for e in DISTANCE_ENCODINGS]
        md.append(f"| {w} | " + " | ".join(cells) + " |")
    md += ["", *check_table(checks["size"]), f"\n**Verdict: {verdicts['size']}.**\n"]

    shown = sorted({0, lo - 1, lo, hi, hi + 1, 2 * hi, 3 * hi, 4 * hi} & set(range(s["top"] + 1)))
    for task, label in (("delay_copy", "A, delay copy"), ("selective_copy", "A, selective copy")):
        runs = part_a[task]
        md += [f"## ({label})\n", f"Paper D: {PAPER_D_FINDINGS[label]}. Here: trained on {span(s['band'])}, "
               f"{s['seeds']} seed(s) per encoding; mean ± sd over seeds, and the best seed.\n",
               "| encoding | in range | out-of-range sum | best seed: in range, out-of-range sum | " +
               " | ".join(f"d={d}" for d in shown) + " |", "|---|---:|---:|---:|" + "---:|" * len(shown)]
        for e in DISTANCE_ENCODINGS:
            r, b = runs[e], runs[e]["best_seed"]
            cells = [mean_sd([seed[r["delays"].index(d)] for seed in r["per_seed"]]) for d in shown]
            md.append(f"| {e} | {mean_sd(r['in_mean'])} | {mean_sd(r['out_sum'], 1)} | "
                      f"{r['in_mean'][b]:.2f}, {r['out_sum'][b]:.1f} | " + " | ".join(cells) + " |")
        md += ["", *check_table(checks[label]), f"\n**Verdict: {verdicts[label]}.**\n"]

    md += ["## (B) Diversity\n", f"Paper D: {PAPER_D_FINDINGS['B']}. Here: C trained on [0, d_max], evaluated at "
           f"0..{s['top']}; sums of accuracy over the delays inside and outside [0, d_max], "
           f"{s['diversity_seeds']} seed(s).\n",
           "| encoding | d_max | in-range sum | out-of-range sum | out / in | out-of-range mean |",
           "|---|---:|---:|---:|---:|---:|"]
    for e, by_max in part_b.items():
        for d_max, r in by_max.items():
            unseen = s["top"] - d_max
            md.append(f"| {e} | {d_max} | {mean_sd(r['in_sum'], 1)} | {mean_sd(r['out_sum'], 1)} | "
                      f"{mean_sd(r['ratio'])} | {mean(r['out_sum']) / unseen:.2f} |")
    md += ["", *check_table(checks["B"]), f"\n**Verdict: {verdicts['B']}.**\n"]

    md += ["## (C) Transfer\n", f"Paper D: {PAPER_D_FINDINGS['C']}. Here: mixed_copy trains C on "
           f"{span(s['band'])} together with S on {span(s['adjacent'])} (adjacent) or {span(s['separated'])} "
           "(separated), half the episodes each; C alone is the (A) model with the same seed. Both are measured "
           "on C, after the same number of steps, so the mixed model has seen half as many C episodes: where "
           "models are not converged, that alone can lower C in its own range. Cells: C's mean accuracy change "
           f"(mixed minus alone) in each region, {s['transfer_seeds']} seed(s).\n",
           "| setting | encoding | C alone in range | C range | unseen (all) | below | between | S range | beyond |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for setting, by_encoding in part_c.items():
        for e, r in by_encoding.items():
            cells = [f"{r['regions'][n]:+.2f} ({sign(r['regions'][n])})" if n in r["regions"] else "—"
                     for n in ("C range", "unseen", "below", "between", "S range", "beyond")]
            md.append(f"| {setting} | {e} | {mean(r['alone']['in_mean']):.2f} | " + " | ".join(cells) + " |")
    md += ["", *check_table(checks["C"]), f"\n**Verdict: {verdicts['C']}.**\n"]
    return "\n".join(md) + "\n", checks


def distance_figure(plt, s, size, part_a, part_b, part_c):
    """Size, (A) for C and S, (B) out-of-range sum and ratio against d_max, (C) C's change per delay."""
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    band = (s["band"][0] - 0.5, s["band"][1] + 0.5)  # shade whole delays, so a one-delay band shows too

    def band_rows(summary):  # rows for plot_curves: the mean over seeds, its band ± one sd
        return [{"delay": d, "accuracy": v, "low": v - e, "high": v + e}
                for d, v, e in zip(summary["delays"], summary["mean"], summary["sd"])]

    ax = axes[0, 0]
    for e in DISTANCE_ENCODINGS:
        ax.plot(s["widths"], [size[w][e]["in_mean"][0] for w in s["widths"]], marker="o", label=e,
                color=DISTANCE_COLORS[e])
    ax.set(xticks=s["widths"], ylim=(-0.02, 1.02), xlabel="width",
           ylabel="in-range accuracy", title=f"size: C on {span(s['band'])}, seed 0")
    ax.legend(fontsize=8)

    for ax, task, label in ((axes[0, 1], "delay_copy", "(A) delay copy"), (axes[0, 2], "selective_copy",
                                                                          "(A) selective copy")):
        plot_curves(ax, {e: band_rows(part_a[task][e]) for e in DISTANCE_ENCODINGS}, "delay", band, log_x=False)
        ax.set_title(f"{label}, mean ± sd of {s['seeds']} seed(s)")

    for ax, field, title in ((axes[0, 3], "out_sum", "(B) out-of-range sum"), (axes[1, 0], "ratio",
                                                                            "(B) out-of-range / in-range")):
        for e, by_max in part_b.items():
            ax.plot(list(by_max), [mean(r[field]) for r in by_max.values()], marker="o", label=e,
                    color=DISTANCE_COLORS[e])
        ax.set(xlabel="d_max (trained on [0, d_max])", title=title)
        ax.legend(fontsize=8)

    for ax, setting in ((axes[1, 1], "adjacent"), (axes[1, 2], "separated")):
        for e, r in part_c[setting].items():
            ax.plot(r["alone"]["delays"], r["delta"], marker="o", ms=3, label=e, color=DISTANCE_COLORS[e])
        ax.axhline(0, color="black", lw=0.8)
        ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="C trained")
        ax.axvspan(s[setting][0] - 0.5, s[setting][1] + 0.5, color="tab:purple", alpha=0.15, lw=0,
                   label="S trained")
        ax.set(ylim=(-1.02, 1.02), xlabel="delay", ylabel="C accuracy: mixed - alone",
               title=f"(C) transfer, S {setting} {span(s[setting])}")
        ax.legend(fontsize=8)

    ax = axes[1, 3]
    for e in DISTANCE_ENCODINGS:  # the best seed of (A), as Paper D plots it
        ax.plot(part_a["delay_copy"][e]["delays"], part_a["delay_copy"][e]["best"], marker="o", ms=3, label=e,
                color=DISTANCE_COLORS[e])
    ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="trained")
    ax.set(ylim=(-0.02, 1.02), xlabel="delay", ylabel="accuracy", title="(A) delay copy, best seed")
    ax.legend(fontsize=8)
    fig.suptitle(f"Distance generalization (Paper D) at small scale: window {s['window']}, m {s['m']}, "
                 f"{s['symbols']} symbols, {s['layers']} layers x {s['width']}, {s['steps']} steps")
    fig.tight_layout()
    return fig


def distance(args) -> None:
    scale = "quick" if args.quick else "full" if args.full else "default"
    s = DISTANCE_SCALES[scale]
    start = time.perf_counter()
    lo, hi = s["band"]
    cache = {}

    def curves(task, encoding, seeds, delays, selective=None, width=None):
        """One curve per seed; a model already trained in this run (same settings) is reused, not retrained."""
        out = []
        for seed in range(seeds):
            key = (task, encoding, seed, delays, selective, width or s["width"])
            if key not in cache:
                cache[key] = distance_curve(s, scale, args, task, encoding, seed, delays, selective, width)
            out.append(cache[key])
        return out

    def in_band(d):
        return lo <= d <= hi

    # (A) first: its seed-0 C models at the chosen width are also the size sweep's models at that width
    print(f"distance ({scale}): (A) encodings on {span(s['band'])}", file=sys.stderr)
    part_a = {task: {e: over_seeds(curves(task, e, s["seeds"], s["band"]), in_band) for e in DISTANCE_ENCODINGS}
              for task in ("delay_copy", "selective_copy")}
    print("distance: size", file=sys.stderr)
    size = {w: {e: over_seeds(curves("delay_copy", e, 1, s["band"], width=w), in_band) for e in DISTANCE_ENCODINGS}
            for w in s["widths"]}
    print("distance: (B) diversity", file=sys.stderr)
    part_b = {e: {d_max: over_seeds(curves("delay_copy", e, s["diversity_seeds"], (0, d_max)),
                                    lambda d, d_max=d_max: d <= d_max)
                  for d_max in s["diversity"]} for e in s["diversity_encodings"]}
    print("distance: (C) transfer", file=sys.stderr)
    part_c = {}
    for setting in ("adjacent", "separated"):
        part_c[setting] = {}
        for e in s["transfer_encodings"]:
            alone = over_seeds(curves("delay_copy", e, s["transfer_seeds"], s["band"]), in_band)
            mixed = over_seeds(curves("mixed_copy", e, s["transfer_seeds"], s["band"], s[setting]), in_band)
            delta = [m - a for m, a in zip(mixed["mean"], alone["mean"])]
            part_c[setting][e] = {"alone": alone, "mixed": mixed, "delta": delta,
                                  "regions": transfer_regions(delta, alone["delays"], s["band"], s[setting])}
    runtime = time.perf_counter() - start

    command = "python eval.py --experiment distance" + {"quick": " --quick", "full": " --full", "default": ""}[scale]
    md, checks = distance_markdown(s, scale, command, runtime, part_a, size, part_b, part_c)
    data = {"command": command, "scale": scale, "settings": s, "runtime_s": runtime,
            "transfer_margin": TRANSFER_MARGIN,
            "verdicts": {name: {"verdict": verdict(c), "checks": [{"claim": claim, "measured": measured, "holds": ok}
                                                                  for claim, measured, ok in c]}
                         for name, c in checks.items()},
            "size": size, "A": part_a, "B": part_b, "C": part_c}
    write_results("distance", md, data, lambda plt: distance_figure(plt, s, size, part_a, part_b, part_c),
                  args.out_dir)


EXPERIMENTS["distance"] = distance


# ---------------------------------------------------------------------------------------------------------
# Benchmark (python eval.py --bench): training speed per encoding, evaluation memory at long length, and the
# cost of patching a Hugging Face model. Machines here are shared and noisy, so every figure is a ratio
# measured in the same run, each timing the best of several repeats.
# ---------------------------------------------------------------------------------------------------------

BENCH_VARIANTS = [  # label, GPTConfig settings
    ("nope", dict(encoding="nope")),
    ("learned", dict(encoding="learned")),
    ("sinusoidal", dict(encoding="sinusoidal")),
    ("rope", dict(encoding="rope")),
    ("rope+yarn", dict(encoding="rope", scaling="yarn", factor=4.0)),
    ("alibi", dict(encoding="alibi")),
    ("nope, linear", dict(encoding="nope", attention="linear")),
    ("rope, linear", dict(encoding="rope", attention="linear")),
]


def plain_forward(model: lengen.GPT, idx: torch.Tensor) -> torch.Tensor:
    """The same model written the plain way, as the speed reference: attention spelled out with a T x T
    mask, RoPE's cos/sin recomputed in every layer of every step, ALiBi's T x T bias built in every layer.
    It shares model's weights, and the bench checks it gives the same logits."""
    cfg, pos = model.config, model.pos
    B, T = idx.shape
    H, D = cfg.n_head, cfg.d_model // cfg.n_head
    positions = torch.arange(T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = model.tok(idx)
    if pos.acts_on == "input":
        x = x + pos.embed(positions)
    for block in model.blocks:
        q, k, v = block.attn.qkv(block.ln1(x)).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        if pos.acts_on == "qk":
            phase = positions.float()[:, None] * pos.inv_freq[None]
            cos = torch.cat((phase, phase), -1).cos() * pos.attention_scale
            sin = torch.cat((phase, phase), -1).sin() * pos.attention_scale
            q, k = q * cos + lengen.rotate_half(q) * sin, k * cos + lengen.rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / D ** 0.5  # (B, H, T, T)
        if pos.acts_on == "logits":
            scores = scores - pos.slopes[:, None, None] * (positions[:, None] - positions[None, :])
        if cfg.attention == "linear":
            weights = scores * causal
        else:
            weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + block.attn.proj((weights @ v).transpose(1, 2).reshape(B, T, H * D))
        if block.mlp is not None:
            x = x + block.mlp(block.ln2(x))
    return model.head(model.ln_f(x))


def best_times(fns: dict, repeats: int) -> dict:
    """Best wall time of each function, the functions taking turns in every repeat so that a noisy
    neighbour slows them all alike; one untimed warm-up call each."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def training_speed(shape: dict, steps: int, repeats: int, compile_rope: bool) -> list[dict]:
    """Tokens/s of full training steps (forward, backward, AdamW) for every variant, lengen vs plain."""
    B, T = shape["batch"], shape["length"]
    x = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(0))

    def training(model, forward):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def go():
            for _ in range(steps):
                loss = F.cross_entropy(forward(x).flatten(0, 1), x.flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        return go

    fns = {}
    for label, settings in BENCH_VARIANTS:
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, n_layer=shape["layers"], n_head=shape["heads"],
                                            d_model=shape["dim"], original_max_len=T, max_len=T, **settings))
        with torch.no_grad():
            assert torch.allclose(model(x), plain_forward(model, x), atol=1e-4), f"{label}: plain != lengen"
        fns[label] = training(model, model)
        fns[label, "plain"] = training(model, lambda i, m=model: plain_forward(m, i))
        if compile_rope and label == "rope":
            fns[label, "compiled"] = training(model, torch.compile(model))
    best = best_times(fns, repeats)
    rate = {name: B * T * steps / seconds for name, seconds in best.items()}
    rows = []
    for label, _ in BENCH_VARIANTS:
        row = {"variant": label, "tokens_per_s": rate[label], "plain_tokens_per_s": rate[label, "plain"],
               "cost_vs_nope": rate["nope"] / rate[label],  # > 1: slower than NoPE
               "speedup_vs_plain": rate[label] / rate[label, "plain"]}
        if (label, "compiled") in rate:
            row["compiled_tokens_per_s"] = rate[label, "compiled"]
        rows.append(row)
    return rows


def _memory_probe(encoding: str, length: int, threads: int | None, result) -> None:
    """Runs in a fresh process, so the peak resident memory it reports is this evaluation's alone."""
    import resource
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = lengen.GPT(lengen.GPTConfig(vocab_size=64, n_layer=2, n_head=4, d_model=128, encoding=encoding,
                                        max_len=length)).eval()
    idx = torch.randint(0, 64, (1, length))
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
    start = time.perf_counter()
    with torch.no_grad():
        model(idx)
    seconds = time.perf_counter() - start
    result.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit - before, seconds))


def evaluation_memory(lengths: list[int], threads: int | None) -> list[dict]:
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    rows = []
    for encoding in lengen.ENCODINGS:
        for length in lengths:
            queue = context.Queue()
            probe = context.Process(target=_memory_probe, args=(encoding, length, threads, queue))
            probe.start()
            extra, seconds = queue.get()
            probe.join()
            rows.append({"encoding": encoding, "length": length, "peak_mb": extra / 2 ** 20, "seconds": seconds})
    return rows


def hf_patch_cost(length: int, repeats: int, smollm2: bool) -> list[dict]:
    """Forward time of a Hugging Face Llama before and after patch_hf_rope (YaRN x4): the same kernels run,
    so the patch should cost nothing."""
    try:
        import transformers
    except ImportError:
        return []
    models = []
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=length)
    torch.manual_seed(0)
    models.append(("tiny random Llama", transformers.LlamaForCausalLM(config).eval(), length))
    if smollm2 and train.smollm2_gguf():
        models.append(("SmolLM2-135M", train.load_llm("smollm2")[0], 2048))
    rows = []
    for label, model, n in models:
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        patched = copy.deepcopy(model)
        lengen.patch_hf_rope(patched, *lengen.yarn_frequencies(head_dim, model.config.rope_parameters["rope_theta"],
                                                               4.0, n))

        def forward(m):
            def go():
                with torch.no_grad():
                    m(ids, position_ids=torch.arange(n)[None], logits_to_keep=1)
            return go

        best = best_times({"unpatched": forward(model), "patched": forward(patched)}, repeats)
        rows.append({"model": label, "length": n, "unpatched_s": best["unpatched"], "patched_s": best["patched"],
                     "ratio": best["patched"] / best["unpatched"]})
    return rows


def bench(args) -> None:
    import platform
    start = time.perf_counter()
    shapes = [dict(name="4x128, T 64, batch 12", layers=4, dim=128, heads=4, length=64, batch=12),
              dict(name="4x256, T 256, batch 8", layers=4, dim=256, heads=8, length=256, batch=8)]
    lengths, steps, repeats, compile_rope, smollm2 = [4096, 8192, 16384, 32768], 10, 3, True, True
    if args.quick:
        shapes = [dict(name="2x32, T 32, batch 4", layers=2, dim=32, heads=2, length=32, batch=4)]
        lengths, steps, repeats, compile_rope, smollm2 = [256, 512], 2, 1, False, False
    speed = {s["name"]: training_speed(s, steps, repeats, compile_rope) for s in shapes}
    memory = evaluation_memory(lengths, args.threads)
    hf = hf_patch_cost(512 if not args.quick else 64, repeats + 2, smollm2)
    runtime = time.perf_counter() - start

    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"{torch.get_num_threads()} threads")
    command = "python eval.py --bench" + (" --quick" if args.quick else "") + \
        (f" --threads {args.threads}" if args.threads else "")
    md = [f"# Speed and memory\n\n`{command}` on {machine}; {runtime:.0f} s.\n",
          "Timings are the best of repeats; ratios compare variants measured in the same run.\n"]
    for name, rows in speed.items():
        md += [f"\n## Training steps, {name}\n",
               "| variant | tokens/s | cost vs NoPE | plain reference tokens/s | lengen vs plain |",
               "|---|---:|---:|---:|---:|"]
        md += [f"| {r['variant']} | {r['tokens_per_s']:,.0f} | {r['cost_vs_nope']:.2f}x | "
               f"{r['plain_tokens_per_s']:,.0f} | {r['speedup_vs_plain']:.2f}x |" for r in rows]
        compiled = [r for r in rows if "compiled_tokens_per_s" in r]
        if compiled:
            c = compiled[0]
            md.append(f"\ntorch.compile (rope): {c['compiled_tokens_per_s']:,.0f} tokens/s, "
                      f"{c['compiled_tokens_per_s'] / c['tokens_per_s']:.2f}x eager.")
    md += ["\n## Evaluation at long length (2 layers x 128, 4 heads, batch 1, one forward)\n",
           "| encoding | " + " | ".join(f"{n} tokens" for n in lengths) + f" | peak {lengths[-1]} / {lengths[-2]} |",
           "|---|" + "---:|" * (len(lengths) + 1)]
    for encoding in lengen.ENCODINGS:
        rows = {r["length"]: r for r in memory if r["encoding"] == encoding}
        cells = [f"{rows[n]['peak_mb']:.0f} MB, {rows[n]['seconds']:.1f} s" for n in lengths]
        growth = rows[lengths[-1]]["peak_mb"] / max(rows[lengths[-2]]["peak_mb"], 1e-9)
        md.append(f"| {encoding} | " + " | ".join(cells) + f" | {growth:.2f}x |")
    if hf:
        md += ["\n## Patched Hugging Face forward (YaRN x4 through patch_hf_rope)\n",
               "| model | tokens | unpatched | patched | ratio |", "|---|---:|---:|---:|---:|"]
        md += [f"| {r['model']} | {r['length']} | {r['unpatched_s']:.3f} s | {r['patched_s']:.3f} s | "
               f"{r['ratio']:.3f} |" for r in hf]
    first = next(iter(speed.values()))
    by = {r["variant"]: r for r in first}
    growths = [next(r for r in memory if r["encoding"] == e and r["length"] == lengths[-1])["peak_mb"] /
               max(next(r for r in memory if r["encoding"] == e and r["length"] == lengths[-2])["peak_mb"], 1e-9)
               for e in lengen.ENCODINGS]
    targets = [("RoPE step cost <= 1.10x NoPE", by["rope"]["cost_vs_nope"], by["rope"]["cost_vs_nope"] <= 1.10),
               ("YaRN step cost <= 1.10x NoPE", by["rope+yarn"]["cost_vs_nope"],
                by["rope+yarn"]["cost_vs_nope"] <= 1.10),
               ("lengen at least as fast as plain (worst variant)", min(r["speedup_vs_plain"] for r in first),
                min(r["speedup_vs_plain"] for r in first) >= 1.0),
               (f"peak memory {lengths[-1]} / {lengths[-2]} <= 2.2x (worst encoding)", max(growths),
                max(growths) <= 2.2)]
    if hf:
        worst = max(r["ratio"] for r in hf)
        targets.append(("patched HF forward <= 1.02x unpatched (worst model)", worst, worst <= 1.02))
    md += [f"\n## Targets (first shape: {next(iter(speed))})\n", "| target | measured | met |", "|---|---:|---|"]
    md += [f"| {name} | {value:.2f} | {'yes' if ok else 'no'} |" for name, value, ok in targets]
    data = {"command": command, "machine": machine, "runtime_s": runtime, "training": speed, "memory": memory,
            "hf": hf, "targets": [{"target": n, "measured": v, "met": ok} for n, v, ok in targets]}
    write_results("bench", "\n".join(md) + "\n", data, None, args.out_dir)


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
    p.add_argument("--bench", action="store_true", help="speed and memory benchmark (results/bench.md)")
    p.add_argument("--out-dir", default="results", help="experiment or bench: where results go")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.bench:
            bench(args)
        elif args.experiment:
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
