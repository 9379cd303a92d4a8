"""Train one small GPT on one task and measure it beyond its training length; the command line of both trainers
(`--llm` hands a Hugging Face causal LM over to finetune.py, with the same flags).

    python train.py --task retrieval --offset 3 --encoding rope --train-len 8:24 --steps 2000
    python train.py --task copy --encoding rope --scaling yarn --factor 8 --original-len 32 \\
                    --positions randomized --curriculum 32:256 --init runs/copy-pretrained
    python train.py --llm smollm2 --method ryarn --train-len 512 --steps 100     # finetune.py

A small-GPT run lives in runs/NAME/: config.json (every setting; its keys are GPTConfig's fields and the
command line's flags, one name each), checkpoint.pt (written to a temporary file, flushed to the disk, then
renamed, so a kill never leaves half a checkpoint), log.jsonl (one line per logged step) and final.json (the
accuracy table printed at the end). `--resume` continues a run from its checkpoint and ends with the same
numbers as an uninterrupted run. Ctrl-C or SIGTERM (a scheduler preempting the job) finishes the current step,
saves a checkpoint and stops. A new run is built in a hidden folder beside runs/NAME and swapped in once its
step-0 checkpoint is written, so that a run which fails takes nothing with it; a lock turns away a second
train.py on the same run (runs.py holds that machinery, and what both trainers share).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

import dist
import finetune
import lengen
import tasks
import text_tasks
from runs import (Interrupted, UsageError, check_machine, check_runtime, closed_stdout, hold, learning_rate,
                  load_checkpoint, open_log, physical_memory, prepare_run_dir, read_config, refuse_unused,
                  resume_config, save_atomic, set_learning_rate, signals_deferred, swap_in, use_threads, write_config)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


def finite(text: str) -> float:
    """A float option. NaN and infinity are refused here: a range check such as x > 0 is false for NaN."""
    value = float(text)  # not a number: argparse says so
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}'")
    return value


def int_range(text: str) -> tuple[int, int]:
    """'24' -> (24, 24); '8:24' -> (8, 24)."""
    try:
        lo, _, hi = text.partition(":")
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LOW:HIGH, got '{text}'") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 < LOW <= HIGH, got '{text}'")
    return lo, hi


MAX_SET = 100_000  # far beyond any window a delay fits in; a list of 10^9 numbers alone would fill the memory


def int_set(text: str) -> tuple[int, ...]:
    """'15:25' -> 15, 16, ..., 25 (inclusive); '1,4,9' -> 1, 4, 9; the two mix: '0:3,10'."""
    values = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition(":")
            lo, hi = int(lo), int(hi or lo)
            if len(values) + hi - lo >= MAX_SET:  # counted before the list is made
                raise argparse.ArgumentTypeError(f"'{text}' lists more than {MAX_SET:,} values")
            values += range(lo, hi + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list like 15:25 or 1,4,9, got '{text}'") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got '{text}'")
    return tuple(sorted(set(values)))


def curriculum_spec(text: str) -> tuple[int, int, str]:
    """'32:256' or '32:256:cosine' -> (32, 256, shape): the range widens from 32 to 256, linearly by default."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
        raise argparse.ArgumentTypeError(f"expected START:END[:linear|step|cosine], got '{text}'")
    shape = parts[2] if len(parts) == 3 else "linear"
    if shape not in lengen.LengthCurriculum.SHAPES:
        raise argparse.ArgumentTypeError(f"unknown curriculum shape '{shape}'")
    if not 0 < int(parts[0]) <= int(parts[1]):
        raise argparse.ArgumentTypeError(f"expected 0 < START <= END, got '{text}'")
    return int(parts[0]), int(parts[1]), shape


# Task options the command line knows; each task takes the ones in its signature (tasks.task_options).
TASK_FLAGS = {"symbols": int, "offset": int, "m": int, "keys": int, "values": int, "statements": int, "fillers": int,
              "delays": int_set, "selective_delays": int_set}


# Defaults of a small GPT trained from scratch; an LLM fine-tune has its own (finetune.DEFAULTS).
DEFAULTS = {"train_len": (8, 24), "steps": 1000, "lr": 1e-3, "warmup": 100, "batch": 32, "factor": 1.0}


def both(key: str, show=str) -> str:
    """'default 1000; --llm: 100': a default for the help text, read from the two tables it describes."""
    return f"default {show(DEFAULTS[key])}; --llm: {show(finetune.DEFAULTS[key])}"


def span(pair) -> str:
    return f"{pair[0]}" if pair[0] == pair[1] else f"{pair[0]}:{pair[1]}"


def build_parser() -> Parser:
    p = Parser(description="Train one small GPT on one task, or fine-tune an LLM with --llm (see README).")
    p.add_argument("--task", default=None, choices=sorted(tasks.TASKS) + sorted(text_tasks.TEXT_TASKS),
                   help="default: retrieval (small GPT), babilong (--llm)")
    p.add_argument("--train-len", type=int_range, default=None, metavar="N|LOW:HIGH",
                   help=f"sequence length, or a range drawn from per batch ({both('train_len', span)})")
    for flag, kind in TASK_FLAGS.items():
        p.add_argument("--" + flag.replace("_", "-"), type=kind, default=None, help="task option")
    model = p.add_argument_group("model")
    model.add_argument("--encoding", default="rope", choices=tuple(lengen.ENCODINGS))
    model.add_argument("--layers", type=int, default=2)
    model.add_argument("--heads", type=int, default=2)
    model.add_argument("--dim", type=int, default=64)
    model.add_argument("--no-mlp", action="store_true", help="attention-only blocks")
    model.add_argument("--attention", default="softmax", choices=("softmax", "linear"))
    model.add_argument("--linear-normalised", action="store_true")
    model.add_argument("--rope-base", type=finite, default=10000.0)
    model.add_argument("--scaling", default="none", choices=tuple(lengen.SCALINGS))
    model.add_argument("--factor", type=finite, default=None,
                       help=f"rotary scaling factor s (>= 1; default {DEFAULTS['factor']:g}; --llm yarn/ryarn: "
                            f"{finetune.YARN_FACTOR:g}, and s = 1 is refused)")
    model.add_argument("--original-len", type=int, default=None,
                       help="the length L a scaling stretches (default: the longest training length)")
    model.add_argument("--max-len", type=int, default=None,
                       help="rows of a learned position table (default: 8x the longest training length)")
    pos = p.add_argument_group("positions")
    pos.add_argument("--positions", default="contiguous", choices=tuple(lengen.POSITION_SAMPLERS))
    pos.add_argument("--max-position", type=int, default=None,
                     help="sample position ids from [0, this) (default: 8x the longest training length)")
    pos.add_argument("--curriculum", type=curriculum_spec, default=None, metavar="START:END[:SHAPE]",
                     help="widen the position range from START to END over training")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--steps", type=int, default=None, help=both("steps"))
    opt.add_argument("--batch", type=int, default=None,
                     help=f"sequences per step (default {DEFAULTS['batch']}; --llm: samples per process and backward, "
                          f"default {finetune.DEFAULTS['batch']}, each its own forward)")
    opt.add_argument("--lr", type=finite, default=None, help=f"peak learning rate ({both('lr', '{:g}'.format)})")
    opt.add_argument("--wd", type=finite, default=0.0, help="AdamW weight decay on 2-D weights")
    opt.add_argument("--warmup", type=int, default=None, help=f"warm-up steps ({both('warmup')})")
    opt.add_argument("--seed", type=int, default=0)
    run = p.add_argument_group("run")
    run.add_argument("--out", default=None, help="run directory (default: runs/TASK-ENCODING-...-sSEED)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint, with "
                     "its saved settings (flags given with it must agree with them)")
    run.add_argument("--force", action="store_true",
                     help="replace the run in --out, once the new one has passed every check and started")
    run.add_argument("--init", default=None, metavar="RUN", help="start from another run's weights")
    run.add_argument("--save-every", type=int, default=250)
    run.add_argument("--device", default="cpu")
    run.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    run.add_argument("--compile", action="store_true",
                     help="torch.compile the training forward (see results/bench.md for whether it pays)")
    run.add_argument("--fit-bar", type=finite, default=None, metavar="ACC",
                     help="stop once accuracy on held-out sequences at the longest training length reaches ACC "
                          "(checked every --fit-every steps; fit.json records when)")
    run.add_argument("--fit-every", type=int, default=100, metavar="K", help="steps between fit checks (default 100)")
    run.add_argument("--eval-samples", type=int, default=256,
                     help="sequences per length in the final table (0: no final table)")
    run.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    finetune.add_arguments(p)
    return p


# ---------------------------------------------------------------------------------------------------------
# Settings: the parsed command line, checked, with every default resolved, is the run's config.json.
# ---------------------------------------------------------------------------------------------------------


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    args.task = args.task or "retrieval"
    if args.task in text_tasks.TEXT_TASKS:
        raise UsageError(f"'{args.task}' is a text task for an LLM: add --llm smollm2 (or another model)")
    refuse_unused(args, parser, finetune.LLM_ONLY, lambda flag: "is for --llm runs")
    check_runtime(args)
    cfg = {k: v for k, v in vars(args).items() if k not in finetune.LLM_ONLY | {"llm"}}
    lo, hi = args.train_len
    given = {k: v for k, v in cfg.items() if k in TASK_FLAGS and v is not None}
    accepted = tasks.task_options(args.task)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise UsageError(f"task '{args.task}' takes no --{unknown[0].replace('_', '-')} "
                         f"(it takes: {', '.join(accepted) or 'nothing'})")
    for key, value in given.items():
        if isinstance(value, int) and value < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 1")
    cfg["task_options"] = {**accepted, **given}
    for k in TASK_FLAGS:
        cfg.pop(k)
    default = {"original_len": hi, "max_len": 8 * hi, "max_position": 8 * hi}
    for key, value in default.items():
        cfg[key] = value if cfg[key] is None else cfg[key]
    needed = args.curriculum[1] if args.curriculum else cfg["max_position"] if args.positions != "contiguous" else hi
    if args.positions != "contiguous":
        start = args.curriculum[0] if args.curriculum else cfg["max_position"]
        if start < hi:
            raise UsageError(f"--positions {args.positions} draws {hi} distinct ids from [0, {start}): "
                             f"--max-position / curriculum start must be >= the training length {hi}")
        try:  # the sampler can draw from the widest range it will be given (not only from the first)
            lengen.POSITION_SAMPLERS[args.positions](1, hi, needed, torch.Generator())
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"--positions {args.positions} up to {needed:,}: {e}") from None
    elif args.curriculum:
        raise UsageError("--curriculum widens the range of sampled positions: use it with --positions "
                         "randomized, stretch or pose")
    if args.encoding == "xpos" and needed > lengen.XPos(2).max_span:
        raise UsageError(f"--encoding xpos stays finite for positions spanning at most {lengen.XPos(2).max_span:,}; "
                         f"these reach {needed:,} (lower --max-position or the curriculum's end)")
    if args.encoding == "learned" and needed > cfg["max_len"]:
        raise UsageError(f"positions reach {needed} but the learned table has {cfg['max_len']} rows "
                         "(raise --max-len)")
    if cfg["fit_bar"] is not None and not 0 < cfg["fit_bar"] <= 1:
        raise UsageError(f"--fit-bar {cfg['fit_bar']:g}: an accuracy in (0, 1]")
    for flag in ("steps", "batch", "save_every", "layers", "heads", "dim", "max_len", "fit_every"):
        if cfg[flag] < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if cfg["eval_samples"] < 0:
        raise UsageError("--eval-samples must be >= 0")
    if cfg["rope_base"] <= 1:
        raise UsageError("--rope-base must be > 1 (rotary frequencies are base^(-2i/d))")
    if cfg["scaling"] == "none" and cfg["factor"] != 1:
        raise UsageError(f"--factor {cfg['factor']:g} stretches a rotary scaling: give --scaling "
                         f"{'|'.join(s for s in lengen.SCALINGS if s != 'none')} with it")
    if cfg["original_len"] < 1:
        raise UsageError(f"--original-len {cfg['original_len']}: the length a model was trained at is >= 1")
    cfg["vocab_size"] = tasks.vocab_size(args.task, **cfg["task_options"])
    check_memory(cfg, cfg["batch"] * hi, f"a batch of {cfg['batch']} x {hi} tokens", args.device)
    for n in (lo, hi):  # the task fits every training length
        tasks.make_batch(args.task, 1, n, torch.Generator(), **cfg["task_options"])
    lengen.GPT(model_config(cfg))  # the model is buildable: bad combinations fail here, before anything is written
    cfg["out"] = args.out or os.path.join("runs", default_name(cfg))
    return cfg


def check_resumed(cfg: dict) -> None:
    """What --resume reads from a config.json that may have been edited by hand: the model it describes can be
    built, and the machine has its device (say --device cpu to continue a GPU run here)."""
    try:
        lengen.GPT(model_config(cfg))
    except (TypeError, ValueError) as e:
        raise UsageError(f"{cfg['out']}/config.json: {e}") from None
    check_machine(cfg["device"], cfg["threads"])


def check_memory(cfg: dict, tokens: int, what: str, device: str) -> None:
    """Refuse, before any allocation, a forward over `tokens` tokens that cannot fit. The bound is low on
    purpose: int64 inputs and targets, a bool mask, and the float32 hidden state and logits that meet at the
    output layer; attention and the other layers need more on top."""
    need = tokens * (8 + 8 + 1 + 4 * (cfg["dim"] + cfg["vocab_size"]))
    have = torch.cuda.get_device_properties(device).total_memory if torch.device(device).type == "cuda" \
        else physical_memory()
    if need > have:
        where = device if torch.device(device).type == "cuda" else "this machine"
        raise UsageError(f"{what} needs at least {need / 2 ** 30:,.4g} GiB; {where} has {have / 2 ** 30:,.0f} GiB")


def model_config(cfg: dict) -> lengen.GPTConfig:
    """The model a run's config describes: GPTConfig's fields are config.json keys of the same name."""
    return lengen.GPTConfig(**{f.name: cfg[f.name] for f in dataclasses.fields(lengen.GPTConfig) if f.name in cfg})


def default_name(cfg: dict) -> str:
    parts = [cfg["task"], cfg["encoding"]]
    if cfg["scaling"] != "none":
        parts.append(f"{cfg['scaling']}{cfg['factor']:g}")
    if cfg["positions"] != "contiguous":
        parts.append(cfg["positions"])
    return "-".join(parts + [f"s{cfg['seed']}"])


# ---------------------------------------------------------------------------------------------------------
# Model, optimiser, checkpoint
# ---------------------------------------------------------------------------------------------------------


def make_optimizer(model: lengen.GPT, cfg: dict) -> torch.optim.AdamW:
    """AdamW; weight decay only on 2-D weights, and never on an encoding's own parameters: on a position table
    decay would shrink the rows that training never reaches, and Paper A's pinning is about those rows as
    initialised; T5's, KERPLE's and FIRE's few parameters are the position signal itself."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and not name.startswith("pos.") else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg["wd"]}, {"params": rest, "weight_decay": 0.0}],
                             lr=cfg["lr"], betas=(0.9, 0.98))


def load_run(run_dir: str, device: str = "cpu", **overrides) -> tuple[lengen.GPT, dict]:
    """A trained run's model (eval mode) and its config; `overrides` change model settings, e.g.
    scaling="yarn", factor=4 for inference-time YaRN on a model trained without it."""
    cfg = {**read_config(run_dir), **overrides}
    try:
        model = lengen.GPT(model_config(cfg))
    except (TypeError, ValueError) as e:  # a setting of the wrong type or out of range
        raise UsageError(f"{run_dir}: {e}") from None
    try:
        model.load_state_dict(load_checkpoint(run_dir)["model"])
    except (TypeError, RuntimeError) as e:  # not a state dict, or not this model's
        raise UsageError(f"{run_dir}: checkpoint does not match its config ({str(e).splitlines()[0]})") from None
    return model.to(device).eval(), cfg


# ---------------------------------------------------------------------------------------------------------
# Evaluation: masked accuracy at given lengths (or at given delays, for the delay tasks)
# ---------------------------------------------------------------------------------------------------------


def interval(per_sequence: torch.Tensor) -> tuple[float, float, float]:
    """Mean accuracy over sequences with a 95 % interval: Wilson's when each sequence is right or wrong,
    otherwise mean +- 1.96 standard errors (tokens of one sequence are not independent, so sequences are
    the unit)."""
    n, mean = per_sequence.numel(), float(per_sequence.mean())
    if torch.all((per_sequence == 0) | (per_sequence == 1)):
        z = 1.96
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return mean, max(0.0, centre - half), min(1.0, centre + half)
    half = 1.96 * float(per_sequence.std()) / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


@torch.no_grad()
def evaluate(model: lengen.GPT, task: str, length: int, options: dict, samples: int = 256, seed: int = 1234,
             batch: int | None = None, device: str = "cpu", positions: str = "contiguous",
             max_position: int | None = None) -> dict:
    """Accuracy on `samples` fresh sequences of `length` tokens. Positions are contiguous (inference), or drawn
    by a sampler of lengen.POSITION_SAMPLERS from [0, max_position), as Ruoss et al. evaluate a model trained
    with randomized positions. The sequences depend on `seed` alone: every model meets the same ones."""
    if model.config.encoding == "learned" and length > model.config.max_len:
        raise UsageError(f"length {length} is beyond the learned position table ({model.config.max_len} rows): "
                         "retrain with a larger --max-len")
    if positions != "contiguous" and (max_position or 0) < length:
        raise UsageError(f"--positions {positions}: {length} distinct position ids need a range of at least "
                         f"{length}, got {max_position}")
    generator = torch.Generator().manual_seed(seed)
    where = torch.Generator().manual_seed(seed + 1)  # position ids: a stream of their own
    batch = batch or max(1, min(samples, 2 ** 16 // length))  # about 64K tokens per forward
    scores = []
    for start in range(0, samples, batch):
        x, y, mask = tasks.make_batch(task, min(batch, samples - start), length, generator, **options)
        ids = None if positions == "contiguous" else \
            lengen.POSITION_SAMPLERS[positions](len(x), length, max_position, where).to(device)
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        logits = model(x, ids)
        if not torch.isfinite(logits).all():
            raise UsageError(f"length {length}: the model's outputs are not finite (NaN or inf); no accuracy to "
                             "report")
        right = (logits.argmax(-1) == y) & mask
        scores.append(right.sum(1).float() / mask.sum(1).clamp(min=1))
    mean, lo, hi = interval(torch.cat(scores).cpu())
    return {"length": length, "accuracy": mean, "low": lo, "high": hi, "samples": samples}


def markdown_table(rows: list[dict], key: str = "length") -> str:
    lines = [f"| {key} | accuracy | 95% interval |", "|---:|---:|:---|"]
    lines += [f"| {r[key]} | {r['accuracy']:.3f} | [{r['low']:.3f}, {r['high']:.3f}] |" for r in rows]
    return "\n".join(lines)


def evaluate_table(model: lengen.GPT, cfg: dict, lengths=None, delays=None, samples: int = 256,
                   device: str = "cpu", skip_unfit: bool = False) -> tuple[list[dict], str]:
    """Rows of {length|delay, accuracy, low, high, samples} and the key ("length" or "delay"). Delays keep the
    run's training window; a length or delay the task cannot hold is skipped (skip_unfit) or refused."""
    options = cfg["task_options"]
    if delays is not None and "delays" not in options:
        raise UsageError(f"--delays needs a delay task; '{cfg['task']}' has none (use --lengths)")
    key = "delay" if delays is not None else "length"
    for n in lengths if key == "length" else ():  # before anything is computed
        check_memory(cfg, n, f"length {n}", device)
    rows = []
    for value in delays if delays is not None else lengths:
        length, opts = (cfg["train_len"][1], {**options, "delays": (value,)}) if key == "delay" else (value, options)
        try:
            row = evaluate(model, cfg["task"], length, opts, samples, device=device)
        except ValueError as e:  # the window cannot hold an episode at this delay, or the task this length
            if skip_unfit:
                continue
            raise UsageError(f"{key} {value}: {e}") from None
        rows.append({"delay": value, **row} if key == "delay" else row)
    return rows, key


def final_table(model: lengen.GPT, cfg: dict) -> tuple[list[dict], str]:
    """At the end of training: 1x, 2x, 4x, 8x the longest training length, or, for the delay tasks (fixed
    window), the training delays and unseen ones on either side."""
    hi, options = cfg["train_len"][1], cfg["task_options"]
    if "delays" not in options:
        lengths = [hi * f for f in (1, 2, 4, 8) if not (cfg["encoding"] == "learned" and hi * f > cfg["max_len"])]
        return evaluate_table(model, cfg, lengths, samples=cfg["eval_samples"], device=cfg["device"])
    trained = options["delays"]
    candidates = sorted({0, min(trained) // 2, min(trained), max(trained), max(trained) + 1,
                         2 * max(trained), 4 * max(trained)})
    return evaluate_table(model, cfg, delays=candidates, samples=cfg["eval_samples"], device=cfg["device"],
                          skip_unfit=True)


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------


def restore(out: str, model: lengen.GPT, optimizer, data: torch.Generator, where: torch.Generator) -> tuple:
    """Load the run's checkpoint into the model, the optimiser and the generators; returns its step and its fit
    record. The log is cut back to that step: a run killed after logging past its last checkpoint logs those
    steps again."""
    ckpt = load_checkpoint(out)
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        data.set_state(ckpt["data_rng"])
        where.set_state(ckpt["position_rng"])
        torch.set_rng_state(ckpt["torch_rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UsageError(f"{out}: checkpoint.pt does not fit its config ({str(e).splitlines()[0]})") from None
    path = os.path.join(out, "log.jsonl")
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.endswith("\n") and json.loads(line)["step"] <= ckpt["step"]]
    save_atomic(path, lambda f: f.write("".join(kept).encode()))
    return ckpt["step"], ckpt.get("fit")


def initial_model(cfg: dict) -> lengen.GPT:
    """The model before its first step: initialised from the seed, or with another run's weights (--init)."""
    torch.manual_seed(cfg["seed"])  # model init and dropout
    model = lengen.GPT(model_config(cfg)).to(cfg["device"])
    if cfg["init"]:
        source, _ = load_run(cfg["init"])
        try:
            model.load_state_dict(source.state_dict())
        except RuntimeError as e:
            raise UsageError(f"--init {cfg['init']}: weights do not fit this model ({str(e).splitlines()[0]})") \
                from None
    return model


def draw_batch(cfg: dict, step: int, data: torch.Generator, where: torch.Generator):
    """Step `step`'s batch (x, y, mask) at a length drawn from --train-len, and its position ids (None:
    contiguous); with a curriculum, they come from a range that widens with the step."""
    lo, hi = cfg["train_len"]
    length = int(torch.randint(lo, hi + 1, (1,), generator=data))
    x, y, mask = tasks.make_batch(cfg["task"], cfg["batch"], length, data, **cfg["task_options"])
    if cfg["positions"] == "contiguous":
        return x, y, mask, None
    top = cfg["max_position"]
    if cfg["curriculum"]:
        start, end, shape = cfg["curriculum"]
        top = lengen.LengthCurriculum(start, end, cfg["steps"], shape)(step)
    return x, y, mask, lengen.POSITION_SAMPLERS[cfg["positions"]](cfg["batch"], length, top, where)


# The fit check: "has the model learned its task?" is asked of sequences drawn from a seed of their own, so
# neither the training stream (seed + 1) nor the test set (evaluate's seed 1234), at the longest training
# length, with the positions the model trains with.
FIT_SEED, FIT_SAMPLES = 4321, 128


def fit_accuracy(model: lengen.GPT, cfg: dict) -> float:
    """Accuracy on FIT_SAMPLES held-out sequences at the longest training length, in distribution: with the
    run's own positions (for a sampler, its widest range)."""
    model.eval()
    widest = cfg["curriculum"][1] if cfg["curriculum"] else cfg["max_position"]
    accuracy = evaluate(model, cfg["task"], cfg["train_len"][1], cfg["task_options"], FIT_SAMPLES, seed=FIT_SEED,
                        device=cfg["device"], positions=cfg["positions"], max_position=widest)["accuracy"]
    model.train()
    return accuracy


def read_fit(run_dir: str) -> dict:
    """The fit record of a run trained with --fit-bar: {"bar", "every", "checks": [[step, accuracy], ...],
    "steps_to_fit": the step that reached the bar, or None}."""
    try:
        with open(os.path.join(run_dir, "fit.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        raise UsageError(f"{run_dir}: no readable fit.json (was it trained with --fit-bar?)") from None


def check_fit(model: lengen.GPT, cfg: dict, fit: dict, step: int, log) -> None:
    """With --fit-bar, every --fit-every steps and at the last: the fit check, recorded in fit and the log;
    fit["steps_to_fit"] is the step once the bar is reached (the training loop stops there)."""
    if not fit["bar"] or (step % fit["every"] and step != cfg["steps"]):
        return
    accuracy = fit_accuracy(model, cfg)
    fit["checks"].append([step, round(accuracy, 4)])
    fit["steps_to_fit"] = step if accuracy >= fit["bar"] else None
    log.write(json.dumps({"step": step, "fit_accuracy": round(accuracy, 4)}) + "\n")


def take_step(cfg: dict, step: int, model: lengen.GPT, forward, optimizer, x, y, mask, positions) -> tuple:
    """One optimiser step on a batch (forward: the model, or its compiled twin); returns (loss, logits). A loss
    that is not finite stops training before anything of this step is applied or saved."""
    set_learning_rate(optimizer, step, cfg)
    logits = forward(x, positions)
    loss = F.cross_entropy(logits[mask], y[mask])
    if not torch.isfinite(loss):  # the last checkpoint stands
        raise UsageError(f"loss is {loss.item()} at step {step + 1}: training diverged or the positions "
                         f"overflow --encoding {cfg['encoding']}; nothing of this step was saved")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    model.pos.after_step()  # an encoding's own range (KERPLE's floor on its rates)
    return loss, logits


def train(cfg: dict, on_step=None) -> tuple[lengen.GPT, dict]:
    """Train from cfg (as resolve() or resume_config() made it) in cfg['out'], which the caller holds (hold).
    on_step(step, x, positions) sees every batch fed to the model."""
    use_threads(cfg)
    out = cfg["out"]
    model = initial_model(cfg)
    optimizer = make_optimizer(model, cfg)
    data = torch.Generator().manual_seed(cfg["seed"] + 1)   # lengths and batches
    where = torch.Generator().manual_seed(cfg["seed"] + 2)  # position ids

    def checkpoint(folder: str):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "fit": fit,
                 "data_rng": data.get_state(), "position_rng": where.get_state(), "torch_rng": torch.get_rng_state()}
        save_atomic(os.path.join(folder, "checkpoint.pt"), lambda f: torch.save(state, f))

    # with --fit-bar: every check as [step, accuracy], and the step that reached the bar (None until then)
    fit = {"bar": cfg.get("fit_bar"), "every": cfg.get("fit_every"), "checks": [], "steps_to_fit": None}
    if cfg["resume"]:
        (step, saved_fit), folder = restore(out, model, optimizer, data, where), out
        fit = saved_fit or fit
    else:
        # Everything that can be checked before training has passed. The new run is built beside --out, and
        # takes its place with the checkpoint of its first step: a run that fails at once replaces nothing.
        step, folder = 0, prepare_run_dir(cfg)
        write_config(folder, cfg)
        open_log(folder, fresh=True).close()
    # Ctrl-C and SIGTERM only raise a flag: the step in flight completes, so the checkpoint is exactly a step
    # boundary and --resume continues bit for bit.
    with signals_deferred() as stop, open_log(folder, fresh=False) as log, \
            tqdm(total=cfg["steps"], initial=step, disable=cfg["quiet"], desc=os.path.basename(out)) as bar:
        model.train()
        forward = torch.compile(model) if cfg.get("compile") else model  # same parameters, fused kernels
        tick, tokens = time.perf_counter(), 0
        while step < cfg["steps"] and fit["steps_to_fit"] is None:
            x, y, mask, positions = draw_batch(cfg, step, data, where)
            if on_step:
                on_step(step, x, positions)
            x, y, mask = x.to(cfg["device"]), y.to(cfg["device"]), mask.to(cfg["device"])
            loss, logits = take_step(cfg, step, model, forward, optimizer, x, y, mask, positions)
            step += 1
            tokens += x.numel()
            if step % 10 == 0 or step == cfg["steps"]:
                acc = float((logits[mask].argmax(-1) == y[mask]).float().mean())
                rate = tokens / (time.perf_counter() - tick)
                log.write(json.dumps({"step": step, "loss": round(loss.item(), 5), "acc": round(acc, 4),
                                      "lr": learning_rate(step - 1, cfg), "tokens_per_s": round(rate)}) + "\n")
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}", tok_s=f"{rate:,.0f}")
            bar.update(1)
            check_fit(model, cfg, fit, step, log)
            if step % cfg["save_every"] == 0 or step == cfg["steps"] or stop or folder != out or fit["steps_to_fit"]:
                checkpoint(folder)
                if folder != out:  # the new run's first step has passed: now it replaces what --out held
                    swap_in(folder, out)
                    folder = out
            if stop:
                raise Interrupted(f"interrupted by {signal.Signals(stop[0]).name} at step {step}; checkpoint "
                                  f"saved: continue with python train.py --resume --out {out}")
    if fit["bar"]:  # what the caller reads: fitted at which step, or not within --steps
        save_atomic(os.path.join(out, "fit.json"), lambda f: f.write(json.dumps(fit).encode()))
    model.eval()
    return model, cfg


def given_flags(argv: list[str] | None) -> dict:
    """The options typed on the command line, with their values: a default is not among them."""
    parser, unset = build_parser(), object()
    parser.set_defaults(**dict.fromkeys(vars(parser.parse_args([])), unset))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not unset}


def run(argv: list[str] | None = None, on_step=None) -> dict:
    """The whole command: parse, train, print the final table; returns {"run": dir, "rows": [...]}."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:  # the same in every process of a launch
        e.everywhere = True
        raise
    for key, value in (finetune.DEFAULTS if args.llm else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.llm:
        return finetune.run(args, parser, on_step)
    if dist.launched():
        refused = UsageError("torchrun spreads an LLM fine-tune (--llm) over processes; a small GPT trains in one "
                             "(many at once: python eval.py --experiment NAME --jobs N)")
        refused.everywhere = True
        raise refused
    if args.resume:
        cfg = resume_config(args, given_flags(argv))
        check_resumed(cfg)
    else:
        try:
            cfg = resolve(args, parser)
        except (ValueError, RuntimeError) as e:  # the task's and the model's own checks
            raise UsageError(str(e)) from None
    with hold(cfg["out"]):
        model, cfg = train(cfg, on_step)
        if not cfg["eval_samples"]:  # the caller measures the model itself
            return {"run": cfg["out"], "rows": []}
        rows, key = final_table(model, cfg)
        save_atomic(os.path.join(cfg["out"], "final.json"), lambda f: f.write(json.dumps(rows, indent=1).encode()))
    if not cfg["quiet"]:
        print(f"\n{cfg['out']}: trained on {key}s " +
              (f"{cfg['train_len'][0]}..{cfg['train_len'][1]}" if key == "length"
               else ",".join(map(str, cfg["task_options"]["delays"]))))
        print(markdown_table(rows, key))
    return {"run": cfg["out"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    # A scheduler's SIGTERM (preemption) is a Ctrl-C: the same clean stop and message wherever it lands.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run(argv)
        sys.stdout.flush()  # a closed pipe (| head) shows here, inside the try, rather than at exit
    except UsageError as e:
        if not (e.everywhere and dist.launch_rank() != 0):  # under torchrun, said once
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # outside the training loop: nothing is left half-written
        print("train.py: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        closed_stdout("train.py")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
