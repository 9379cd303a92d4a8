"""Paper D (arXiv 2609.11913, Nevermann and Gros): distance generalization in transformers, NoPE vs RoPE vs
ALiBi on delay copy and selective copy.

    python eval.py --experiment distance       # results/distance.{md,json,png}

The window is fixed; what changes between training and test is the delay d, the number of filler tokens
between the two control tokens of a delay_copy (C) or selective_copy (S) episode (see tasks.py). Every model
is trained by train.run exactly as `python train.py ...` would, then evaluated at every delay from 0 to `top`:
  size  NoPE, RoPE and ALiBi at a few sizes, layers x width (Paper D: small NoPE models fail even in range)
  (A)   encodings: C and S each trained on a middle band of delays
  (B)   diversity: C trained on [0, d_max] for several d_max
  (C)   transfer: C and S trained together (mixed_copy), S on an adjacent or a separated band, against C alone
Read top to bottom: the settings, training and measuring one curve, the findings as comparisons over seeds
(decided by the shared rule), the markdown and the figure, the probe, run(args).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import re
import sys
import time

import torch

from eval import command_line, evaluate_table, load_run, plot_curves, results_name, scale_name
from experiments.common import (ALIBI_SLOPE_HEADS, FIT_BAR, THRESHOLD, UNFIT, all_of, caption, cpu_per_step,
                                cpu_seconds, decide, fmt, line_styles, map_jobs, probe, probe_cell, probe_cost,
                                probe_on_record, probe_table, rerender, runtime, seed_curve, short, spread, train_once,
                                write_results)
from runs import read_fit

DISTANCE_ENCODINGS = ("nope", "rope", "alibi")
STYLES = line_styles(DISTANCE_ENCODINGS)  # each encoding in one colour in every panel

# Paper D: window 256, data tokens 0..127, m = 10, C and S on [15, 25], transfer with S on [25, 35] or [45, 55],
# evaluation at d = 1..120; 8 layers x 512, 8 heads, 40K steps of batch 64, lr 3e-4, 3K warm-up, wd 0.05,
# best of 5 seeds. Every model here trains until it fits its band (common.FIT_BAR on held-out windows at the
# band's delays, checked every `every` steps) or `steps`, the cap. "default" shrinks the rest until its models
# train in about an hour on 2 shared CPU cores, as its probe (below) measured them; results/distance.md lists
# every change. Bands keep the paper's shape: a middle band, evaluation to 4x its top, an adjacent band just
# above it and a separated one further out.
SCALES = {
    "quick": dict(window=24, symbols=16, m=2, band=(4, 4), adjacent=(5, 6), separated=(9, 10), top=16,
                  layers=2, heads=4, width=32, sizes=((1, 32), (2, 32)), steps=200, every=50, batch=32, lr=3e-3,
                  warmup=20, wd=0.05, seeds=1, size_seeds=1, diversity=(2, 8), diversity_encodings=("rope",),
                  diversity_seeds=1, transfer_encodings=("rope",), transfer_seeds=1, samples=64),
    "default": dict(window=32, symbols=16, m=2, band=(3, 5), adjacent=(6, 8), separated=(12, 14), top=20,
                    layers=4, heads=4, width=64, sizes=((4, 32), (4, 64)), steps=6000, every=100,
                    batch=32, lr=5e-4, warmup=300, wd=0.05, seeds=3, size_seeds=3, diversity=(1, 3, 6, 10),
                    diversity_encodings=("rope", "alibi"), diversity_seeds=3, transfer_encodings=("rope", "alibi"),
                    transfer_seeds=3, samples=128),
    "full": dict(window=256, symbols=128, m=10, band=(15, 25), adjacent=(25, 35), separated=(45, 55), top=120,
                 layers=8, heads=8, width=512, sizes=((8, 128), (8, 256), (8, 512)), steps=40000, every=500,
                 batch=64, lr=3e-4, warmup=3000, wd=0.05, seeds=5, size_seeds=5, diversity=(5, 10, 20, 30, 50),
                 diversity_encodings=DISTANCE_ENCODINGS, diversity_seeds=5, transfer_encodings=DISTANCE_ENCODINGS,
                 transfer_seeds=5, samples=256),
}

# eval.py --experiment distance --probe: (A)'s tasks and encodings, seed 0, at every size of the sweep, each
# trained until it fits its band or 6000 steps (Paper D trains 40K steps at window 256, ~156 a token of
# window: ~5000 at this window), to learn what fitting takes before the default is planned. Why (A) has 4
# layers: a first probe at 2 layers (results/distance-probe.md at commit 9507a7c) fitted RoPE and ALiBi at
# widths 32-128 and NoPE at none, C or S, in 6000 steps; by hand, NoPE at 4 layers x 64 fitted C at step 3900.
# Why lr 5e-4 (Paper D: 3e-4 for every encoding): at 2e-3 (the probe at commit aef3fdc) NoPE fitted S at no
# size (0.33 at 6000 steps at 4 x 64) while RoPE fitted it in 800; by hand (4 x 64, seed 0, warm-up 300) NoPE
# reached 0.68 on S at 1e-3 and fitted it at 5e-4 (step 4500), where RoPE still fitted S in 700 steps. One lr
# for every encoding: the one at which the slowest learner fits.
SCALES["probe"] = {**SCALES["default"], "steps": 6000, "every": 100, "samples": 0, "sizes": ((2, 64), (4, 32), (4, 64)),
                   "transfer_encodings": DISTANCE_ENCODINGS}
# What the default leaves out for its hour, from the run at commit df12742 (every part, 81.2 min, 191,600 steps):
# the size sweep's shallower model, 2 x 64 (29,600 steps; the width ladder stays, as in --full), and NoPE in
# (C), whose mixed_copy models fitted on none of 6 seeds within 6000 steps (36,000 steps, no verdict).
NOPE_MIXED_UNFIT = "in the run at commit df12742 NoPE's mixed_copy models fitted on 0 of 6 seeds within 6000 steps"


# A region's transfer counts as positive or negative only beyond this accuracy difference: one seed's accuracy
# at one delay, over 128 sequences, has a standard error up to ~0.04, and a region averages several delays.
TRANSFER_MARGIN = 0.05


def span(band: tuple[int, int]) -> str:
    return f"[{band[0]}, {band[1]}]"


def size_name(size) -> str:
    """(layers, width) as the results name it: '4x64'."""
    return f"{size[0]}x{size[1]}"


def probe_row(encoding: str, size) -> str:
    """A probe's row, one model of each task: 'nope, 4x64'."""
    return f"{encoding}, {size_name(size)}"


# ---------------------------------------------------------------------------------------------------------
# Training and measuring one curve
# ---------------------------------------------------------------------------------------------------------


def model_argv(setup: dict, scale: str, args, task: str, encoding: str, seed: int, delays: tuple[int, int],
               selective: tuple[int, int] | None = None, size: tuple[int, int] | None = None) -> list[str]:
    """One model's train.py command line, its folder runs/distance/SCALE/NAME named by its settings."""
    layers, width = size or (setup["layers"], setup["width"])
    name = f"{task}-{encoding}-{layers}x{width}-d{delays[0]}-{delays[1]}" + \
        (f"-s{selective[0]}-{selective[1]}" if selective else "") + f"-seed{seed}"
    argv = ["--task", task, "--train-len", str(setup["window"]), "--symbols", str(setup["symbols"]),
            "--m", str(setup["m"]),
            "--delays", f"{delays[0]}:{delays[1]}", "--encoding", encoding, "--layers", str(layers),
            "--heads", str(setup["heads"]), "--dim", str(width), "--steps", str(setup["steps"]),
            "--batch", str(setup["batch"]),
            "--lr", str(setup["lr"]), "--warmup", str(setup["warmup"]), "--wd", str(setup["wd"]), "--seed", str(seed),
            "--eval-samples", str(setup["samples"]), "--device", args.device,
            "--out", os.path.join("runs", "distance", scale, name), "--force", "--quiet",
            # one thread: on a small shared CPU a tiny model trains fastest single-threaded (README)
            "--threads", str(args.threads or 1)]
    if encoding == "alibi":
        argv += ["--alibi-slope-heads", str(ALIBI_SLOPE_HEADS)]
    if selective:
        argv += ["--selective-delays", f"{selective[0]}:{selective[1]}"]
    return argv + ["--fit-bar", str(FIT_BAR), "--fit-every", str(setup["every"])]


def distance_curve(setup: dict, scale: str, args, task: str, encoding: str, seed: int, delays: tuple[int, int],
                   selective: tuple[int, int] | None = None, size: tuple[int, int] | None = None) -> dict:
    """Train one model (runs/distance/SCALE/NAME) until it fits or the cap, and return its accuracy at every
    delay 0..top ("rows"): on S for a selective_copy model, otherwise on C alone (so a mixed_copy model is
    measured on the task it shares with its single-task twin); and the step it fitted at (None: not within
    the cap), from train.py's fit record."""
    argv = model_argv(setup, scale, args, task, encoding, seed, delays, selective, size)
    out, name = argv[argv.index("--out") + 1], os.path.basename(argv[argv.index("--out") + 1])
    start = time.perf_counter()
    train_once(argv)
    model, cfg = load_run(out, args.device)
    measured = "selective_copy" if task == "selective_copy" else "delay_copy"
    cfg = dataclasses.replace(cfg, task=measured,
                              task_options={"symbols": setup["symbols"], "m": setup["m"], "delays": delays})
    rows, _ = evaluate_table(model, cfg, delays=range(setup["top"] + 1), samples=setup["samples"], device=args.device)
    print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return {"rows": rows, "steps_to_fit": read_fit(out)["steps_to_fit"]}


def curve_worker(job) -> dict:
    """distance_curve in this process or a --jobs worker (a module-level function, so that a spawned process
    can run it)."""
    return distance_curve(*job)


def planned_models(setup: dict):
    """The settings (task, encoding, seed, delays, selective delays, size) of every model run() uses, in the
    order it uses them: (A), the size sweep, (B), (C)."""
    size, band = (setup["layers"], setup["width"]), setup["band"]
    for task in ("delay_copy", "selective_copy"):
        for e in DISTANCE_ENCODINGS:
            yield from ((task, e, seed, band, None, size) for seed in range(setup["seeds"]))
    for layers_width in setup["sizes"]:
        yield from (("delay_copy", e, seed, band, None, tuple(layers_width)) for e in DISTANCE_ENCODINGS
                    for seed in range(setup["size_seeds"]))
    for e in setup["diversity_encodings"]:
        for d_max in setup["diversity"]:
            yield from (("delay_copy", e, seed, (0, d_max), None, size) for seed in range(setup["diversity_seeds"]))
    for setting in ("adjacent", "separated"):
        for e in setup["transfer_encodings"]:
            for seed in range(setup["transfer_seeds"]):
                yield from (("delay_copy", e, seed, band, None, size),
                            ("mixed_copy", e, seed, band, setup[setting], size))


def over_seeds(curves: list[dict], inside) -> dict:
    """Accuracy at every delay as the mean and sd over seeds, the best seed's curve, and each seed's step to
    fit. Paper D reports the best of 5 seeds without naming the criterion; here "best" is the seed with the
    highest cumulative accuracy (sum over every evaluated delay). inside(d) tells the training range, for the
    in/out sums."""
    delays = [r["delay"] for r in curves[0]["rows"]]
    acc = torch.tensor([[r["accuracy"] for r in curve["rows"]] for curve in curves])  # (seeds, delays)
    trained = torch.tensor([inside(d) for d in delays])
    in_sum, out_sum = acc[:, trained].sum(1), acc[:, ~trained].sum(1)
    best = int(acc.sum(1).argmax())
    sd = acc.std(0) if len(curves) > 1 else torch.zeros(len(delays))
    return {"delays": delays, "mean": acc.mean(0).tolist(), "sd": sd.tolist(), "best_seed": best,
            "best": acc[best].tolist(), "per_seed": acc.tolist(), "in_mean": acc[:, trained].mean(1).tolist(),
            "in_sum": in_sum.tolist(), "out_sum": out_sum.tolist(),
            "ratio": (out_sum / in_sum.clamp(min=1e-9)).tolist(),
            "steps_to_fit": [curve["steps_to_fit"] for curve in curves]}


REGIONS = ("C range", "unseen", "S range", "below", "between", "beyond")


def transfer_region(name: str, band, s_band):
    """Whether a delay lies in a region of (C): where C trained, every delay C never trained on, where only S
    trained, below C's band, between the two bands (the separated setting), beyond S's band."""
    return {"C range": lambda d: band[0] <= d <= band[1],
            "unseen": lambda d: not band[0] <= d <= band[1],
            "S range": lambda d: s_band[0] <= d <= s_band[1],
            "below": lambda d: d < band[0],
            "between": lambda d: band[1] < d < s_band[0],
            "beyond": lambda d: d > s_band[1]}[name]


def transfer_regions(delta: list[float], delays: list[int], band, s_band) -> dict:
    """Mean accuracy change of C (mixed minus alone) in each region (transfer_region) that holds a delay."""
    out = {}
    for name in REGIONS:
        values = [x for x, d in zip(delta, delays) if transfer_region(name, band, s_band)(d)]
        if values:
            out[name] = spread(values)["mean"]
    return out


def parts(setup: dict, trained: dict) -> dict:
    """Every part's curves over seeds, from the trained models by their settings: (A), the size sweep, (B),
    and (C) with C's change per delay and per region."""
    lo, hi = setup["band"]

    def curves(task, encoding, seeds, delays, selective=None, size=None):
        """One curve per seed."""
        size = tuple(size or (setup["layers"], setup["width"]))
        return [trained[task, encoding, seed, delays, selective, size] for seed in range(seeds)]

    def in_band(d):
        return lo <= d <= hi

    # (A); its C models are also the size sweep's models at (A)'s size
    part_a = {task: {e: over_seeds(curves(task, e, setup["seeds"], setup["band"]), in_band) for e in DISTANCE_ENCODINGS}
              for task in ("delay_copy", "selective_copy")}
    size = {size_name(s): {e: over_seeds(curves("delay_copy", e, setup["size_seeds"], setup["band"], size=s), in_band)
                           for e in DISTANCE_ENCODINGS} for s in setup["sizes"]}
    part_b = {e: {d_max: over_seeds(curves("delay_copy", e, setup["diversity_seeds"], (0, d_max)),
                                    lambda d, d_max=d_max: d <= d_max)
                  for d_max in setup["diversity"]} for e in setup["diversity_encodings"]}
    part_c = {}
    for setting in ("adjacent", "separated"):
        part_c[setting] = {}
        for e in setup["transfer_encodings"]:
            alone = over_seeds(curves("delay_copy", e, setup["transfer_seeds"], setup["band"]), in_band)
            mixed = over_seeds(curves("mixed_copy", e, setup["transfer_seeds"], setup["band"], setup[setting]), in_band)
            delta = [m - a for m, a in zip(mixed["mean"], alone["mean"])]
            part_c[setting][e] = {"alone": alone, "mixed": mixed, "delta": delta,
                                  "regions": transfer_regions(delta, alone["delays"], setup["band"], setup[setting])}
    return {"size": size, "A": part_a, "B": part_b, "C": part_c}


# ---------------------------------------------------------------------------------------------------------
# Paper D's findings as comparisons over seeds, decided by the shared rule (common.decide), one table
# ---------------------------------------------------------------------------------------------------------

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
# Every finding is made of comparisons, each a gain that should be positive, measured per seed (the independent
# units: seed s of one model against seed s of the other, which saw the same data) in accuracy points: mean
# accuracy over the delays of a region. A comparison counts the seeds on which both of its models fitted their
# training band (train.py's fit check); it is UNFIT when either model fitted on fewer than two thirds of its
# seeds. The size comparisons are the exception: they measure fitting itself, on every seed. All comparisons
# of the experiment are one family (Holm); a finding needs each of its own.


def region_mean(result: dict, inside) -> list[float]:
    """Per seed, the mean accuracy over the delays d with inside(d) (over_seeds' result)."""
    kept = [i for i, d in enumerate(result["delays"]) if inside(d)]
    return [sum(seed[i] for i in kept) / len(kept) for seed in result["per_seed"]]


def fitted_seeds(*results: dict) -> tuple[list[int], bool]:
    """The seeds on which every model fitted its band (train.py's fit check), and whether each fitted on two
    thirds of its seeds."""
    fits = [[s is not None for s in r["steps_to_fit"]] for r in results]
    common = [s for s in range(len(fits[0])) if all(f[s] for f in fits)]
    return common, all(3 * sum(f) >= 2 * len(f) for f in fits)


def comparison(what: str, better: list[float], worse: list[float], seeds: list[int], fitted: bool = True) -> dict:
    """One comparison: per seed in `seeds`, better - worse; where the models did not fit, every seed's, shown
    as measured (decide gives it no verdict)."""
    seeds = seeds if fitted else range(len(better))
    return {"what": what, "per_unit": [better[s] - worse[s] for s in seeds], "fitted": fitted}


def ordering(runs: dict, band) -> list[dict]:
    """(A) on one task: NoPE above ALiBi and ALiBi above RoPE, in mean accuracy at the delays never trained."""
    unseen = {e: region_mean(runs[e], lambda d: not band[0] <= d <= band[1]) for e in DISTANCE_ENCODINGS}
    out = []
    for better, worse in (("nope", "alibi"), ("alibi", "rope")):
        seeds, fitted = fitted_seeds(runs[better], runs[worse])
        out.append(comparison(f"{better} - {worse} at unseen delays", unseen[better], unseen[worse], seeds, fitted))
    return out


def size_comparisons(setup: dict, size: dict) -> list[dict]:
    """At every size of the sweep other than (A)'s: NoPE below RoPE and ALiBi in range (their lower), and below
    NoPE at (A)'s size. A size may be smaller in depth or in width: each is its own comparison. These measure
    fitting itself, so no fit gate."""
    main, out = size_name((setup["layers"], setup["width"])), []
    for small in (size_name(s) for s in setup["sizes"]):
        if small == main:
            continue
        nope = size[small]["nope"]["in_mean"]
        explicit = [min(r, a) for r, a in zip(size[small]["rope"]["in_mean"], size[small]["alibi"]["in_mean"])]
        seeds = list(range(len(nope)))
        out += [comparison(f"min(rope, alibi) - nope in range at {small}", explicit, nope, seeds),
                comparison(f"nope in range: {main} - {small}", size[main]["nope"]["in_mean"], nope, seeds)]
    return out


def diversity_comparisons(part_b: dict) -> list[dict]:
    """(B), per encoding, from the smallest d_max to the largest: accuracy beyond [0, d_max] rises, and its
    ratio to the in-range sum (out / in, both sums over delays) falls."""
    out = []
    for e, by_max in part_b.items():
        first, last = by_max[min(by_max)], by_max[max(by_max)]
        seeds, fitted = fitted_seeds(first, last)  # the two models the comparisons read
        beyond_max = [region_mean(r, lambda d, m=m: d > m) for m, r in ((min(by_max), first), (max(by_max), last))]
        out += [comparison(f"{e}: unseen accuracy, d_max {max(by_max)} - {min(by_max)}", beyond_max[1],
                           beyond_max[0], seeds, fitted),
                comparison(f"{e}: out / in, d_max {min(by_max)} - {max(by_max)}", first["ratio"], last["ratio"],
                           seeds, fitted)]
    return out


# (C)'s sub-claims: (setting, region, encodings, sign): C's change (mixed minus alone) in that region should
# have that sign for each encoding; RoPE's "no damage" is a comparison: its change in C's own band above NoPE's
# and ALiBi's.
WHERE = {"unseen": "at unseen delays", "S range": "in S's band", "beyond": "beyond S's band",
         "C range": "in C's own band"}
TRANSFER_CLAIMS = [("adjacent", "unseen", ("rope",), -1), ("adjacent", "S range", ("nope", "alibi"), +1),
                   ("adjacent", "beyond", ("nope", "alibi"), -1), ("separated", "C range", ("nope", "alibi"), -1)]


def transfer_comparisons(setup: dict, part_c: dict) -> list[dict]:
    out = []

    def change(setting, e, region):
        r, s_band, band = part_c[setting][e], setup[setting], setup["band"]
        inside = transfer_region(region, band, s_band)
        return [m - a for m, a in zip(region_mean(r["mixed"], inside), region_mean(r["alone"], inside))]

    def gate(setting, e):
        return fitted_seeds(part_c[setting][e]["alone"], part_c[setting][e]["mixed"])

    for setting, region, encodings, sign in TRANSFER_CLAIMS:
        for e in encodings:
            if e not in part_c[setting]:
                continue
            seeds, fitted = gate(setting, e)
            word = ("gains " if sign > 0 else "loses ") + WHERE[region]
            values = [sign * v for v in change(setting, e, region)]
            out.append(comparison(f"{setting}: {e} {word}", values, [0.0] * len(values), seeds, fitted))
    if all(e in part_c["separated"] for e in DISTANCE_ENCODINGS):
        rope = change("separated", "rope", "C range")
        others = [(n + a) / 2 for n, a in zip(change("separated", "nope", "C range"),
                                              change("separated", "alibi", "C range"))]
        gates = [gate("separated", e) for e in DISTANCE_ENCODINGS]
        seeds = sorted(set.intersection(*(set(g[0]) for g in gates)))
        out.append(comparison("separated: rope's change in C's own band - nope's and alibi's", rope, others, seeds,
                              all(g[1] for g in gates)))
    return out


def claims(setup: dict, measured: dict) -> tuple[dict, str]:
    """Each finding's comparisons, all decided as one family (common.decide), and the finding's verdict: every
    comparison reproduced, or (common.all_of) failed where one fails, undecided where one is open; and the
    caption that says how the family was adjusted."""
    checks = {"size": size_comparisons(setup, measured["size"]),
              "A, delay copy": ordering(measured["A"]["delay_copy"], setup["band"]),
              "A, selective copy": ordering(measured["A"]["selective_copy"], setup["band"]),
              "B": diversity_comparisons(measured["B"]),
              "C": transfer_comparisons(setup, measured["C"])}
    family = {f"{name}: {c['what']}": c for name, cs in checks.items() for c in cs}  # one name each
    assert len(family) == sum(map(len, checks.values()))
    decided = decide({k: c["per_unit"] for k, c in family.items()}, THRESHOLD,
                     {k: c["fitted"] for k, c in family.items()})
    out = {name: {"checks": [{**c, **decided[f"{name}: {c['what']}"]} for c in cs]} for name, cs in checks.items()}
    for result in out.values():
        result["verdict"] = all_of([c["verdict"] for c in result["checks"]])
    return out, caption(decided)


# ---------------------------------------------------------------------------------------------------------
# The markdown: the setup beside Paper D's, the verdicts, then one section per question
# ---------------------------------------------------------------------------------------------------------


def verdict_block(result: dict) -> list[str]:
    """A finding's comparisons as a table (mean [adjusted interval] over the seeds that fitted), and its verdict."""
    table = ["| comparison (a gain that should be positive) | seeds | mean [interval] | verdict |",
             "|---|---:|---|---|"]
    for c in result["checks"]:
        interval = f" [{c['low']:+.3f}, {c['high']:+.3f}]" if "low" in c else ""
        mean = f"{c['mean']:+.3f}{interval}" if "mean" in c else "—"
        table.append(f"| {c['what']} | {len(c['per_unit'])} | {mean} | {short(c['verdict'])} |")
    return ["", *table, f"\n**Verdict: {result['verdict']}.**\n"]


def setup_section(data: dict, jobs: int, threads: int) -> list[str]:
    """What was run and on what; the task as measured; Paper D's setup beside this run's."""
    setup = data["settings"]
    machine = data.get("machine", "a machine distance.json does not record")
    width, layers, heads = setup["width"], setup["layers"], setup["heads"]
    md = ["# Distance generalization (Paper D, arXiv 2609.11913)\n",
          f"`{data['command']}` took {data['runtime_s'] / 60:.1f} minutes on {machine}, {jobs} model(s) at a time, "
          f"{threads} torch thread(s) each. Every number below "
          "comes from that run; per-delay curves of every seed are in `distance.json`.\n",
          "Paper D asks whether a positional encoding helps a transformer copy tokens across delays it never saw "
          "in training, at a fixed context length. A delay copy episode (task C) is m source tokens, a control "
          "token, d filler tokens, the control token again, then the m source tokens; selective copy (task S) "
          "reproduces only the even-valued source tokens. **d is the number of filler tokens strictly between the "
          "two control tokens** (C-to-C distance minus 1), so in task C every source token is reproduced "
          f"m + d + 2 positions later; Paper D does not say which it counts. Accuracy: teacher-forced, per "
          f"reproduced token, {setup['samples']} windows per delay (chance is about 1/{setup['symbols']}).\n",
          "## Setup: Paper D and this run\n",
          "| | Paper D | here |", "|---|---|---|",
          f"| window T | 256 | {setup['window']} |",
          f"| data tokens | 128 | {setup['symbols']} |",
          f"| m (tokens copied) | 10 | {setup['m']} |",
          f"| C and S training band (A) | [15, 25] | {span(setup['band'])} |",
          f"| delays evaluated | 1..120 | 0..{setup['top']}"
          + (" (4 x the band's top)" if setup["top"] == 4 * setup["band"][1] else "") + " |",
          f"| diversity d_max (B) | 5, 10, 20, 30, 50 | {', '.join(map(str, setup['diversity']))} |",
          f"| S bands in transfer (C) | [25, 35], [45, 55] | {span(setup['adjacent'])}, {span(setup['separated'])} |",
          f"| model | 8 layers x 512, 8 heads | {layers} layers x {width}, {heads} heads |",
          f"| sizes in the size sweep (layers x width) | smaller than 8 x 512 (sizes not in our sources) | "
          f"{', '.join(size_name(s) for s in setup['sizes'])} |",
          "| MLP, dropout | ReLU, 0.1 | GELU, none (lengen's GPT; train.py has no dropout flag) |",
          f"| steps x batch | 40K x 64 | until it fits (>= {FIT_BAR} on held-out windows at its training delays, "
          f"checked every {setup['every']} steps) or {setup['steps']}, x {setup['batch']} |",
          "| lr, warm-up, weight decay | 3e-4, 3K, 0.05 (AdamW) | "
          f"{setup['lr']:g}, {setup['warmup']}, {setup['wd']:g} (AdamW, "
          "cosine decay to a tenth over the cap) |",
          "| loss mask | R tokens, control tokens, first 18 positions | everything but reproduced tokens whose "
          "source lies inside the window (exact, instead of the first 18) |",
          f"| seeds | best of 5 | (A) {setup['seeds']}, size {setup['size_seeds']}, (B) {setup['diversity_seeds']}, "
          f"(C) {setup['transfer_seeds']}; "
          "mean ± sd and the best seed (highest cumulative accuracy) |",
          *([f"| ALiBi's slopes | the paper's rule for 8 heads | the {data['alibi_slope_heads']}-head slopes, "
             f"evenly spaced over {heads} heads (the rule for {heads} heads is nearly flat over this window) |"]
            if "alibi_slope_heads" in data else []),
          f"| encodings | NoPE, RoPE, ALiBi | all three in size and (A); (B) "
          f"{', '.join(setup['diversity_encodings'])}; (C) {', '.join(setup['transfer_encodings'])} |"]
    if data["scale"] != "full":
        md.append("\nWhere a part has fewer than 3 seeds or fewer than the three encodings, that is a cut made to "
                  "fit the time budget (or, for an encoding, what its probe said: see how this design was chosen), "
                  "not a finding; `--full` runs every part with 5 seeds and all three encodings, at Paper D's sizes "
                  "(a GPU helps).")
    return md


def design_section(data: dict) -> list[str]:
    """How the default was planned: its probe's table (results/distance-probe.json, copied into the results when
    the run began) and what was read from it (plan)."""
    if "probe" not in data:
        return []
    probe, setup = data["probe"], data["settings"]
    rows = [probe_row(e, s) for e in DISTANCE_ENCODINGS for s in probe["settings"]["sizes"]]
    return ["\n## How this design was chosen\n", "Before the run, from `results/distance-probe.md`: seed 0 of "
            f"(A)'s models at every size, trained until it fits its band or {probe['settings']['steps']} steps; "
            "nothing outside the band measured. " + probe_cost(probe) + "\n",
            *probe_table(probe["fits"], rows, "model"),
            "", plan(probe, setup) + " " + full_cost(probe, setup)]


def step_flops(setup: dict) -> int:
    """A training step's matrix FLOPs up to a constant: batch x window tokens, each through `layers` layers of
    12 width^2 (projections and MLP) + 2 window x width (attention scores and their use)."""
    width, window = setup["width"], setup["window"]
    return setup["batch"] * window * setup["layers"] * (12 * width ** 2 + 2 * window * width)


def full_cost(probe: dict, setup: dict) -> str:
    """What --full would cost on this machine: its models and caps, at the probe's measured CPU time per step
    scaled by FLOPs. An estimate on the high side: a tiny model's step carries overheads (Python, small kernels)
    that a large one's matrices amortise."""
    full = SCALES["full"]
    models = len(list(planned_models(full)))
    per_step = cpu_per_step(probe) * step_flops(full) / step_flops(setup)
    return (f"`--full` ({models} models at {full['layers']} x {full['width']}, window {full['window']}, up to "
            f"{full['steps']:,} steps each) is a GPU's job: by FLOPs a step there is "
            f"{step_flops(full) / step_flops(setup):,.0f}x one here, about {per_step * full['steps'] / 3600:,.0f} "
            "CPU-hours a model at the probe's measured cost per step (on the high side: a tiny model's step carries "
            "overheads a large one amortises).")


def plan(probe: dict, setup: dict) -> str:
    """What the default took from its probe: one cap for every model, which of the probe's sizes the size sweep
    leaves out, and which encodings (B) and (C) leave out, and why (the probe's numbers at (A)'s size)."""
    fits, main, cap = probe["fits"], size_name((setup["layers"], setup["width"])), setup["steps"]
    cell = {t: {e: fits[t][probe_row(e, (setup["layers"], setup["width"]))] for e in DISTANCE_ENCODINGS}
            for t in fits}
    why = "; ".join(f"{t}: " + ", ".join(f"{e} {probe_cell(c)}" for e, c in by.items()) for t, by in cell.items())
    text = (f"At (A)'s size, {main}, the probe's steps to fit (or the last check) were {why}. Every model trains "
            f"to the same cap, {cap} steps, and stops as soon as it fits: (A) and the size sweep train every "
            "encoding, including the cells that did not fit in the probe (the size question is about exactly that).")

    def slower(e, kept):  # (B) is delay copy alone
        steps = cell["delay_copy"][e]["steps_to_fit"]
        others = max(cell["delay_copy"][k]["steps_to_fit"] or cap for k in kept)
        return (f"{e} fitted delay copy in {steps} steps, against at most {others} for the others (cut for time)"
                if steps else f"{e} did not fit delay copy within {cap} steps on the probe's seed")

    def unfit_s(e, kept):  # (C)'s mixed model learns selective copy too
        steps = cell["selective_copy"][e]["steps_to_fit"]
        if steps is None:
            return f"{e} did not fit selective copy within {cap} steps on the probe's seed, and (C)'s mixed model " \
                   "learns it too"
        return f"{e} needed {steps} of {cap} steps to fit selective copy alone, and " + \
            (NOPE_MIXED_UNFIT if e == "nope" else "(C)'s mixed model learns it beside delay copy (cut for time)")

    left_out = [size_name(s) for s in probe["settings"]["sizes"] if tuple(s) not in map(tuple, setup["sizes"])]
    if left_out:
        text += (f" The size sweep leaves out {', '.join(left_out)} of the probe's sizes (cut for time; the width "
                 "ladder stays, as in `--full`).")
    for part, key, reason in (("(B)", "diversity_encodings", slower), ("(C)", "transfer_encodings", unfit_s)):
        kept = setup[key]
        left = [e for e in DISTANCE_ENCODINGS if e not in kept]
        if left:
            text += f" {part} trains {', '.join(kept)} only: " + "; ".join(reason(e, kept) for e in left) + "."
    return text + " `--full` trains every encoding in every part."


def verdicts_section(data: dict) -> list[str]:
    md = ["\n## Verdicts\n", "| question | Paper D | verdict |", "|---|---|---|"]
    md += [f"| {name} | {PAPER_D_FINDINGS[name]} | **{r['verdict']}** |" for name, r in data["verdicts"].items()]
    md.append(f"\nEach question is made of comparisons below, each a gain in accuracy measured per seed, seed s of "
              "one model against seed s of the other, on the seeds where both fitted their training band (train.py's "
              f"fit check, accuracy >= {FIT_BAR}); *{UNFIT}* when one fitted on fewer than two thirds of its seeds. "
              "The size comparisons measure fitting itself, so they count every seed. The shared "
              f"rule decides each: reproduced when the mean is >= {THRESHOLD} and the interval lies above 0, "
              f"reversed in the mirror image, smaller than claimed when the interval lies below {THRESHOLD}, "
              "undecided otherwise or with fewer than 3 seeds. " + data["caption"] + " A question is reproduced "
              "when each of its comparisons is, fails (partly) when one fails, and is undecided otherwise.\n")
    return md


def fitted_at(result: dict) -> str:
    """Each seed's step to fit its band, '—' where it did not within the cap: '2600, —, 3100'."""
    return ", ".join("—" if s is None else str(s) for s in result["steps_to_fit"])


def size_section(data: dict) -> list[str]:
    setup = data["settings"]
    md = ["## Size\n", f"Paper D: {PAPER_D_FINDINGS['size']}. Here: C trained on {span(setup['band'])}, "
          f"{setup['size_seeds']} seed(s) at each size (layers x width). In range: mean accuracy over the training "
          "band (mean ± sd over seeds); fitted: the seeds whose model reached the bar, and at which step (— not "
          f"within the cap of {setup['steps']}).\n",
          "| size | " + " | ".join(f"{e} in range | {e} fitted at" for e in DISTANCE_ENCODINGS) + " |",
          "|---:|" + "---:|" * 2 * len(DISTANCE_ENCODINGS)]
    for name, runs in data["size"].items():
        cells = [f"{fmt(runs[e]['in_mean'], form='sd')} | {fitted_at(runs[e])}" for e in DISTANCE_ENCODINGS]
        md.append(f"| {name} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"]["size"])


def ordering_section(data: dict, task: str, label: str) -> list[str]:
    """(A) on one task: every encoding in range, out of range, its best seed, and at a few delays."""
    setup, runs = data["settings"], data["A"][task]
    lo, hi = setup["band"]
    shown = sorted({0, lo - 1, lo, hi, hi + 1, 2 * hi, 3 * hi, 4 * hi} & set(range(setup["top"] + 1)))
    md = [f"## ({label})\n", f"Paper D: {PAPER_D_FINDINGS[label]}. Here: trained on {span(setup['band'])}, "
          f"{setup['seeds']} seed(s) per encoding; mean ± sd over seeds, and the best seed.\n",
          "| encoding | fitted at | in range | out-of-range sum | best seed: in range, out-of-range sum | " +
          " | ".join(f"d={d}" for d in shown) + " |", "|---|---|---:|---:|---:|" + "---:|" * len(shown)]
    for e in DISTANCE_ENCODINGS:
        r, b = runs[e], runs[e]["best_seed"]
        cells = [fmt([seed[r["delays"].index(d)] for seed in r["per_seed"]], form="sd") for d in shown]
        md.append(f"| {e} | {fitted_at(r)} | {fmt(r['in_mean'], form='sd')} | {fmt(r['out_sum'], '.1f', 'sd')} | "
                  f"{r['in_mean'][b]:.2f}, {r['out_sum'][b]:.1f} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"][label])


def diversity_section(data: dict) -> list[str]:
    setup = data["settings"]
    md = ["## (B) Diversity\n", f"Paper D: {PAPER_D_FINDINGS['B']}. Here: C trained on [0, d_max], evaluated at "
          f"0..{setup['top']}; sums of accuracy over the delays inside and outside [0, d_max], "
          f"{setup['diversity_seeds']} seed(s).\n",
          "| encoding | d_max | in-range sum | out-of-range sum | out / in | out-of-range mean |",
          "|---|---:|---:|---:|---:|---:|"]
    for e, by_max in data["B"].items():
        for d_max, r in by_max.items():
            unseen = setup["top"] - d_max
            md.append(f"| {e} | {d_max} | {fmt(r['in_sum'], '.1f', 'sd')} | {fmt(r['out_sum'], '.1f', 'sd')} | "
                      f"{fmt(r['ratio'], form='sd')} | {spread(r['out_sum'])['mean'] / unseen:.2f} |")
    return md + verdict_block(data["verdicts"]["B"])


def sign(x: float) -> str:
    return "positive" if x > TRANSFER_MARGIN else "negative" if x < -TRANSFER_MARGIN else "none"


def transfer_section(data: dict) -> list[str]:
    setup = data["settings"]
    md = ["## (C) Transfer\n", f"Paper D: {PAPER_D_FINDINGS['C']}. Here: mixed_copy trains C on "
          f"{span(setup['band'])} together with S on {span(setup['adjacent'])} (adjacent) or "
          f"{span(setup['separated'])} "
          "(separated), half the episodes each; C alone is the (A) model with the same seed. Each trains until it "
          "fits its own mix (the mixed model: C and S together) or the cap; both are measured on C. Cells: C's "
          "mean accuracy change "
          f"(mixed minus alone) in each region, {setup['transfer_seeds']} seed(s).\n",
          "| setting | encoding | C alone in range | C range | unseen (all) | below | between | S range | beyond |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for setting, by_encoding in data["C"].items():
        for e, r in by_encoding.items():
            cells = [f"{r['regions'][n]:+.2f} ({sign(r['regions'][n])})" if n in r["regions"] else "—"
                     for n in ("C range", "unseen", "below", "between", "S range", "beyond")]
            md.append(f"| {setting} | {e} | {spread(r['alone']['in_mean'])['mean']:.2f} | " + " | ".join(cells) + " |")
    return md + verdict_block(data["verdicts"]["C"])


def recorded_flag(command: str, flag: str) -> str | None:
    """The value the recorded command line gave --FLAG (None: not given)."""
    return m.group(1) if (m := re.search(rf"--{flag} (\S+)", command)) else None


def commands_section(data: dict, threads: int) -> list[str]:
    """Every model's train.py command line, as run() trained it (model_argv over planned_models): any cell can
    be retrained from it, or trained again with another --seed."""
    setup = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
             for k, v in data["settings"].items()}  # JSON's lists back to the tuples planned_models keys on
    args = argparse.Namespace(device=recorded_flag(data["command"], "device") or "cpu", threads=threads)
    commands = ["python train.py " + " ".join(model_argv(setup, data["scale"], args, *key))
                for key in dict.fromkeys(planned_models(setup))]
    return ["", f"## Every model's train.py command ({len(commands)})", "",
            "<details><summary>One line a model, in the order run() trains them; each writes the folder its --out "
            "names</summary>", "", "```", *commands, "```", "", "</details>"]


def markdown(data: dict, jobs: int, threads: int) -> str:
    """results/distance.md: setup and every change from Paper D, then per question the paper's finding, our
    numbers and the verdict its sub-claims give; last, every model's train.py command."""
    md = setup_section(data, jobs, threads) + design_section(data) + verdicts_section(data) + size_section(data)
    md += ordering_section(data, "delay_copy", "A, delay copy") + ordering_section(data, "selective_copy",
                                                                                   "A, selective copy")
    md += diversity_section(data) + transfer_section(data) + commands_section(data, threads)
    return "\n".join(md) + "\n"


# ---------------------------------------------------------------------------------------------------------
# The figure: each encoding in one colour in every panel
# ---------------------------------------------------------------------------------------------------------


def encoding_lines(ax, series: dict[str, tuple[list, list]], ms: float = 6) -> None:
    """One line per encoding, series[encoding] = (xs, ys), in the encoding's own colour."""
    for e, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", ms=ms, label=e, **STYLES[e])


def size_panel(ax, setup: dict, size: dict) -> None:
    names = list(size)  # in the order the sweep lists them
    encoding_lines(ax, {e: (list(range(len(names))), [spread(size[n][e]["in_mean"])["mean"] for n in names])
                        for e in DISTANCE_ENCODINGS})
    ax.set(xticks=range(len(names)), xticklabels=names, ylim=(-0.02, 1.02), xlabel="size (layers x width)",
           ylabel="in-range accuracy",
           title=f"size: C on {span(setup['band'])}, mean of {setup['size_seeds']} seed(s)")
    ax.legend(fontsize=8)


def diversity_panel(ax, part_b: dict, field: str, title: str) -> None:
    """(B): a sum over delays (mean over seeds) against d_max."""
    encoding_lines(ax, {e: (list(by_max), [spread(r[field])["mean"] for r in by_max.values()])
                        for e, by_max in part_b.items()})
    ax.set(xlabel="d_max (trained on [0, d_max])", title=title)
    ax.legend(fontsize=8)


def transfer_panel(ax, setup: dict, by_encoding: dict, setting: str, band: tuple[float, float]) -> None:
    """(C): C's accuracy change (mixed minus alone) at every delay, with where C and S trained."""
    encoding_lines(ax, {e: (r["alone"]["delays"], r["delta"]) for e, r in by_encoding.items()}, ms=3)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="C trained")
    ax.axvspan(setup[setting][0] - 0.5, setup[setting][1] + 0.5, color="tab:purple", alpha=0.15, lw=0,
               label="S trained")
    ax.set(ylim=(-1.02, 1.02), xlabel="delay", ylabel="C accuracy: mixed - alone",
           title=f"(C) transfer, S {setting} {span(setup[setting])}")
    ax.legend(fontsize=8)


def figure(data: dict):
    """Size, (A) for C and S, (B) out-of-range sum and ratio against d_max, (C) C's change per delay, and (A)'s
    best seed on C, as Paper D plots it."""
    setup, part_a = data["settings"], data["A"]
    band = (setup["band"][0] - 0.5, setup["band"][1] + 0.5)  # shade whole delays, so a one-delay band shows too

    def draw(plt):
        fig, axes = plt.subplots(2, 4, figsize=(18, 8))
        size_panel(axes[0, 0], setup, data["size"])
        for ax, task, label in ((axes[0, 1], "delay_copy", "(A) delay copy"),
                                (axes[0, 2], "selective_copy", "(A) selective copy")):
            curves = {e: seed_curve("delay", r["delays"], r["per_seed"], band="sd") for e, r in part_a[task].items()}
            plot_curves(ax, curves, "delay", band, log_x=False, styles=STYLES)
            ax.set_title(f"{label}, mean ± sd of {setup['seeds']} seed(s)")
        diversity_panel(axes[0, 3], data["B"], "out_sum", "(B) out-of-range sum")
        diversity_panel(axes[1, 0], data["B"], "ratio", "(B) out-of-range / in-range")
        transfer_panel(axes[1, 1], setup, data["C"]["adjacent"], "adjacent", band)
        transfer_panel(axes[1, 2], setup, data["C"]["separated"], "separated", band)
        ax = axes[1, 3]
        encoding_lines(ax, {e: (r["delays"], r["best"]) for e, r in part_a["delay_copy"].items()}, ms=3)
        ax.axvspan(*band, color="grey", alpha=0.2, lw=0, label="trained")
        ax.set(ylim=(-0.02, 1.02), xlabel="delay", ylabel="accuracy", title="(A) delay copy, best seed")
        ax.legend(fontsize=8)
        fig.suptitle(f"Distance generalization (Paper D) at small scale: window {setup['window']}, m {setup['m']}, "
                     f"{setup['symbols']} symbols; (A)-(C) at {setup['layers']} layers x {setup['width']}; every "
                     f"model trained until it fits or {setup['steps']} steps")
        fig.tight_layout()
        return fig

    return draw


def summary(data: dict) -> str:
    """README.md's table: each of Paper D's questions, how many of its comparisons are reproduced, its verdict."""
    rows = ["| question (Paper D) | comparisons reproduced | verdict |", "|---|---|---|"]
    for name, r in data["verdicts"].items():
        held = sum(c["verdict"] == "reproduced" for c in r["checks"])
        rows.append(f"| {name} | {held} of {len(r['checks'])} | {short(r['verdict'])} |")
    return "\n".join(rows) + "\n"


def render(data: dict):
    """The results decided again from their numbers under the current rule (eval.py --render). The jobs and
    threads the markdown states are read from the recorded command."""
    measured = {part: data[part] for part in ("size", "A", "B", "C")}
    data = dict(data)
    data["verdicts"], data["caption"] = claims(data["settings"], measured)
    jobs, threads = (int(recorded_flag(data["command"], flag) or 1) for flag in ("jobs", "threads"))
    return data, markdown(data, jobs, threads), figure(data)


# ---------------------------------------------------------------------------------------------------------
# The probe: what fitting its band takes, per task, encoding and size, before the default is planned
# ---------------------------------------------------------------------------------------------------------

def run_probe(args, setup: dict) -> None:
    """--probe: (A)'s models at seed 0 and every size, each trained until it fits or setup["steps"] (common.probe)."""
    models = [(e, s) for e in DISTANCE_ENCODINGS for s in setup["sizes"]]
    cells = [(task, probe_row(e, s), model_argv(setup, "probe", args, task, e, 0, setup["band"], None, s))
             for task in ("delay_copy", "selective_copy") for e, s in models]
    data = probe(cells, args, setup)
    rows = [probe_row(e, s) for e, s in models]
    md = ["# Paper D's probe: steps to fit the training band, one seed a model", "", probe_cost(data), "",
          f"(A)'s models (window {setup['window']}, m {setup['m']}, {setup['symbols']} symbols, delays "
          f"{span(setup['band'])}, {setup['heads']} heads, lr {setup['lr']:g} with cosine decay over "
          f"{setup['steps']} steps; ALiBi with the {ALIBI_SLOPE_HEADS}-head slopes) at every size of the sweep "
          "(layers x width), seed 0, trained until "
          f"accuracy >= {FIT_BAR} on held-out windows at the band's delays (checked every {setup['every']} steps) "
          f"or {setup['steps']} steps; nothing outside the band is measured. Steps to fit, or the last check's "
          "accuracy:", "", *probe_table(data["fits"], rows, "model"), "",
          "Every model's train.py command: `results/distance-probe.json`."]
    write_results(results_name("distance", args), "\n".join(md) + "\n", data, None, args.out_dir)


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


def run(args) -> None:
    if args.render:
        return rerender("distance", render, args)
    scale = scale_name(args)
    setup = SCALES[scale]
    if scale == "probe":
        return run_probe(args, setup)
    start = time.perf_counter()
    since = (start, cpu_seconds())
    # how it was planned
    on_record = probe_on_record("distance", args.out_dir, SCALES["probe"]) if scale == "default" else None
    # Every model first, in --jobs worker processes when asked; a model that two parts share (same settings) is
    # trained once. parts() reads them.
    keys = list(dict.fromkeys(planned_models(setup)))
    print(f"distance ({scale}): {len(keys)} models, {args.jobs} at a time", file=sys.stderr)
    trained = dict(zip(keys, map_jobs(curve_worker, [(setup, scale, args, *key) for key in keys], args.jobs,
                                      args.threads or 1)))
    measured = parts(setup, trained)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} (load average "
               f"{os.getloadavg()[0]:.1f} at the end)")
    data = {"command": command_line(args), "scale": scale, "settings": setup, "runtime_s": time.perf_counter() - start,
            "runtime": runtime(since, args), "machine": machine,  # runtime: CPU time too, workers included
            "transfer_margin": TRANSFER_MARGIN, "alibi_slope_heads": ALIBI_SLOPE_HEADS, **measured}
    if on_record:
        data["probe"] = on_record
    data["verdicts"], data["caption"] = claims(setup, measured)
    write_results("distance", markdown(data, args.jobs, args.threads or 1), data, figure(data), args.out_dir)
