"""Evaluate a run: accuracy across lengths or delays, with intervals; and the command line that does it, or runs a
named experiment.

    python eval.py runs/NAME --lengths 24,48,96,192          # accuracy table with 95 % intervals
    python eval.py runs/NAME --delays 0:60 --plot delays.png  # delay tasks: accuracy at each delay
    python eval.py runs/NAME --lengths 64,128 --scaling yarn --factor 4   # inference-time YaRN
    python eval.py runs/LLM_RUN --task babilong --lengths 2048,12288     # a train.py --llm run
    python eval.py --llm smollm2 --task passkey --lengths 1024,4096 --depths 0,0.5,1   # grid, effective length
    torchrun --nproc_per_node 2 eval.py runs/LLM_RUN ...     # the prompts shared out over 2 processes
    python eval.py --experiment retrieval                    # experiments/retrieval.py -> results/retrieval.*
    python eval.py --experiment distance --jobs 4            # its independent models in 4 processes
    python eval.py --bench                                   # experiments/bench.py -> results/bench.*

In reading order: loading a run; measuring it (evaluate: accuracy on fresh sequences at one length, with its
interval; evaluate_table: a row per length or delay; final_table: what train.py prints at the end; Wilson's and
Student's t intervals); drawing it; the command line. An LLM is measured by llm_eval.py (exact match and answer
log-probability over prompts, a length x depth grid, the effective length), which this command hands it to. train.py measures its runs with these same functions, and so do the experiments.
An experiment (experiments/NAME.py and NAME_report.py, run by experiments/common.py) is imported only when asked
for, by one late import in command(): nothing else here imports the experiments; they import this file.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import io
import json
import math
import os
import signal
import stat
import sys
import time

if __name__ == "__main__":  # Ctrl-C while torch and the rest load (a second or more): one line, as later
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, b"eval.py: interrupted\n"), os._exit(130)))

import torch

import dist
import hf
import lengen
import tasks
import text_tasks
from runs import (MAX_SAMPLES, RUN_FILES, Parser, RunConfig, UsageError, check_machine, check_memory, cli_main, finite,
                  holds_run, int_set, load_checkpoint, read_config, read_fit, save_atomic)

# ---------------------------------------------------------------------------------------------------------
# Loading a run
# ---------------------------------------------------------------------------------------------------------


def model_config(cfg: RunConfig) -> lengen.GPTConfig:
    """The model a run's config describes: GPTConfig's fields are RunConfig's fields of the same name."""
    return lengen.GPTConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(lengen.GPTConfig)
                               if hasattr(cfg, f.name)})


def load_run(run_dir: str, device: str = "cpu", **overrides) -> tuple[lengen.GPT, RunConfig]:
    """A trained run's model (eval mode) and its config; `overrides` change model settings, e.g.
    scaling="yarn", factor=4 for inference-time YaRN on a model trained without it."""
    cfg = dataclasses.replace(read_config(run_dir), **overrides)
    try:
        model = lengen.GPT(model_config(cfg))
    except (TypeError, ValueError) as e:  # a setting of the wrong type or out of range
        raise UsageError(f"{run_dir}: {e}") from None
    state = load_checkpoint(run_dir)["model"]
    try:
        model.load_state_dict(state)
    except (TypeError, RuntimeError, AttributeError):  # not a state dict, or not this model's
        raise UsageError(f"{run_dir}: checkpoint does not match its config ({mismatch(model, state)})") from None
    return model.to(device).eval(), cfg


def mismatch(model: torch.nn.Module, state) -> str:
    """Why weights do not load into a model, in its own words: the first weight missing, unexpected, or of
    another shape (torch's own first line says only "Error(s) in loading state_dict for GPT:")."""
    if not isinstance(state, dict):
        return f"the weights are a {type(state).__name__}, not a state dict"
    ours = model.state_dict()
    for name, tensor in ours.items():
        if name not in state:
            return f"no {name} in the weights"
        theirs = getattr(state[name], "shape", None)
        if theirs != tensor.shape:
            return f"{name} is {tuple(theirs) if theirs is not None else type(state[name]).__name__} in the " \
                   f"weights, {tuple(tensor.shape)} in the model"
    extra = [name for name in state if name not in ours]
    return f"{extra[0]} in the weights is not in the model" if extra else "the weights do not load"


# ---------------------------------------------------------------------------------------------------------
# Measuring: masked accuracy at given lengths (or at given delays, for the delay tasks), with 95 % intervals
# ---------------------------------------------------------------------------------------------------------


def wilson(mean: float, n: int, z: float = 1.96) -> tuple[float, float, float]:
    """A fraction `mean` right of n trials, with Wilson's score interval at z (1.96: 95 %)."""
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mean, max(0.0, centre - half), min(1.0, centre + half)


def interval(per_sequence: torch.Tensor) -> tuple[float, float, float]:
    """Mean accuracy over sequences with a 95 % interval: Wilson's when each sequence is right or wrong,
    otherwise Student's t over sequences (tokens of one sequence are not independent, so sequences are the
    unit; at a few sequences 1.96 standard errors would be far too narrow)."""
    n, mean = per_sequence.numel(), float(per_sequence.mean())
    if torch.all((per_sequence == 0) | (per_sequence == 1)):
        return wilson(mean, n)
    if n < 2:  # one sequence says nothing of its spread
        return mean, 0.0, 1.0
    half = t_critical(0.05, n - 1) * float(per_sequence.std()) / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (Lentz's method) on the
    side where that converges fast, I_x(a, b) = 1 - I_(1-x)(b, a) on the other. Student's t needs it:
    P(|T| > t) = I_(df / (df + t^2))(df / 2, 1 / 2)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):  # each m adds two terms: d_2m = m (b - m) x / ..., d_2m+1 = -(a + m)(a + b + m) x / ...
        for term in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d, c = 1.0 + term * d, 1.0 + term / c
            d, c = 1.0 / (d if abs(d) > tiny else tiny), (c if abs(c) > tiny else tiny)
            f *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * f / a


def t_tail(t: float, df: int) -> float:
    """P(|T| > |t|) for Student's t with df degrees of freedom: the two-sided p-value of a t statistic. Past a
    df of 1e8 (where the tail is the normal's to 8 digits) df is 1e8: the continued fraction and lgamma lose
    digits beyond it."""
    if not math.isfinite(t):
        return 0.0
    if df < 1e5:
        return betainc(df / 2, 0.5, df / (df + t * t))
    # I_x(df/2, 1/2) with x = df / (df + t^2): at large df x rounds towards 1, and betainc's 1 - x loses every
    # digit, so the complement is taken from t^2 / (df + t^2) itself
    df = min(df, 1e8)
    return 1.0 - betainc(0.5, df / 2, t * t / (df + t * t))


@functools.lru_cache(maxsize=4096)
def t_critical(alpha: float, df: int) -> float:
    """The t with P(|T| > t) = alpha: 12.706 for alpha 0.05 and df 1, 4.303 for df 2, 2.042 for df 30, 1.960 as
    df grows. By bisection on t_tail, which falls as t grows."""
    if not 0 < alpha < 1:  # a negative alpha would double t for ever, and NaN compares false to every tail
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not df >= 1:
        raise ValueError(f"df must be >= 1, got {df}")
    low, high = 0.0, 1.0
    while t_tail(high, df) > alpha:
        low, high = high, 2 * high
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if t_tail(middle, df) > alpha else (low, middle)
    return (low + high) / 2


def sample_sd(values: list[float]) -> float:
    """The sample standard deviation of two or more numbers (n - 1 in the denominator)."""
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def t_interval(values, alpha: float = 0.05) -> tuple[float, float, float]:
    """Mean and its (1 - alpha) t-interval over n independent units (n - 1 degrees of freedom). Honest for a
    handful of units, where mean +- 1.96 standard errors is far too narrow: for 3 units and alpha 0.05 the
    half-width is 4.30 standard errors."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = t_critical(alpha, len(values) - 1) * sample_sd(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


@torch.no_grad()
def evaluate(model: lengen.GPT, task: str, length: int, options: dict, samples: int = 256, seed: int = 1234,
             batch: int | None = None, device: str = "cpu", positions: str = "contiguous",
             max_position: int | None = None, score_from: int = 0) -> dict:
    """Accuracy on `samples` fresh sequences of `length` tokens. Positions are contiguous (inference), or drawn
    by a sampler of lengen.POSITION_SAMPLERS from [0, max_position), as Ruoss et al. evaluate a model trained
    with randomized positions. The sequences depend on `seed` alone: every model meets the same ones.
    score_from: only answer tokens at index >= score_from count; beyond a training length L, score_from = L
    scores the answers no training sequence reached (shift answers at every index, most of them below L)."""
    if model.config.encoding == "learned" and length > model.config.max_len:
        raise UsageError(f"length {length} is beyond the learned position table ({model.config.max_len} rows): "
                         "retrain with a larger --max-len")
    if positions != "contiguous" and (max_position or 0) < length:
        raise UsageError(f"--positions {positions}: {length} distinct position ids need a range of at least "
                         f"{length}, got {max_position}")
    generator = torch.Generator().manual_seed(seed)
    position_rng = torch.Generator().manual_seed(seed + 1)  # position ids: a stream of their own
    batch = batch or max(1, min(samples, 2 ** 16 // length))  # about 64K tokens per forward
    scores = []
    for start in range(0, samples, batch):
        x, y, mask = tasks.make_batch(task, min(batch, samples - start), length, generator, **options)
        ids = None if positions == "contiguous" else \
            lengen.POSITION_SAMPLERS[positions](len(x), length, max_position, position_rng).to(device)
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        logits = model(x, ids)
        if not torch.isfinite(logits).all():
            raise UsageError(f"length {length}: the model's outputs are not finite (NaN or inf); no accuracy to "
                             "report")
        mask = mask & (torch.arange(length, device=device) >= score_from)
        if not mask.any(1).all():
            raise UsageError(f"{task} at {length} tokens: a sequence has no answer at index >= {score_from}")
        right = (logits.argmax(-1) == y) & mask
        scores.append(right.sum(1).float() / mask.sum(1))
    mean, lo, hi = interval(torch.cat(scores).cpu())
    return {"length": length, "accuracy": mean, "low": lo, "high": hi, "samples": samples}


def markdown_table(rows: list[dict], key: str = "length") -> str:
    lines = [f"| {key} | accuracy | 95% interval |", "|---:|---:|:---|"]
    lines += [f"| {r[key]} | {r['accuracy']:.3f} | [{r['low']:.3f}, {r['high']:.3f}] |" for r in rows]
    return "\n".join(lines)


def evaluate_table(model: lengen.GPT, cfg: RunConfig, lengths=None, delays=None, samples: int = 256,
                   device: str = "cpu", skip_unfit: bool = False) -> tuple[list[dict], str]:
    """Rows of {length|delay, accuracy, low, high, samples} and the key ("length" or "delay"). Delays keep the
    run's training window; a length or delay the task cannot hold is skipped (skip_unfit) or refused."""
    options = cfg.task_options
    if delays is not None and "delays" not in options:
        raise UsageError(f"--delays needs a delay task; '{cfg.task}' has none (use --lengths)")
    key = "delay" if delays is not None else "length"
    for n in lengths if key == "length" else ():  # before anything is computed
        check_memory(cfg.dim, cfg.vocab_size, n, f"length {n}", device)
    rows = []
    for value in delays if delays is not None else lengths:
        length, opts = (cfg.train_len[1], {**options, "delays": (value,)}) if key == "delay" else (value, options)
        try:
            row = evaluate(model, cfg.task, length, opts, samples, device=device)
        except ValueError as e:  # the window cannot hold an episode at this delay, or the task this length
            if skip_unfit:
                continue
            raise UsageError(f"{key} {value}: {e}") from None
        rows.append({"delay": value, **row} if key == "delay" else row)
    return rows, key


def final_table(model: lengen.GPT, cfg: RunConfig) -> tuple[list[dict], str]:
    """At the end of training: 1x, 2x, 4x, 8x the longest training length, or, for the delay tasks (fixed
    window), the training delays and unseen ones on either side."""
    hi, options = cfg.train_len[1], cfg.task_options
    if "delays" not in options:
        lengths = [hi * f for f in (1, 2, 4, 8) if not (cfg.encoding == "learned" and hi * f > cfg.max_len)]
        return evaluate_table(model, cfg, lengths, samples=cfg.eval_samples, device=cfg.device)
    trained = options["delays"]
    candidates = sorted({0, min(trained) // 2, min(trained), max(trained), max(trained) + 1,
                         2 * max(trained), 4 * max(trained)})
    return evaluate_table(model, cfg, delays=candidates, samples=cfg.eval_samples, device=cfg.device,
                          skip_unfit=True)



# ---------------------------------------------------------------------------------------------------------
# Drawing: optional. Without matplotlib every command still runs and says how to get the figure.
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


def save_figure(fig, path: str) -> None:
    """A figure in the format its name ends with (.pdf, .svg; PNG otherwise), written whole or not at all."""
    buffer = io.BytesIO()
    ending = os.path.splitext(path)[1].lower().lstrip(".")
    fig.savefig(buffer, format=ending if ending in ("pdf", "svg") else "png", dpi=120)
    save_atomic(path, lambda f: f.write(buffer.getvalue()))


def plot_curves(ax, curves: dict[str, list[dict]], key: str, train_range=None, log_x=True, styles=None):
    """One line per label: accuracy (with its 95 % band) against length or delay. styles[label] holds its
    colour and line style (line_styles), so that it looks the same in every panel; without, matplotlib's
    colour cycle."""
    for label, rows in curves.items():
        xs = [r[key] for r in rows]
        line, = ax.plot(xs, [r["accuracy"] for r in rows], marker="o", ms=3, label=label,
                        **(styles or {}).get(label, {}))
        ax.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], color=line.get_color(), alpha=0.15)
    if train_range:
        ax.axvspan(*train_range, color="grey", alpha=0.15, lw=0, label="trained")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(key)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)



# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got '{text}'") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive, got '{text}'")
    return values


def scaling_list(text: str) -> str:
    """--scaling: one of lengen.SCALINGS, or (an LLM) several, comma-separated."""
    for name in text.split(","):
        if name not in lengen.SCALINGS:
            raise argparse.ArgumentTypeError(f"'{name}' is not a scaling: choose from {', '.join(lengen.SCALINGS)}")
    return text


def depth_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of depths, got '{text}'") from None
    if not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"depths lie in [0, 1] (0: at the start, 1: at the end), got '{text}'")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"each depth once, got '{text}'")
    return values


def eval_command(args) -> None:
    if (args.factor is not None or args.original_len is not None) and args.scaling in (None, "none"):
        raise UsageError("--factor and --original-len set a rotary schedule: give --scaling with them")
    if args.scaling == "dynamic_yarn" and args.factor is None:
        args.factor = 1.0  # the reference code's dynamic YaRN: plain RoPE until the input passes L
    if args.scaling not in (None, "none") and args.factor is None:
        raise UsageError(f"--scaling {args.scaling} needs --factor S (how far it stretches the context)")
    overrides = {k: v for k, v in (("scaling", args.scaling), ("factor", args.factor),
                                   ("original_len", args.original_len)) if v is not None}
    model, cfg = load_run(args.run, args.device, **overrides)
    if args.lengths is None and args.delays is None:
        hi = cfg.train_len[1]
        if "delays" in cfg.task_options:
            args.delays = list(range(0, 4 * max(cfg.task_options["delays"]) + 1, 2))
        else:
            args.lengths = [hi, 2 * hi, 4 * hi, 8 * hi]
    start = time.perf_counter()
    rows, key = evaluate_table(model, cfg, args.lengths, args.delays, args.samples, args.device)
    label = os.path.basename(os.path.normpath(args.run))
    if args.scaling:
        label += f" ({args.scaling} x{args.factor:g})" if args.factor else f" ({args.scaling})"
    print(f"{label}: {cfg.task}, {cfg.encoding}, trained on {key}s "
          + (f"{cfg.train_len[0]}..{cfg.train_len[1]}" if key == "length"
             else ",".join(map(str, cfg.task_options["delays"]))) + progress(args.run, cfg))
    print(markdown_table(rows, key))
    print(f"({args.samples} sequences per {key}, {time.perf_counter() - start:.1f} s)")
    if args.json:  # written whole or not at all (runs.save_atomic), as every file lengen writes
        text = json.dumps({"run": args.run, "config": cfg.saved(), "rows": rows}, indent=1)
        save_atomic(args.json, lambda f: f.write(text.encode()))
    if args.plot and (plt := pyplot()):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        trained = cfg.train_len if key == "length" else (min(cfg.task_options["delays"]),
                                                             max(cfg.task_options["delays"]))
        plot_curves(ax, {label: rows}, key, trained, log_x=key == "length")
        fig.tight_layout()
        save_figure(fig, args.plot)
        print(f"figure: {args.plot}")


def progress(run_dir: str, cfg: RunConfig) -> str:
    """Where an unfinished run's checkpoint stands ('' once it took every step, or stopped at its --fit-bar)."""
    ckpt = load_checkpoint(run_dir)
    step, fit = ckpt["step"], ckpt.get("fit")

    def stopped(record) -> bool:  # at the bar at this step, and a run that stops there (not --no-fit-stop)
        return isinstance(record, dict) and record.get("steps_to_fit") == step and record.get("stop", True)
    try:
        fitted = stopped(read_fit(run_dir))
    except UsageError:  # no --fit-bar
        fitted = False
    # the checkpoint keeps the fit record too (train.py saves it with every checkpoint): fit.json gone, or never
    # written, a run that stopped at its bar is still finished
    fitted = fitted or stopped(fit)
    if step >= cfg.steps or fitted:
        return ""
    return f" (unfinished: its checkpoint is at step {step} of {cfg.steps}; train.py --resume --out RUN goes on)"


PLOT_FORMATS = (".png", ".pdf", ".svg")  # what --plot writes, by the name's ending


# What a Hugging Face model folder holds besides its config.json (weights, a tokenizer): never overwritten, and
# a folder that holds one of them beside a config.json that is not a run's is a model's, where nothing is written.
MODEL_FILES = (".safetensors", ".bin", ".gguf") + hf.TOKENIZER_FILES


def check_writable(path: str | None, flag: str) -> None:
    """Refuse, before anything is computed, a --json or --plot path that could not be written, or that writing
    would harm: anything but a new name or a plain file (a symlink, a FIFO, a device: save_atomic would put a new
    file in its place, and opening a FIFO to find out would wait for a reader), a file with other hard links
    (they would part), a run's own file (its config.json, checkpoint, log...), or a model's."""
    if path is None:
        return
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(os.path.normpath(path))
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as e:  # a folder on the way that is a file, or not searchable
        raise UsageError(f"{flag} {path}: {e.strerror}") from None
    if found is not None and not (stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode)):  # a folder: below
        kind = "a symlink" if stat.S_ISLNK(found.st_mode) else "a FIFO" if stat.S_ISFIFO(found.st_mode) else \
            "a device, a socket or some other special file"
        raise UsageError(f"{flag} {path}: {kind}, not a plain file; give a new file name")
    if found is not None and stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
        raise UsageError(f"{flag} {path}: a file with {found.st_nlink} hard links, which writing it would part; "
                         "give another name")
    if os.path.isfile(os.path.join(folder, "config.json")) and not holds_run(folder) \
            and any(f.endswith(MODEL_FILES) for f in os.listdir(folder)):
        raise UsageError(f"{flag} {path}: {folder} holds a model (a config.json that is not a run's); give a "
                         "file outside it")
    if name in RUN_FILES and os.path.isfile(os.path.join(folder, "config.json")):
        raise UsageError(f"{flag} {path}: that is a file of the run in {folder}; give another name")
    if found is not None and name.endswith(MODEL_FILES):
        raise UsageError(f"{flag} {path}: that is a model's file; give another name")
    try:
        open(path, "a").close()  # what writing it will take, without changing a file that is there
    except OSError as e:  # a missing folder, a folder, no permission
        raise UsageError(f"{flag} {path}: {e.strerror}") from None
    if found is None:
        os.remove(path)


def experiment_names() -> list[str]:
    """The experiments, by the files in experiments/: NAME.py, its study, with NAME_report.py beside it (bench is
    reached through --bench). Read from the folder, so that nothing here imports an experiment."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments")
    return sorted(f[:-len("_report.py")] for f in os.listdir(folder)
                  if f.endswith("_report.py") and f != "bench_report.py")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(description="Evaluate a run, or run a named experiment (see README).")
    p.add_argument("run", nargs="?", help="a run directory written by train.py")
    p.add_argument("--lengths", type=int_list, default=None, help="e.g. 24,48,96,192")
    p.add_argument("--delays", type=int_set, default=None, help="delay tasks: e.g. 0:60")
    p.add_argument("--samples", type=int, default=None,
                   help="sequences per length or delay (default 256; an LLM: 5 prompts)")
    p.add_argument("--llm", default=None, help="evaluate a base LLM (smollm2, a directory, a .gguf, a hub id)")
    p.add_argument("--task", default=None, choices=sorted(text_tasks.TEXT_TASKS), help="LLM text task (babilong)")
    p.add_argument("--depths", type=depth_list, default=None,
                   help="LLM: a length x depth grid, e.g. 0,0.25,0.5,0.75,1 (where the needle sits)")
    p.add_argument("--threshold", type=finite, default=None,
                   help="LLM: the score the effective length must stay above (default 0.5)")
    p.add_argument("--scaling", type=scaling_list, default=None,
                   help="evaluate with another rotary schedule (e.g. inference-time YaRN); an LLM takes several, "
                        "e.g. none,yarn,dynamic_yarn")
    p.add_argument("--factor", type=finite, default=None)
    p.add_argument("--template", choices=("published", "varied"), default=None,
                   help="LLM passkey: the published prompt (default) or generated, never-repeating filler")
    p.add_argument("--sequential", action="store_true",
                   help="LLM grid: stop a length once its side of --threshold is settled (llm_eval.settled)")
    p.add_argument("--bf16", action="store_true",
                   help="LLM: forwards under bfloat16 autocast (a CPU with AMX/AVX-512 BF16, or a GPU)")
    p.add_argument("--cache", default=None, metavar="FILE",
                   help="LLM: keep each prompt's score in FILE as soon as it exists; the same command again "
                        "scores only the prompts still missing")
    p.add_argument("--original-len", type=int, default=None)
    p.add_argument("--plot", default=None, metavar="FILE", help="a figure: .png, .pdf or .svg")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--experiment", default=None, help="a named experiment: " + ", ".join(experiment_names()))
    p.add_argument("--quick", action="store_true", help="experiment: a small version for the tests")
    p.add_argument("--full", action="store_true", help="experiment: closer to paper scale (a GPU helps)")
    p.add_argument("--probe", action="store_true",
                   help="experiment: the short probe of steps to fit that chose its default design "
                        "(results/NAME-probe.md, .json)")
    p.add_argument("--bench", action="store_true", help="speed and memory benchmark (results/bench.md)")
    p.add_argument("--out-dir", default=None,
                   help="experiment or bench: where results go (default results/; --quick: results/quick/)")
    p.add_argument("--force", action="store_true",
                   help="experiment or bench: replace results that another command wrote in --out-dir")
    p.add_argument("--render", action="store_true",
                   help="experiment: decide its claims again from --out-dir's NAME.json under the current rule, "
                        "and rewrite NAME.md, .json, .png (nothing is trained)")
    p.add_argument("--dry-run", action="store_true",
                   help="experiment: print what it would run, with its time and memory estimates, and run nothing "
                        "(gpu: the llm experiment's --full design)")
    p.add_argument("--jobs", type=int, default=1,
                   help="experiment: this many independent runs at once, each in its own process (results are "
                        "identical to --jobs 1)")
    p.add_argument("--cells", default=None, metavar="DIR",
                   help="experiment: write DIR/wave1.txt, wave2.txt, ...: a command per model still to train, for "
                        "a scheduler (docs/scaling-out.md); the same command without --cells then collects them")
    p.add_argument("--launcher", default="local",
                   help="experiment: local (this machine, --jobs at once) or submitit[:slurm|local|debug] (each "
                        "wave a job array; pip install submitit)")
    return p


# What each kind of command reads: a flag of another kind would be dropped without a word, so it is refused.
EVALUATION_FLAGS = ("lengths", "delays", "samples", "llm", "task", "depths", "threshold", "scaling", "factor",
                    "template", "sequential", "bf16", "cache",
                    "original_len", "plot", "json")
EXPERIMENT_FLAGS = ("quick", "full", "probe", "out_dir", "force", "render", "jobs", "cells", "launcher", "dry_run")


def refuse_dropped(args) -> None:
    """Refuse a flag the command would ignore: an evaluation's with --experiment or --bench, an experiment's with
    a run, --task on a small-GPT run (it has its own), and a run together with --llm (which one to evaluate?)."""
    def given(flag):
        value = getattr(args, flag)
        return value is not None and value is not False and value != {"jobs": 1, "launcher": "local"}.get(flag)
    experiment = "--bench" if args.bench else "--experiment" if args.experiment else None
    if experiment:
        dropped = (["RUN"] if args.run else []) + [f for f in EVALUATION_FLAGS if given(f)]
        if dropped:
            raise UsageError(f"{experiment} runs with its own settings: leave out {flag_name(dropped[0])}")
        return
    dropped = [f for f in EXPERIMENT_FLAGS if given(f)]
    if dropped:
        raise UsageError(f"{flag_name(dropped[0])} is for --experiment and --bench, not for evaluating a run")
    if args.run and args.llm:
        raise UsageError(f"give a run ({args.run}) or --llm {args.llm}, not both")
    small_gpt = args.run and os.path.isfile(os.path.join(args.run, "checkpoint.pt"))
    if args.task and small_gpt:
        raise UsageError("--task chooses an LLM's text task: a small-GPT run is evaluated on its own task")
    if given("depths") and small_gpt:
        raise UsageError("--depths is for an LLM's text task: a small-GPT task hides nothing at a depth")
    for flag in ("template", "sequential", "bf16", "cache"):
        if given(flag) and small_gpt:
            raise UsageError(f"{flag_name(flag)} is for an LLM's text task, not a small-GPT run")
    if args.scaling and "," in args.scaling and not (args.llm or args.run and not small_gpt):
        raise UsageError(f"--scaling {args.scaling}: a small-GPT run is evaluated under one scaling at a time")
    if given("threshold") and small_gpt:  # its per-sequence scores need not be right-or-wrong, as Wilson's are
        raise UsageError("--threshold sets an LLM's effective length (exact match per prompt); a small-GPT run "
                         "prints its accuracy per length")


def flag_name(flag: str) -> str:
    return flag if flag == "RUN" else "--" + flag.replace("_", "-")


def check_command(args) -> bool:
    """The command line's checks that need no run loaded, and the machine's threads set; True for an LLM."""
    check_machine(args.device, args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.factor is not None and args.factor < 1:
        raise UsageError(f"--factor must be >= 1 (it stretches the context), got {args.factor:g}")
    if args.threshold is not None and not 0 <= args.threshold < 1:
        raise UsageError(f"--threshold must lie in [0, 1) (a fraction of prompts right), got {args.threshold:g}")
    refuse_dropped(args)
    llm = bool(args.llm or (args.run and os.path.isdir(os.path.join(args.run, "model"))))
    if dist.launched() and (args.bench or args.experiment or not llm):
        raise UsageError("torchrun shares out an LLM evaluation's prompts; everything else runs in one process "
                         "(an experiment's runs in several: --jobs N)")
    if not (args.bench or args.experiment) and dist.launch_rank() == 0:  # rank 0 writes them
        check_writable(args.json, "--json")
        check_writable(args.plot, "--plot")
        check_writable(args.cache, "--cache")  # appended to, not replaced; the same files are refused
        if args.plot and os.path.splitext(args.plot)[1].lower() not in PLOT_FORMATS:  # else known after the run
            raise UsageError(f"--plot {args.plot}: give a file name ending {', '.join(PLOT_FORMATS)}")
    return llm


def command(argv: list[str] | None) -> None:
    args = build_parser().parse_args(argv)
    llm = check_command(args)
    if args.bench or args.experiment:  # the one import of the experiments, and only when asked for
        importlib.import_module("experiments.common").run_experiment(args.experiment or "bench", args)
    elif args.samples is not None and not 1 <= args.samples <= MAX_SAMPLES:
        raise UsageError(f"--samples must be >= 1 and at most {MAX_SAMPLES:,}")
    elif llm:  # llm_eval.py imports this file: it is imported here, when an LLM is evaluated
        importlib.import_module("llm_eval").llm_eval_command(args)
    elif args.run:
        args.samples = args.samples or 256
        eval_command(args)
    else:
        raise UsageError("give a run directory, --experiment NAME or --bench")


def main(argv: list[str] | None = None) -> int:
    # Every process of a torchrun launch checks the same command line and model: an error is said once.
    return cli_main("eval.py", command, argv, alike=True)


if __name__ == "__main__":
    sys.exit(main())
