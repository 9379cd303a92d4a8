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
(decided by the shared rule), the probe, run(args), which returns the data and writes nothing.
experiments/distance_report.py writes them: results/distance.md, the figure and the README's table.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time

import torch

from eval import evaluate_table, load_run
from experiments.common import (ALIBI_SLOPE_HEADS, command_line, cpu_seconds, map_jobs, preset_name, probe,
                                probe_on_record, runtime, spread, train_once)
from experiments.stats import FIT_BAR, THRESHOLD, all_of, caption, decide
from runs import read_fit

DISTANCE_ENCODINGS = ("nope", "rope", "alibi")

# The training budget, in steps by task: every model of a task trains all of them, whatever its encoding,
# size or band (train.py --no-fit-stop), and is checked against the fit bar at its last step. Paper D trains
# every encoding 40K steps; a model stopped at the first check that reaches the bar is compared at another
# stage of training than one that reached it early (issue 51). 12000: at 6000 (the probe's budget) NoPE's
# in-range accuracy still rose over the last quarter on both tasks (results/distance-probe.md), the slowest
# of (A)'s encodings; twice that is what the default's own curves must show flat ("(A) over training").
DEFAULT_BUDGET = {"delay_copy": 12000, "selective_copy": 12000, "mixed_copy": 12000}
TASKS = tuple(DEFAULT_BUDGET)


def budget(steps: int) -> dict:
    """The same number of steps for every task."""
    return dict.fromkeys(TASKS, steps)


# Paper D: window 256, data tokens 0..127, m = 10, C and S on [15, 25], transfer with S on [25, 35] or [45, 55],
# evaluation at d = 1..120; 8 layers x 512, 8 heads, 40K steps of batch 64, lr 3e-4, 3K warm-up, wd 0.05,
# best of 5 seeds. Every model here trains its task's `budget` and fits when it is at stats.FIT_BAR on held-out
# windows at the band's delays at the end; the same check every `every` steps, and one out of range at `far` x
# the top of its training band (twice it: at 4 x, delay 20 in the default, C models sat at chance all through
# training), draw its curves over training. "default" shrinks the rest until its models train in about an hour
# on 2 shared CPU cores, as its probe (below) measured them; results/distance.md lists every change. At the
# budget (A)'s NoPE needs, (A) alone takes that hour: the default keeps (A) and leaves (B) and (C) to --full
# (and --quick), rather than train any model less. Bands keep the paper's shape: a middle band, evaluation to
# 4x its top, an adjacent band just above it and a separated one further out.
PRESETS = {
    "quick": dict(window=24, symbols=16, m=2, band=(4, 4), adjacent=(5, 6), separated=(9, 10), top=16, far=2,
                  layers=2, heads=4, width=32, sizes=((1, 32), (2, 32)), budget=budget(200), every=50, batch=32,
                  lr=3e-3,
                  warmup=20, wd=0.05, seeds=1, size_seeds=1, diversity=(2, 8), diversity_encodings=("rope",),
                  diversity_seeds=1, transfer_encodings=("rope",), transfer_seeds=1, samples=64),
    "default": dict(window=32, symbols=16, m=2, band=(3, 5), adjacent=(6, 8), separated=(12, 14), top=20, far=2,
                    layers=4, heads=4, width=64, sizes=((4, 64),), budget=DEFAULT_BUDGET, every=100,
                    batch=32, lr=5e-4, warmup=300, wd=0.05, seeds=3, size_seeds=3, diversity=(),
                    diversity_encodings=(), diversity_seeds=3, transfer_encodings=(), transfer_seeds=3, samples=128),
    "full": dict(window=256, symbols=128, m=10, band=(15, 25), adjacent=(25, 35), separated=(45, 55), top=120, far=2,
                 layers=8, heads=8, width=512, sizes=((8, 128), (8, 256), (8, 512)), budget=budget(40000), every=500,
                 batch=64, lr=3e-4, warmup=3000, wd=0.05, seeds=5, size_seeds=5, diversity=(5, 10, 20, 30, 50),
                 diversity_encodings=DISTANCE_ENCODINGS, diversity_seeds=5, transfer_encodings=DISTANCE_ENCODINGS,
                 transfer_seeds=5, samples=256),
}

# eval.py --experiment distance --probe: (A)'s tasks and encodings, seed 0, at every size of the sweep, each
# trained 6000 steps (Paper D trains 40K steps at window 256, ~156 a token of window: ~5000 at this window),
# its in-range accuracy checked every 100, to learn what fitting takes, and when each encoding's in-range
# accuracy stops rising, before the default's budget is planned; nothing beyond the band is measured. Why 4
# layers, one lr of 5e-4 for every encoding, and what the default leaves out for its hour: docs/distance.md,
# "How this design was chosen".
# (Its (B) and (C) settings are the ones the default had when the probe ran; the probe trains no (B) or (C)
# model, and checks nothing out of range, so it has no "far".)
PRESETS["probe"] = {**{k: v for k, v in PRESETS["default"].items() if k != "far"}, "budget": budget(6000),
                    "every": 100, "samples": 0, "sizes": ((2, 64), (4, 32), (4, 64)), "diversity": (1, 3, 6, 10),
                    "diversity_encodings": ("rope", "alibi"), "transfer_encodings": DISTANCE_ENCODINGS}


# (B) and (C) as the default trained them at 6000 steps (RoPE and ALiBi, d_max 1 and 10), before the budget
# (A)'s NoPE needs left them out of its hour: what they would add to it (distance_report.left_out_why).
LEFT_OUT_PARTS = dict(diversity=(1, 10), diversity_encodings=("rope", "alibi"), transfer_encodings=("rope", "alibi"))

# A region's transfer counts as positive or negative only beyond this accuracy difference: one seed's accuracy
# at one delay, over 128 sequences, has a standard error up to ~0.04, and a region averages several delays.
TRANSFER_MARGIN = 0.05


def size_name(size) -> str:
    """(layers, width) as the results name it: '4x64'."""
    return f"{size[0]}x{size[1]}"


def far_delay(setup: dict, delays: tuple[int, int]) -> int:
    """Where a model trained on `delays` is checked out of range over training: `far` x the band's top; settings
    recorded before "far" existed checked every model at delay `top`."""
    return setup["far"] * delays[1] if "far" in setup else setup["top"]


def probe_row(encoding: str, size) -> str:
    """A probe's row, one model of each task: 'nope, 4x64'."""
    return f"{encoding}, {size_name(size)}"


# ---------------------------------------------------------------------------------------------------------
# Training and measuring one curve
# ---------------------------------------------------------------------------------------------------------


def model_argv(setup: dict, preset: str, args, task: str, encoding: str, seed: int, delays: tuple[int, int],
               selective: tuple[int, int] | None = None, size: tuple[int, int] | None = None) -> list[str]:
    """One model's train.py command line, its folder runs/distance/PRESET/NAME named by its settings: its task's
    whole budget, checked against the bar at every `every` steps and at the end, and (but in the probe) at
    far_delay too. Settings recorded before issue 51 have a cap, "steps", instead of a budget: their models
    stopped at the bar, and this gives the commands that trained them."""
    layers, width = size or (setup["layers"], setup["width"])
    name = f"{task}-{encoding}-{layers}x{width}-d{delays[0]}-{delays[1]}" + \
        (f"-s{selective[0]}-{selective[1]}" if selective else "") + f"-seed{seed}"
    argv = ["--task", task, "--train-len", str(setup["window"]), "--symbols", str(setup["symbols"]),
            "--m", str(setup["m"]),
            "--delays", f"{delays[0]}:{delays[1]}", "--encoding", encoding, "--layers", str(layers),
            "--heads", str(setup["heads"]), "--dim", str(width),
            "--steps", str(setup["budget"][task] if "budget" in setup else setup["steps"]),
            "--batch", str(setup["batch"]),
            "--lr", str(setup["lr"]), "--warmup", str(setup["warmup"]), "--wd", str(setup["wd"]), "--seed", str(seed),
            "--eval-samples", str(setup["samples"]), "--device", args.device,
            "--out", os.path.join("runs", "distance", preset, name), "--force", "--quiet",
            # one thread: on a small shared CPU a tiny model trains fastest single-threaded (README)
            "--threads", str(args.threads or 1)]
    if encoding == "alibi":
        argv += ["--alibi-slope-heads", str(ALIBI_SLOPE_HEADS)]
    if selective:
        argv += ["--selective-delays", f"{selective[0]}:{selective[1]}"]
    argv += ["--fit-bar", str(FIT_BAR), "--fit-every", str(setup["every"])]
    if "budget" not in setup:
        return argv
    return argv + ["--no-fit-stop"] + ([] if preset == "probe" else ["--fit-far", str(far_delay(setup, delays))])


def distance_curve(setup: dict, preset: str, args, task: str, encoding: str, seed: int, delays: tuple[int, int],
                   selective: tuple[int, int] | None = None, size: tuple[int, int] | None = None) -> dict:
    """Train one model (runs/distance/PRESET/NAME) for its task's budget, and return its accuracy at every
    delay 0..top ("rows"): on S for a selective_copy model, otherwise on C alone (so a mixed_copy model is
    measured on the task it shares with its single-task twin); from train.py's fit record, whether it fitted
    (steps_to_fit: the last step, None when not at the bar there), the steps it trained, its in-range accuracy
    there, and its curve over training (curve_of)."""
    argv = model_argv(setup, preset, args, task, encoding, seed, delays, selective, size)
    out, name = argv[argv.index("--out") + 1], os.path.basename(argv[argv.index("--out") + 1])
    start = time.perf_counter()
    cpu_s = train_once(argv)["cpu_s"]
    model, cfg = load_run(out, args.device)
    measured = "selective_copy" if task == "selective_copy" else "delay_copy"
    cfg = dataclasses.replace(cfg, task=measured,
                              task_options={"symbols": setup["symbols"], "m": setup["m"], "delays": delays})
    rows, _ = evaluate_table(model, cfg, delays=range(setup["top"] + 1), samples=setup["samples"], device=args.device)
    print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    fit = read_fit(out)
    return {"rows": rows, "steps_to_fit": fit["steps_to_fit"], "steps": fit["checks"][-1][0],
            "fit_at_end": fit["checks"][-1][1], "curve": curve_of(fit), "cpu_s": cpu_s}


def curve_of(fit: dict) -> dict:
    """A model's accuracy over training, from its fit record: at every check's step, in range (the fit check, on
    held-out windows at its training delays) and out of range (at delay `top`, on C alone, few windows)."""
    return {"steps": [step for step, _ in fit["checks"]], "in_range": [acc for _, acc in fit["checks"]],
            "out_of_range": [acc for _, acc in fit["far"]["checks"]]}


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
    """Accuracy at every delay as the mean and sd over seeds, the best seed's curve; each seed's fit (a step, or
    None), the steps it trained, its in-range accuracy at the end (the fit check's), and its curve over
    training. Paper D reports the best of 5 seeds without naming the criterion; here "best" is the seed with
    the highest cumulative accuracy (sum over every evaluated delay). inside(d) tells the training range, for
    the in/out sums."""
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
            "steps_to_fit": [curve["steps_to_fit"] for curve in curves],
            "steps_trained": [curve["steps"] for curve in curves],
            "fit_at_end": [curve["fit_at_end"] for curve in curves], "curves": [curve["curve"] for curve in curves]}


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
    part_c = {}  # empty, like part_b, in a preset that leaves the part out
    for setting in ("adjacent", "separated") if setup["transfer_encodings"] else ():
        part_c[setting] = {}
        for e in setup["transfer_encodings"]:
            alone = over_seeds(curves("delay_copy", e, setup["transfer_seeds"], setup["band"]), in_band)
            mixed = over_seeds(curves("mixed_copy", e, setup["transfer_seeds"], setup["band"], setup[setting]), in_band)
            delta = [m - a for m, a in zip(mixed["mean"], alone["mean"])]
            part_c[setting][e] = {"alone": alone, "mixed": mixed, "delta": delta,
                                  "regions": transfer_regions(delta, alone["delays"], setup["band"], setup[setting])}
    return {"size": size, "A": part_a, "B": part_b, "C": part_c}


# ---------------------------------------------------------------------------------------------------------
# Paper D's findings as comparisons over seeds, decided by the shared rule (stats.decide), one table
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
# of the experiment are one family (stats.decide: simultaneous intervals); a finding needs each of its own.


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
    if not part_c:  # a preset without (C)
        return out

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
    """Each finding's comparisons, all decided as one family (stats.decide), and the finding's verdict: every
    comparison reproduced, or (stats.all_of) failed where one fails, undecided where one is open; and the
    caption that says how the family was adjusted."""
    # a sweep of one size (the default's: the probe measures the sizes, for time) asks no size question
    checks = {"size": size_comparisons(setup, measured["size"])} if len(setup["sizes"]) > 1 else {}
    checks |= {"A, delay copy": ordering(measured["A"]["delay_copy"], setup["band"]),
               "A, selective copy": ordering(measured["A"]["selective_copy"], setup["band"]),
               "B": diversity_comparisons(measured["B"]),
               "C": transfer_comparisons(setup, measured["C"])}
    checks = {name: cs for name, cs in checks.items() if cs}  # a part the preset leaves out asks nothing
    family = {f"{name}: {c['what']}": c for name, cs in checks.items() for c in cs}  # one name each
    assert len(family) == sum(map(len, checks.values()))
    decided = decide({k: c["per_unit"] for k, c in family.items()}, THRESHOLD,
                     {k: c["fitted"] for k, c in family.items()})
    out = {name: {"checks": [{**c, **decided[f"{name}: {c['what']}"]} for c in cs]} for name, cs in checks.items()}
    for result in out.values():
        result["verdict"] = all_of([c["verdict"] for c in result["checks"]])
    return out, caption(decided)


# ---------------------------------------------------------------------------------------------------------
# The probe and the run
# ---------------------------------------------------------------------------------------------------------


def run_probe(args, setup: dict) -> dict:
    """--probe: (A)'s models at seed 0 and every size, each trained for its task's budget (common.probe); its
    record ("fits", by task and probe_row, with every model's in-range checks) plans the default."""
    cells = [(task, probe_row(e, s), model_argv(setup, "probe", args, task, e, 0, setup["band"], None, s))
             for task in ("delay_copy", "selective_copy") for e in DISTANCE_ENCODINGS for s in setup["sizes"]]
    return probe(cells, args, setup)


def cells(args) -> list[list[list[str]]]:
    """The models run() trains, as train.py argvs: one wave (none starts from another). What --cells and
    --launcher hand a scheduler."""
    preset = preset_name(args)
    setup = PRESETS[preset]
    return [[model_argv(setup, preset, args, *key) for key in dict.fromkeys(planned_models(setup))]]


def run(args) -> dict:
    """Train and measure every model of the preset, decide the claims, and return what results/distance.json
    keeps (the probe's record for --probe)."""
    preset = preset_name(args)
    setup = PRESETS[preset]
    if preset == "probe":
        return run_probe(args, setup)
    start = time.perf_counter()
    since = (start, cpu_seconds())
    # how it was planned
    on_record = probe_on_record("distance", args.out_dir, PRESETS["probe"]) if preset == "default" else None
    # Every model first, in --jobs worker processes when asked; a model that two parts share (same settings) is
    # trained once. parts() reads them.
    keys = list(dict.fromkeys(planned_models(setup)))
    print(f"distance ({preset}): {len(keys)} models, {args.jobs} at a time", file=sys.stderr)
    trained = dict(zip(keys, map_jobs(curve_worker, [(setup, preset, args, *key) for key in keys], args.jobs,
                                      args.threads or 1)))
    measured = parts(setup, trained)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} (load average "
               f"{os.getloadavg()[0]:.1f} at the end)")
    data = {"command": command_line(args), "scale": preset, "settings": setup, "runtime_s": time.perf_counter() - start,
            "runtime": runtime(since, args), "machine": machine,  # runtime: CPU time too, workers included
            # each model's own training time (train_once): runtime is this invocation's, ~0 for a model an
            # earlier, stopped invocation of the same command trained
            "training_cpu_s": round(sum(r["cpu_s"] for r in trained.values()), 1),
            "transfer_margin": TRANSFER_MARGIN, "alibi_slope_heads": ALIBI_SLOPE_HEADS, **measured}
    if on_record:
        data["probe"] = on_record
    data["verdicts"], data["caption"] = claims(setup, measured)
    return data
