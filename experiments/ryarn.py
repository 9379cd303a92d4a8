"""Paper R (Randomized YaRN, arXiv 2606.23687) on the small GPT.

    python eval.py --experiment ryarn          # results/ryarn.{md,json,png}

Paper R fine-tunes a model pretrained at context L on short data, giving every token a YaRN rotary encoding
(factor s) at a position drawn from a range that a curriculum widens from L to sL, and evaluates with
ordinary contiguous positions far beyond L. Here the "pretrained model" is a small RoPE GPT trained on the
task itself at lengths <= L with contiguous positions; every method then fine-tunes it for the same number
of steps on the same lengths, and all are evaluated at L, 2L, 4L and 8L.
"""
from __future__ import annotations

import os
import time

import torch
from tqdm import tqdm

import tasks
import train
from eval import command_line, mean_sd, paired_gain, plot_curves, scale_name, spread, verdict, write_results

# The default finishes in minutes on one CPU thread.
SCALES = {
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


def ryarn_argv(task: str, method: str, setup: dict, seed: int, root: str, threads=None, device="cpu") -> list[str]:
    """The train.py command line of one run: "pretrain" or one of ryarn_methods, which start from it.

    --force retrains every run, so the committed numbers always come from this command; fine-tuning starts
    from trained weights, so a short warm-up suffices.
    """
    L = setup["length"]
    argv = ["--task", task, "--train-len", f"{L // 2}:{L}", "--seed", str(seed), "--eval-samples",
            str(setup["samples"]), "--device", device, "--out", os.path.join(root, method), "--force", "--quiet"]
    argv += ["--threads", str(threads)] if threads else []
    if method == "pretrain":
        return argv + ["--steps", str(setup["pretrain"])]
    return argv + ["--steps", str(setup["finetune"]), "--init", os.path.join(root, "pretrain"),
                   "--warmup", "20"] + ryarn_methods(L, setup["factor"])[method]


def run(args) -> None:
    scale = scale_name(args)
    setup = SCALES[scale]
    L, s = setup["length"], setup["factor"]
    lengths = [L, 2 * L, 4 * L, 8 * L]  # train.py's final table: 1, 2, 4 and 8 times the longest training length
    methods = list(RYARN_LABELS)
    command = command_line(args)
    start, cpu_start = time.perf_counter(), time.process_time()
    # accuracy[task][method][seed] = accuracies at `lengths`
    accuracy = {task: {m: [] for m in methods} for task in RYARN_TASKS}
    runs = ["pretrain", *ryarn_methods(L, s)]  # every fine-tune starts from this seed's pretrained run
    bar = tqdm(total=len(RYARN_TASKS) * len(setup["seeds"]) * len(runs), desc="ryarn")
    for task in RYARN_TASKS:
        for seed in setup["seeds"]:
            root = os.path.join("runs", "ryarn", scale, task, f"s{seed}")
            for method in runs:
                bar.set_postfix_str(f"{task} seed {seed} {method}")
                rows = train.run(ryarn_argv(task, method, setup, seed, root, args.threads, args.device))["rows"]
                accuracy[task]["zero-shot" if method == "pretrain" else method].append([r["accuracy"] for r in rows])
                bar.update(1)
            # Paper R's zero-shot baseline with inference-time YaRN: the pretrained weights, stretched by s
            model, cfg = train.load_run(os.path.join(root, "pretrain"), args.device, scaling="yarn", factor=s,
                                        original_len=L)
            accuracy[task]["zero-shot+yarn"].append(
                [train.evaluate(model, task, n, cfg["task_options"], setup["samples"], device=args.device)["accuracy"]
                 for n in lengths])
    bar.close()
    # wall time depends on what else the machine runs; CPU time is what the experiment itself costs
    runtime = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu_start, 1)}

    # "beyond L" for one seed: its mean accuracy at 2L, 4L and 8L; spreads are then taken over seeds
    beyond = {task: {m: [sum(acc[1:]) / 3 for acc in by_method[m]] for m in methods}
              for task, by_method in accuracy.items()}

    def gain(task, better, worse):
        """Seed-paired difference of beyond-L accuracy; it holds when large on average and positive in every seed."""
        return {"task": task, "better": better, "worse": worse,
                **paired_gain(beyond[task][better], beyond[task][worse], RYARN_THRESHOLD)}

    claims = {
        "ryarn > yarn > ft beyond L": [gain(t, b, w) for t in RYARN_TASKS for b, w in (("ryarn", "yarn"),
                                                                                       ("yarn", "ft"))],
        "the curriculum matters": [gain(t, "ryarn", "ryarn-nocurr") for t in RYARN_TASKS],
    }
    verdicts = {claim: verdict(all(g["holds"] for g in gains), any(g["holds"] for g in gains))
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
        fig.suptitle(f"Randomized YaRN on a small GPT: mean of {len(setup['seeds'])} seed(s), band = range over "
                     "seeds", fontsize=10)
        fig.tight_layout(rect=(0, 0, 0.87, 1))
        return fig

    data = {"command": command, "runtime": runtime, "size": scale, "settings": setup,
            "tasks": RYARN_TASKS, "lengths": lengths, "threshold": RYARN_THRESHOLD, "accuracy": accuracy,
            "beyond_L": {t: {m: spread(v) for m, v in by.items()} for t, by in beyond.items()},
            "claims": claims, "verdicts": verdicts}
    markdown = ryarn_markdown(setup, command, runtime, lengths, accuracy, beyond, claims, verdicts, args.device)
    write_results("ryarn", markdown, data, figure, args.out_dir)


def ryarn_markdown(setup, command, runtime, lengths, accuracy, beyond, claims, verdicts, device) -> str:
    L, s, seeds = setup["length"], setup["factor"], setup["seeds"]

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
        f"{setup['pretrain']} steps on each task at lengths {L // 2}..{L} with contiguous positions, so its original "
        f"context is L = {L}. Each method below then fine-tunes it for {setup['finetune']} steps at the same "
        f"lengths. YaRN uses factor s = {s} (target {s * L}) with original length {L}; randomized positions are "
        f"n sorted distinct ids from [0, M) for n tokens, with M = {s * L}, or M widened linearly from {L} to "
        f"{s * L} by the curriculum. Evaluation uses contiguous positions at lengths "
        f"{', '.join(map(str, lengths))}, on the same {setup['samples']} held-out sequences per length for every "
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
            cells = [mean_sd(list(a), 3) for a in zip(*per_seed)] + [mean_sd(beyond[task][m], 3)]
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
