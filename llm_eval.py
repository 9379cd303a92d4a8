"""Evaluate an LLM at long context: score prompts of a text task at each length (and depth), read the grid's
effective length, and the `eval.py --llm / RUN` command that does it.

    python eval.py --llm smollm2 --task babilong --lengths 2048,12288            # a row per length
    python eval.py --llm smollm2 --task passkey --lengths 1024,4096 --depths 0,0.5,1 --scaling none,yarn

In reading order: evaluate_llm (exact match, answer log-probability and candidate rank on a length's prompts,
with intervals), built from score_prompts (each prompt scored once, read back from a ScoreCache where one is
given) and llm_row (a row from the scores); evaluate_llm_grid (a length x depth grid, each cell with prompts of
its own; --sequential stops a length once its side of the threshold is settled); effective_length (the longest
length above a threshold, with an interval on the grid) and its printing; the heatmap; the command. eval.py
parses the command line and hands an LLM here; experiments/llm.py calls evaluate_llm.
"""
from __future__ import annotations

import json
import math
import statistics
import time

import torch
from tqdm import tqdm

import dist
import hf
import text_tasks
from eval import interval, markdown_table, pyplot, save_figure, t_interval, wilson
from runs import UsageError, save_atomic


def evaluate_llm(model, tokenizer, task: str, length: int, samples: int, options: dict | None = None,
                 device: str = "cpu", seed: int = 10 ** 9, bar=None, bf16: bool = False, cache=None) -> dict:
    """Exact match (greedy), answer log-likelihood and candidate rank on `samples` prompts of about `length`
    tokens, the same prompts for every model. Exact match and the fraction of prompts where the right
    candidate ranks first have 95 % Wilson intervals (interval); the answer's log-probability, its 95 %
    t-interval. The seeds lie far from the training samples' (finetune.py uses seed * 1,000,003 + i). cache: an
    hf.ScoreCache, where each prompt's score is kept and found again (score_prompts)."""
    # Under a launcher (torchrun) process r scores prompts r, r + N, ...; every process gets all the scores,
    # in prompt order, as one process computes them (each prompt is scored on its own).
    scores = []
    for i in range(dist.rank(), samples, dist.world()):
        scored = score_prompts(model, tokenizer, task, length, [seed + i], options, device, bf16, cache)
        scores += [(i, s) for s in scored]
        if bar is not None:
            bar.update(min(dist.world(), samples - i))  # this round of prompts, one per process
    scores = [score for _, score in sorted(dist.gather(scores), key=lambda pair: pair[0])]
    return llm_row(task, length, scores, options)


def score_prompts(model, tokenizer, task: str, length: int, seeds, options: dict | None, device: str = "cpu",
                  bf16: bool = False, cache: hf.ScoreCache | None = None) -> list[dict]:
    """hf.score_prompt on the prompt of each seed: [{answer, right, logprob, rank, said, tokens}, ...]. With a
    cache, a prompt already scored there (this model, task, options, length, seed, rotation at this length and
    bf16) is read back instead, and each new score is kept there as soon as it exists."""
    candidates = text_tasks.answer_candidates(task, options)
    rope = hf.rope_digest(model) if cache else None
    scores = []
    for seed in seeds:
        key = cache.key(task=task, options=options or {}, length=length, seed=seed, rope=rope, bf16=bf16) \
            if cache else None
        if cache and (kept := cache.get(key)) is not None:
            scores.append(kept)
            continue
        prompt, answer = hf.text_sample(tokenizer, task, length, seed, options or {})
        scores.append({"answer": answer, **hf.score_prompt(model, tokenizer, prompt, answer, candidates, device,
                                                            bf16=bf16)})
        if cache:
            cache.put(key, scores[-1])
    return scores


def llm_row(task: str, length: int, scores: list[dict], options: dict | None = None) -> dict:
    """One length's (or cell's) row from its prompts' scores: exact match, top-1 with Wilson intervals, log p
    with a t-interval, the prompts themselves."""
    mean, low, high = interval(torch.tensor([float(s["right"]) for s in scores]))
    row = {"length": length, "accuracy": mean, "low": low, "high": high, "samples": len(scores)}
    row["logprob"], row["logprob_low"], row["logprob_high"] = t_interval([s["logprob"] for s in scores])
    if candidates := text_tasks.answer_candidates(task, options):
        first = torch.tensor([float(s["rank"] == 1) for s in scores])
        row["top1"], row["top1_low"], row["top1_high"] = interval(first)
        row["mean_rank"], row["candidates"] = float(torch.tensor([s["rank"] for s in scores]).mean()), len(candidates)
    row["prompts"] = scores
    return row


# A length x depth grid, and the effective length read from it. Every cell draws its own prompts (its own haystack
# and key), so that a cell's neighbours share no text: a grid that reused one haystack per length would measure
# that haystack as much as the model.
GRID_SEED = 10 ** 9  # as evaluate_llm's default: far from the training samples' seeds
CELL_SEEDS = 10 ** 6  # seeds per cell (MAX_SAMPLES): cell c's prompts take GRID_SEED + c * CELL_SEEDS + i


def evaluate_llm_grid(model, tokenizer, task: str, lengths: list[int], depths: list[float], samples: int,
                      device: str = "cpu", bar=None, bf16: bool = False, first_cell: int = 0,
                      options: dict | None = None, settle: float | None = None, cache=None) -> list[dict]:
    """evaluate_llm at every (length, depth), each cell with seeds of its own (cells numbered from first_cell,
    lengths outermost): rows of {length, depth, accuracy, low, high, samples, ...}. options: the task's own
    (e.g. passkey's template), the same in every cell. cache: an hf.ScoreCache (score_prompts).

    settle (a threshold): sequential sampling. A length's prompts are scored a round at a time, one prompt per
    depth, and the length stops as soon as its side of the threshold is settled: its depths pooled, the full
    grid of `samples` prompts per cell would score above the threshold whatever the unscored prompts say, or
    could no longer get above it. So the effective length's point estimate is the full grid's, exactly; the
    intervals are Wilson's over the prompts scored (fewer, so wider). Each cell scores a prefix of the prompts
    the full grid would score. A cell's 'planned' keeps `samples`."""
    if settle is not None and dist.world() > 1:
        raise UsageError("--sequential scores a length's prompts one round at a time, in one process: leave out "
                         "torchrun")
    cells = []
    for n in lengths:
        here = {d: (first_cell + len(cells) + j) * CELL_SEEDS + GRID_SEED for j, d in enumerate(depths)}
        at = {d: {**(options or {}), "depth": d} for d in depths}  # each cell's task options
        if settle is None:
            cells += [{"depth": d, **evaluate_llm(model, tokenizer, task, n, samples, at[d], device, seed, bar, bf16,
                                                  cache)} for d, seed in here.items()]
            continue
        scores = {d: [] for d in depths}
        for i in range(samples):
            for d, seed in here.items():
                scores[d] += score_prompts(model, tokenizer, task, n, [seed + i], at[d], device, bf16, cache)
            if bar is not None:
                bar.update(len(depths))
            if settled(sum(s["right"] for d in depths for s in scores[d]), (i + 1) * len(depths),
                       samples * len(depths), settle):
                if bar is not None:
                    bar.update((samples - i - 1) * len(depths))  # the prompts it did not need
                break
        cells += [{"depth": d, **llm_row(task, n, scores[d], at[d]), "planned": samples} for d in depths]
    return cells


def settled(right: int, scored: int, planned: int, threshold: float) -> bool:
    """Whether `planned` prompts' exact match is sure to fall on one side of the threshold after `scored` of
    them, `right` right: above it whatever the rest say, or at or below it even if all the rest are right."""
    return right > threshold * planned or right + (planned - scored) <= threshold * planned


def pooled(cells: list[dict]) -> list[dict]:
    """One row per length, its cells' prompts taken together (over depths): {length, accuracy, low, high,
    samples} with Wilson's 95 % interval."""
    rows = []
    for n in dict.fromkeys(c["length"] for c in cells):
        here = [c for c in cells if c["length"] == n]
        total = sum(c["samples"] for c in here)
        mean = sum(c["accuracy"] * c["samples"] for c in here) / total
        rows.append(dict(zip(("length", "accuracy", "low", "high"), (n, *wilson(mean, total))), samples=total))
    return rows


def effective_length(rows: list[dict], threshold: float, alpha: float = 0.05) -> dict:
    """The longest tested length up to which every length scores above `threshold` (the effective length of
    RULER, Hsieh et al. 2404.06654), from rows of {length, accuracy, samples} (exact match, so `accuracy` *
    `samples` prompts were right), with a (1 - alpha) interval on the same grid.

    The interval: `high` is the longest length up to which every upper bound is above the threshold, `low` the
    same with lower bounds. It misses the true effective length E only if an upper bound at or below E falls to
    the threshold (true score above it) or the lower bound just past E rises above it (true score at or below):
    at most k one-sided errors for the k lengths, so each Wilson bound is one-sided at alpha / k (Bonferroni)
    and the interval covers E with probability >= 1 - alpha. tests/test_effective_length.py simulates known
    curves, one hugging the threshold where that bound is nearly met, and checks the rate.
    `slope`: the fall in score per doubling of the length between the effective length and the next tested one;
    `crossing`: where the straight line between them (against log2 length) meets the threshold. An effective
    length read off a curve with slope k and score noise sigma is uncertain by a factor of about 2^(sigma / k):
    a shallow crossing gives a wide interval, and the interval shows it. `outcome` names the two ends that have
    no crossing to report."""
    rows = sorted(rows, key=lambda r: r["length"])
    z = statistics.NormalDist().inv_cdf(1 - alpha / len(rows))  # each side's error alpha / k
    bounds = [wilson(r["accuracy"], r["samples"], z) for r in rows]

    def longest(scores):
        """The longest length up to which every score is above the threshold; None if the shortest is not."""
        above = None
        for r, score in zip(rows, scores):
            if score <= threshold:
                break
            above = r["length"]
        return above

    point = longest([r["accuracy"] for r in rows])
    out = {"threshold": threshold, "alpha": alpha, "length": point, "low": longest([b[1] for b in bounds]),
           "high": longest([b[2] for b in bounds]), "slope": None, "crossing": None}
    if point is None:
        out["outcome"] = "below the threshold at the shortest length"
    elif point == rows[-1]["length"]:
        out["outcome"] = "above the threshold at every tested length"
    else:
        i = [r["length"] for r in rows].index(point)
        a, b = rows[i], rows[i + 1]
        out["slope"] = (a["accuracy"] - b["accuracy"]) / math.log2(b["length"] / a["length"])
        out["crossing"] = a["length"] * 2 ** ((a["accuracy"] - threshold) / out["slope"])
        out["outcome"] = "crosses the threshold"
    return out


def describe_effective_length(e: dict, shortest: int, longest: int) -> str:
    """One line: the effective length, its interval (with the grid's ends said in words) and the slope."""
    def bound(n, high):
        if n is None:
            return f"< {shortest}"
        return f">= {n}" if high and n == longest else str(n)
    head = f"effective length (score > {e['threshold']:g}, {1 - e['alpha']:.0%} interval over the grid): "
    if e["length"] is None:
        head += f"none, {e['outcome']} ({shortest})"
    else:
        head += f"{bound(e['length'], True)}"
    head += f" [{bound(e['low'], False)}, {bound(e['high'], True)}]"
    if e["slope"] is not None:
        head += (f"; crossing near {e['crossing']:.0f} tokens, falling {e['slope']:.2f} per doubling")
    elif e["length"] is not None:
        head += f"; {e['outcome']}"
    return head


def grid_table(cells: list[dict]) -> str:
    """Markdown: a row per length, a column per depth, each cell 'accuracy [low, high]' (Wilson, 95 %)."""
    depths = list(dict.fromkeys(c["depth"] for c in cells))
    lines = ["| length | " + " | ".join(f"depth {d:g}" for d in depths) + " |", "|---:|" + "---:|" * len(depths)]
    for n in dict.fromkeys(c["length"] for c in cells):
        row = {c["depth"]: c for c in cells if c["length"] == n}
        lines.append(f"| {n} | " + " | ".join(f"{row[d]['accuracy']:.2f} [{row[d]['low']:.2f}, {row[d]['high']:.2f}]"
                                              for d in depths) + " |")
    return "\n".join(lines)




def plot_heatmap(ax, cells: list[dict], threshold: float) -> None:
    """Exact match of every (length, depth) cell, lengths across and depths down, each cell's score written in
    it; a cell at or below the threshold is marked with a dot."""
    lengths = list(dict.fromkeys(c["length"] for c in cells))
    depths = list(dict.fromkeys(c["depth"] for c in cells))
    score = {(c["length"], c["depth"]): c["accuracy"] for c in cells}
    grid = [[score[n, d] for n in lengths] for d in depths]
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i, d in enumerate(depths):
        for j, n in enumerate(lengths):
            mark = "\u00b7" if score[n, d] <= threshold else ""
            ax.text(j, i, f"{score[n, d]:.2f}{mark}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("depth")
    ax.figure.colorbar(image, ax=ax, label="exact match")




MAX_LLM_TOKENS = 2 ** 20  # 8x Paper R's longest evaluation (128K)


def llm_eval_command(args) -> None:
    """eval.py on a train.py --llm run or a base model: exact match on a text task at each length (and depth),
    with the effective length; under each of the scalings asked for, one after the other."""
    scalings, task, options = check_llm_flags(args)
    device = dist.start(args.device)  # under torchrun, each process scores a share of the prompts (dist.py)
    lengths = args.lengths or [1024, 4096, 8192, 12288]
    samples = args.samples or 5
    threshold = 0.5 if args.threshold is None else args.threshold
    # --cache: every prompt's score kept as soon as it exists, keyed by the fingerprint of what is loaded, so that
    # the same command again (or another sharing the file) scores only the prompts still missing
    cache = hf.ScoreCache(args.cache, hf.fingerprint(args.run or args.llm)) if args.cache else None
    models = []
    for scaling in scalings:
        model, tokenizer, label = hf.load_for_eval(args.run or args.llm, device, scaling, args.factor)
        if (table := hf.position_table(model)) and max(lengths) > table:
            raise UsageError(f"{label} has a learned table of {table} positions: --lengths {max(lengths)} goes "
                             "beyond it")
        for n in lengths:  # every length holds the task's prompt, before any is scored
            try:
                hf.text_sample(tokenizer, task, n, 10 ** 9, options)
            except ValueError as e:
                raise UsageError(f"--lengths {n}: {e}") from None
        start = time.perf_counter()
        cells = llm_cells(args, model, tokenizer, label, task, options, scaling, lengths, samples, threshold, device,
                          cache)
        models.append((label, cells, time.perf_counter() - start))
        del model
    dist.stop()
    if dist.launch_rank() > 0:  # rank 0 reports for all
        return
    report_llm(args, task, models, threshold)


def check_llm_flags(args) -> tuple[list, str, dict]:
    """The LLM evaluation's flags checked before anything is loaded: (scalings, task, the task's options).
    An LLM is measured as saved, or with inference-time YaRN (static or dynamic) over its own context."""
    scalings = [None if s == "none" else s for s in (args.scaling or "none").split(",")]
    if any(s not in (None, "yarn", "dynamic_yarn") for s in scalings) or len(set(scalings)) < len(scalings):
        raise UsageError(f"--scaling {args.scaling}: an LLM is evaluated as saved (none) or with yarn or "
                         "dynamic_yarn, each at most once (e.g. none,yarn,dynamic_yarn)")
    if args.factor is not None and scalings == [None]:
        raise UsageError("--factor needs --scaling yarn (or dynamic_yarn) for an LLM")
    if args.original_len is not None:
        raise UsageError("--original-len is for small-GPT runs: an LLM's original context is read from its config")
    if args.plot and args.depths is None:
        raise UsageError("--plot draws a small-GPT run's table, or an LLM's length x depth grid (--depths); an LLM's "
                         "lengths alone are printed (and kept with --json)")
    if args.delays is not None:
        raise UsageError("--delays is for a small GPT's delay tasks; an LLM is measured at --lengths")
    if args.lengths and max(args.lengths) > MAX_LLM_TOKENS:  # a prompt is built whole before the model sees it
        raise UsageError(f"--lengths {max(args.lengths):,}: an LLM prompt here is at most {MAX_LLM_TOKENS:,} tokens")
    if args.sequential and args.depths is None:
        raise UsageError("--sequential stops a length of the grid once its side of the threshold is settled: "
                         "give --depths")
    task = args.task or "babilong"
    if args.depths is not None and "depth" not in text_tasks.text_task_options(task):
        raise UsageError(f"--depths: {task} hides nothing at a depth; give --task " +
                         " or ".join(t for t in text_tasks.TEXT_TASKS if "depth" in text_tasks.text_task_options(t)))
    options = {}
    if args.template is not None:
        if "template" not in text_tasks.text_task_options(task):
            raise UsageError(f"--template is passkey's; {task} has one form")
        options["template"] = args.template
    return scalings, task, options


def llm_cells(args, model, tokenizer, label, task, options, scaling, lengths, samples, threshold, device,
              cache=None):
    """The rows of one model under one scaling: a row per length, or per (length, depth) with --depths."""
    depths = args.depths or [None]  # None: each prompt draws its own depth
    cells = []
    with tqdm(total=len(lengths) * len(depths) * samples, desc=label, disable=dist.rank() > 0) as bar:
        for n in lengths:
            if scaling == "dynamic_yarn":  # the factor this length needs, set once for all its prompts
                hf.dynamic_yarn_at(model, n, args.factor or 1.0)
            if args.depths is None:
                cells.append(evaluate_llm(model, tokenizer, task, n, samples, options, device, bar=bar,
                                          bf16=args.bf16, cache=cache))
            else:
                cells += evaluate_llm_grid(model, tokenizer, task, [n], depths, samples, device, bar, args.bf16,
                                           len(cells), options, threshold if args.sequential else None, cache)
    return cells


def report_llm(args, task: str, models: list[tuple], threshold: float) -> None:
    """What llm_eval_command prints and writes for each (label, cells, seconds): the grid (with --depths), a row
    per length, the effective length; --json (one model's, or {task, models: [...]}) and --plot (a heatmap per
    model, side by side)."""
    grid = args.depths is not None
    records = []
    for label, cells, seconds in models:
        rows = pooled(cells) if grid else cells
        summary = effective_length(rows, threshold)
        print(f"{label}: {task}, exact match")
        if grid:
            print(grid_table(cells))
            print("over the depths:")
        print(markdown_table(rows))
        print(describe_effective_length(summary, min(r["length"] for r in rows), max(r["length"] for r in rows)))
        planned = sum(c.get("planned", c["samples"]) for c in cells)
        saved = f"; --sequential saved {planned - sum(c['samples'] for c in cells)} of {planned}" \
            if args.sequential else ""
        print(f"({cells[0].get('planned', cells[0]['samples'])} prompts per length" + (" and depth" if grid else "")
              + f"{saved}, {seconds:.0f} s)\n")
        records.append({"model": label, "task": task, "rows": rows, "effective_length": summary, "seconds": seconds,
                        **({"cells": cells} if grid else {})})
    if args.json:
        text = json.dumps(records[0] if len(records) == 1 else {"task": task, "models": records}, indent=1)
        save_atomic(args.json, lambda f: f.write(text.encode()))
    if args.plot and (plt := pyplot()):
        fig, axes = plt.subplots(1, len(records), figsize=(4.2 * len(records), 3.3), squeeze=False)
        for ax, record in zip(axes[0], records):
            plot_heatmap(ax, record["cells"], threshold)
            ax.set_title(f"{record['model']}: {task}", fontsize=8)
        fig.tight_layout()
        save_figure(fig, args.plot)
        print(f"figure: {args.plot}")
