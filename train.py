"""Train one small GPT on one task and measure it beyond its training length (train), or fine-tune a Hugging
Face causal LM on short text-task samples with one of Paper R's methods (train_llm, with --llm).

    python train.py --task retrieval --offset 3 --encoding rope --train-len 8:24 --steps 2000
    python train.py --task copy --encoding rope --scaling yarn --factor 8 --original-len 32 \\
                    --positions randomized --curriculum 32:256 --init runs/copy-pretrained
    python train.py --llm smollm2 --method ryarn --train-len 512 --steps 100     # hf.py does the HF side
    torchrun --nproc_per_node 4 train.py --llm DIR --method ryarn --fsdp        # dist.py: DDP or FSDP2

A small-GPT run lives in runs/NAME/: config.json (every setting), checkpoint.pt (written to a temporary file,
flushed to the disk, then renamed, so a kill never leaves half a checkpoint), log.jsonl (one line per logged
step) and final.json (the accuracy table printed at the end). `--resume` continues a run from its checkpoint and
ends with the same numbers as an uninterrupted run. Ctrl-C or SIGTERM (a scheduler preempting the job) finishes
the current step, saves a checkpoint and stops. An LLM run writes config.json, log.jsonl and model/
(save_pretrained, with its rope settings); both kinds share one skeleton: threads, the run folder, config.json,
the log, the learning-rate schedule. A new run of either kind is built in a hidden folder beside runs/NAME and
swapped in once it is whole (a small GPT's step-0 checkpoint, an LLM's saved model), so that a run which fails
takes nothing with it; a lock turns away a second train.py on the same run (runs.py holds that machinery).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
import lengen
import tasks
import text_tasks
from runs import (Interrupted, UsageError, beside, closed_stdout, hold, load_checkpoint, open_log,
                  prepare_run_dir, read_config, resume_config, save_atomic, signals_deferred, swap_in,
                  write_config)


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


# Paper R's methods on an LLM: (YaRN schedule, randomized positions). Evaluation uses contiguous positions.
LLM_METHODS = {"ft": (False, False), "yarn": (True, False), "rpe": (False, True), "ryarn": (True, True)}

# Defaults that differ between a small GPT trained from scratch and an LLM being fine-tuned.
DEFAULTS = {"small": {"train_len": (8, 24), "steps": 1000, "lr": 1e-3, "warmup": 100, "batch": 32, "factor": 1.0},
            "llm": {"train_len": (512, 512), "steps": 100, "lr": 2e-5, "warmup": 10, "batch": 1}}
# YaRN's factor s when an LLM run uses YaRN (yarn, ryarn) and --factor is not given: 4, Qwen2.5's usual
# long-context setting (Paper R does not report its s). s = 1 would be YaRN doing nothing, so it is refused.
LLM_YARN_FACTOR = 4.0
# Randomized positions on an LLM: the range tops out at this multiple of the training sample length, and
# widens in Paper R's stages (its one reported schedule, 8K -> 10K -> 12K -> 16K -> 16K for data under 8K).
LLM_RANGE, LLM_RANGE_SHAPE = 2.0, "paper-r"


def build_parser() -> Parser:
    p = Parser(description="Train one small GPT on one task, or fine-tune an LLM with --llm (see README).")
    p.add_argument("--task", default=None, choices=sorted(tasks.TASKS) + sorted(text_tasks.TEXT_TASKS),
                   help="default: retrieval (small GPT), babilong (--llm)")
    p.add_argument("--train-len", type=int_range, default=None, metavar="N|LOW:HIGH",
                   help="sequence length, or a range drawn from per batch (default 8:24; --llm: 512)")
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
    model.add_argument("--scaling", default="none", choices=tuple(lengen.SCHEDULES))
    model.add_argument("--factor", type=finite, default=None,
                       help="rotary scaling factor s (>= 1; default 1; --llm yarn/ryarn: 4, and s = 1 is refused)")
    model.add_argument("--original-len", type=int, default=None,
                       help="the length L a schedule stretches (default: the longest training length)")
    model.add_argument("--max-len", type=int, default=None,
                       help="rows of a learned position table (default: 8x the longest training length)")
    pos = p.add_argument_group("positions")
    pos.add_argument("--positions", default="contiguous", choices=tuple(lengen.POSITION_SAMPLERS))
    pos.add_argument("--max-position", type=int, default=None,
                     help="sample position ids from [0, this) (default: 8x the longest training length)")
    pos.add_argument("--curriculum", type=curriculum_spec, default=None, metavar="START:END[:SHAPE]",
                     help="widen the position range from START to END over training")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--steps", type=int, default=None, help="default 1000 (--llm: 40)")
    opt.add_argument("--batch", type=int, default=None,
                     help="sequences per step (default 32; --llm: samples per process and backward, default 1, "
                          "each its own forward)")
    opt.add_argument("--lr", type=finite, default=None, help="peak learning rate (default 1e-3; --llm: 2e-5)")
    opt.add_argument("--wd", type=finite, default=0.0, help="AdamW weight decay on 2-D weights")
    opt.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 100; --llm: 4)")
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
    run.add_argument("--eval-samples", type=int, default=256,
                     help="sequences per length in the final table (0: no final table)")
    run.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    llm = p.add_argument_group("LLM (Paper R on a Hugging Face causal LM)")
    llm.add_argument("--llm", default=None, metavar="smollm2|DIR|FILE.gguf|HUB_ID",
                     help="fine-tune this model instead of a small GPT")
    llm.add_argument("--method", default=None, choices=tuple(LLM_METHODS), help="default: ryarn")
    llm.add_argument("--range", type=float, default=None, metavar="MULT",
                     help=f"rpe/ryarn: positions are drawn from [0, MULT x the sample length) (default {LLM_RANGE:g}, "
                          "Paper R's proportion)")
    llm.add_argument("--range-shape", default=None, choices=lengen.LengthCurriculum.SHAPES,
                     help=f"rpe/ryarn: how the range widens from 1x to MULT x the sample length (default "
                          f"{LLM_RANGE_SHAPE}: 1, 1.25, 1.5, 2, 2 x for MULT 2, in equal stages)")
    llm.add_argument("--no-curriculum", action="store_true",
                     help="rpe/ryarn: the ablation: draw from the whole range from the first step")
    llm.add_argument("--lora", type=int, default=None, metavar="R", help="LoRA rank (needs peft)")
    llm.add_argument("--bf16", action="store_true",
                     help="bfloat16 autocast on the CPU too (always on CUDA): ~3x faster on a CPU with AVX-512 BF16")
    llm.add_argument("--facts", type=int, default=None, help="babilong: 1, 2 or 3 supporting facts")
    llm.add_argument("--grad-accum", type=int, default=1, metavar="K",
                     help="backwards per optimizer step: the global batch is batch x K x processes")
    llm.add_argument("--fsdp", action="store_true",
                     help="under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP")
    return p


# ---------------------------------------------------------------------------------------------------------
# Settings: the parsed command line, checked, with every default resolved, is the run's config.json.
# ---------------------------------------------------------------------------------------------------------


def refuse_unused(args: argparse.Namespace, parser: argparse.ArgumentParser, flags, why) -> None:
    """Options the run would ignore are refused, not silently dropped: why(flag) says what they are for."""
    for flag in sorted(flags):
        if getattr(args, flag) != parser.get_default(flag):
            raise UsageError(f"--{flag.replace('_', '-')} {why(flag)}")


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    args.task = args.task or "retrieval"
    if args.task in text_tasks.TEXT_TASKS:
        raise UsageError(f"'{args.task}' is a text task for an LLM: add --llm smollm2 (or another model)")
    refuse_unused(args, parser, LLM_ONLY, lambda flag: "is for --llm runs")
    check_runtime(args)
    cfg = {k: v for k, v in vars(args).items() if k not in LLM_ONLY | {"llm"}}
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
    elif args.curriculum:
        raise UsageError("--curriculum widens the range of sampled positions: use it with --positions "
                         "randomized, stretch or pose")
    if args.encoding == "learned" and needed > cfg["max_len"]:
        raise UsageError(f"positions reach {needed} but the learned table has {cfg['max_len']} rows "
                         "(raise --max-len)")
    for flag in ("steps", "batch", "save_every", "layers", "heads", "dim", "max_len"):
        if cfg[flag] < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if cfg["eval_samples"] < 0:
        raise UsageError("--eval-samples must be >= 0")
    if cfg["rope_base"] <= 1:
        raise UsageError("--rope-base must be > 1 (rotary frequencies are base^(-2i/d))")
    cfg["vocab_size"] = tasks.vocab_size(args.task, **cfg["task_options"])
    check_memory(cfg, cfg["batch"] * hi, f"a batch of {cfg['batch']} x {hi} tokens", args.device)
    for n in (lo, hi):  # the task fits every training length
        tasks.make_batch(args.task, 1, n, torch.Generator(), **cfg["task_options"])
    lengen.GPT(model_config(cfg))  # the model is buildable: bad combinations fail here, before anything is written
    cfg["out"] = args.out or os.path.join("runs", default_name(cfg))
    return cfg


def check_runtime(args: argparse.Namespace) -> None:
    """Settings every run shares: optimiser numbers, the seed, threads, device."""
    if args.lr <= 0 or args.wd < 0 or args.warmup < 0:
        raise UsageError("--lr must be > 0, --wd and --warmup >= 0")
    if not -2 ** 63 <= args.seed < 2 ** 63:  # torch seeds are 64-bit
        raise UsageError(f"--seed must fit in a signed 64-bit integer, got {args.seed}")
    check_machine(args.device, args.threads)


def check_machine(device: str, threads: int | None) -> None:
    """--device and --threads, for train.py and eval.py."""
    if threads is not None and threads < 1:
        raise UsageError("--threads must be >= 1")
    try:
        where = torch.device(device)
    except RuntimeError:
        raise UsageError(f"unknown --device '{device}' (cpu, cuda, cuda:1, mps)") from None
    count = {"cpu": 1, "cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}
    if (where.index or 0) >= count.get(where.type, 0):
        raise UsageError(f"--device {device}, but this machine has no such device")


def check_memory(cfg: dict, tokens: int, what: str, device: str) -> None:
    """Refuse, before any allocation, a forward over `tokens` tokens that cannot fit. The bound is low on
    purpose: int64 inputs and targets, a bool mask, and the float32 hidden state and logits that meet at the
    output layer; attention and the other layers need more on top."""
    need = tokens * (8 + 8 + 1 + 4 * (cfg["dim"] + cfg["vocab_size"]))
    have = torch.cuda.get_device_properties(device).total_memory if torch.device(device).type == "cuda" \
        else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        where = device if torch.device(device).type == "cuda" else "this machine"
        raise UsageError(f"{what} needs at least {need / 2 ** 30:,.4g} GiB; {where} has {have / 2 ** 30:,.0f} GiB")


def model_config(cfg: dict) -> lengen.GPTConfig:
    return lengen.GPTConfig(
        vocab_size=cfg["vocab_size"], n_layer=cfg["layers"], n_head=cfg["heads"], d_model=cfg["dim"],
        mlp=not cfg["no_mlp"], encoding=cfg["encoding"], rope_base=cfg["rope_base"], scaling=cfg["scaling"],
        factor=cfg["factor"], original_max_len=cfg["original_len"], attention=cfg["attention"],
        linear_normalised=cfg["linear_normalised"], max_len=cfg["max_len"])


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


def learning_rate(step: int, cfg: dict) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    t = (step - cfg["warmup"]) / max(1, cfg["steps"] - cfg["warmup"])
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def set_learning_rate(optimizer: torch.optim.Optimizer, step: int, cfg: dict) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, cfg)


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
             batch: int | None = None, device: str = "cpu") -> dict:
    """Accuracy on `samples` fresh sequences of `length` tokens, contiguous positions (inference)."""
    if model.config.encoding == "learned" and length > model.config.max_len:
        raise UsageError(f"length {length} is beyond the learned position table ({model.config.max_len} rows): "
                         "retrain with a larger --max-len")
    generator = torch.Generator().manual_seed(seed)
    batch = batch or max(1, min(samples, 2 ** 16 // length))  # about 64K tokens per forward
    scores = []
    for start in range(0, samples, batch):
        x, y, mask = tasks.make_batch(task, min(batch, samples - start), length, generator, **options)
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        right = (model(x).argmax(-1) == y) & mask
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


def use_threads(cfg: dict) -> None:
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])


def restore(out: str, model: lengen.GPT, optimizer, data: torch.Generator, where: torch.Generator) -> int:
    """Load the run's checkpoint into the model, the optimiser and the generators; returns its step. The log
    is cut back to that step: a run killed after logging past its last checkpoint logs those steps again."""
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
    return ckpt["step"]


def train(cfg: dict, on_step=None) -> tuple[lengen.GPT, dict]:
    """Train from cfg (as resolve() or resume_config() made it) in cfg['out'], which the caller holds (hold).
    on_step(step, x, positions) sees every batch fed to the model."""
    use_threads(cfg)
    out = cfg["out"]
    torch.manual_seed(cfg["seed"])  # model init and dropout
    model = lengen.GPT(model_config(cfg)).to(cfg["device"])
    if cfg["init"]:
        source, _ = load_run(cfg["init"])
        try:
            model.load_state_dict(source.state_dict())
        except RuntimeError as e:
            raise UsageError(f"--init {cfg['init']}: weights do not fit this model ({str(e).splitlines()[0]})") \
                from None
    optimizer = make_optimizer(model, cfg)
    data = torch.Generator().manual_seed(cfg["seed"] + 1)   # lengths and batches
    where = torch.Generator().manual_seed(cfg["seed"] + 2)  # position ids

    def checkpoint(folder: str):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "data_rng": data.get_state(), "position_rng": where.get_state(), "torch_rng": torch.get_rng_state()}
        save_atomic(os.path.join(folder, "checkpoint.pt"), lambda f: torch.save(state, f))

    sampler = lengen.POSITION_SAMPLERS[cfg["positions"]]
    curriculum = lengen.LengthCurriculum(*cfg["curriculum"][:2], cfg["steps"], cfg["curriculum"][2]) \
        if cfg["curriculum"] else None
    lo, hi = cfg["train_len"]
    if cfg["resume"]:
        step = restore(out, model, optimizer, data, where)
    else:
        # Everything that can fail before training has passed. The new run, with a checkpoint at step 0 (so that
        # it can be resumed from its first step), is built beside --out and only then takes its place.
        step = 0
        new = prepare_run_dir(cfg)
        write_config(new, cfg)
        checkpoint(new)
        open_log(new, fresh=True).close()
        swap_in(new, out)
    # Ctrl-C and SIGTERM only raise a flag: the step in flight completes, so the checkpoint is exactly a step
    # boundary and --resume continues bit for bit.
    with signals_deferred() as stop, open_log(out, fresh=False) as log, \
            tqdm(total=cfg["steps"], initial=step, disable=cfg["quiet"], desc=os.path.basename(out)) as bar:
        model.train()
        forward = torch.compile(model) if cfg.get("compile") else model  # same parameters, fused kernels
        tick, tokens = time.perf_counter(), 0
        while step < cfg["steps"]:
            length = int(torch.randint(lo, hi + 1, (1,), generator=data))
            x, y, mask = tasks.make_batch(cfg["task"], cfg["batch"], length, data, **cfg["task_options"])
            positions = None
            if cfg["positions"] != "contiguous":
                top = curriculum(step) if curriculum else cfg["max_position"]
                positions = sampler(cfg["batch"], length, top, where)
            if on_step:
                on_step(step, x, positions)
            x, y, mask = x.to(cfg["device"]), y.to(cfg["device"]), mask.to(cfg["device"])
            set_learning_rate(optimizer, step, cfg)
            logits = forward(x, positions)
            loss = F.cross_entropy(logits[mask], y[mask])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            tokens += x.numel()
            if step % 10 == 0 or step == cfg["steps"]:
                acc = float((logits[mask].argmax(-1) == y[mask]).float().mean())
                rate = tokens / (time.perf_counter() - tick)
                log.write(json.dumps({"step": step, "loss": round(loss.item(), 5), "acc": round(acc, 4),
                                      "lr": learning_rate(step - 1, cfg), "tokens_per_s": round(rate)}) + "\n")
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}", tok_s=f"{rate:,.0f}")
            bar.update(1)
            if step % cfg["save_every"] == 0 or step == cfg["steps"] or stop:
                checkpoint(out)
            if stop:
                raise Interrupted(f"interrupted by {signal.Signals(stop[0]).name} at step {step}; checkpoint "
                                  f"saved: continue with python train.py --resume --out {out}")
    model.eval()
    return model, cfg


# ---------------------------------------------------------------------------------------------------------
# Fine-tuning a Hugging Face causal LM (Paper R); hf.py loads it and puts the schedule in
# ---------------------------------------------------------------------------------------------------------

# The options only an LLM run reads; and those both kinds read. --llm refuses every other one rather than
# ignore it, and a small-GPT run refuses these.
LLM_ONLY = {"method", "no_curriculum", "range", "range_shape", "lora", "facts", "bf16", "grad_accum", "fsdp"}
LLM_FLAGS = LLM_ONLY | {"llm", "task", "train_len", "steps", "batch", "lr", "wd", "warmup", "seed", "factor", "out",
                        "force", "resume", "device", "threads", "quiet"}


def resolve_llm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    check_runtime(args)
    refuse_unused(args, parser, set(vars(args)) - LLM_FLAGS, lambda flag: "is for small-GPT runs, not --llm" + (
        ", --method chooses the schedule and positions" if flag in ("positions", "curriculum", "scaling", "encoding",
                                                                    "max_position") else ""))
    cfg = dict(vars(args))
    cfg["method"] = args.method or "ryarn"
    yarn, randomized = LLM_METHODS[cfg["method"]]
    if not yarn and args.factor is not None:
        raise UsageError(f"--factor is YaRN's: --method {cfg['method']} uses none (yarn and ryarn do)")
    if not randomized:
        refuse_unused(args, parser, ("range", "range_shape", "no_curriculum"),
                      lambda flag: f"is for randomized positions: --method {cfg['method']} uses contiguous ones")
    if yarn and args.factor is not None and args.factor <= 1:
        raise UsageError(f"--factor {args.factor:g}: YaRN with s <= 1 is plain RoPE; give s > 1 "
                         f"(default {LLM_YARN_FACTOR:g})")
    cfg["factor"] = (args.factor or LLM_YARN_FACTOR) if yarn else 1.0
    cfg["range"] = args.range if args.range is not None else LLM_RANGE
    cfg["range_shape"] = args.range_shape or LLM_RANGE_SHAPE
    if not cfg["range"] >= 1:
        raise UsageError(f"--range {cfg['range']:g}: the range must hold the sample (>= 1 x its length)")
    cfg["task"] = args.task or "babilong"
    if cfg["task"] not in text_tasks.TEXT_TASKS:
        raise UsageError(f"--llm trains on a text task ({', '.join(text_tasks.TEXT_TASKS)}), not '{cfg['task']}'")
    options = {"facts": args.facts} if args.facts is not None else {}
    text_tasks.make_text_sample(cfg["task"], 10 ** 6, 0, len, **options)  # unknown options fail here
    cfg["task_options"] = options
    if args.train_len[0] != args.train_len[1]:
        raise UsageError("--llm takes one --train-len N (tokens per training sample)")
    for flag in ("steps", "batch", "grad_accum"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.lora is not None and importlib.util.find_spec("peft") is None:
        raise UsageError("--lora needs peft: pip install peft")
    if args.fsdp and not dist.launched():
        raise UsageError("--fsdp shards the model over several processes: start them with torchrun "
                         "--nproc_per_node N train.py ...")
    if args.fsdp and not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        raise UsageError(f"--fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard): torch >= 2.6, not {torch.__version__}")
    if args.fsdp and args.lora:
        raise UsageError("--fsdp is for full fine-tuning; LoRA trains a few weights beside a frozen model: "
                         "leave --fsdp out (DDP)")
    cfg["out"] = args.out or os.path.join("runs", f"llm-{cfg['method']}-s{args.seed}")
    return cfg


def train_llm(cfg: dict, on_step=None):
    """Fine-tune a Hugging Face causal LM on short text-task samples with one of Paper R's methods; the loss
    is on the answer tokens only. Saves the model (with its rope settings) and the tokenizer in cfg['out'].
    Under a launcher (torchrun) every process runs this; rank 0 alone writes (dist.py says how it spreads)."""
    import hf  # imports transformers: only here, on the LLM path
    use_threads(cfg)
    device = dist.start(cfg["device"])
    lead = dist.rank() == 0
    model, tokenizer = hf.load_llm(cfg["llm"], device)
    if not hf.rotary_modules(model):
        raise UsageError(f"{type(model).__name__} has no rotary embedding with inv_freq: lengen cannot patch it")
    head_dim, base, original = hf.rope_geometry(model)
    n = cfg["train_len"][1]
    if n > original:
        raise UsageError(f"--train-len {n} is beyond the model's context of {original} tokens")
    try:  # the sample length holds the task's question and facts
        hf.text_sample(tokenizer, cfg["task"], n, 0, cfg["task_options"])
    except ValueError as e:
        raise UsageError(f"--train-len {n}: {e}") from None
    out = prepare_run_dir(cfg) if lead else None  # only now, when everything has been checked, is anything written
    yarn, randomized = LLM_METHODS[cfg["method"]]
    B, K, W = cfg["batch"], cfg["grad_accum"], dist.world()
    cfg.update(scaling="yarn" if yarn else "none", original_len=original, processes=W, global_batch=B * K * W)
    hf.apply_llm_rope(model, cfg["scaling"], cfg["factor"])
    # Randomized positions: n sorted distinct ids from [0, M) for an n-token sample. M is a multiple of the
    # sample length: it widens from 1x to range x (Paper R's stages by default), or is range x from the first
    # step with --no-curriculum. Every process computes the same M from the step.
    top = int(round(cfg["range"] * n))
    curriculum = lengen.LengthCurriculum(n, top, cfg["steps"], cfg["range_shape"]) if not cfg["no_curriculum"] \
        else None
    cuda = torch.device(device).type == "cuda"
    if cuda:
        hf.checkpoint_activations(model)
    torch.manual_seed(cfg["seed"])  # LoRA's initial weights, dropout
    if cfg["lora"]:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=cfg["lora"], lora_alpha=2 * cfg["lora"],
                                                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model = dist.wrap(model, cfg["fsdp"], device)
    params = [p for p in model.parameters() if p.requires_grad]  # under FSDP2, this process's shards
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg["wd"])
    where = torch.Generator().manual_seed(cfg["seed"] + 2)
    if lead:
        write_config(out, cfg)
    log = open_log(out, fresh=True) if lead else None
    bar = tqdm(range(cfg["steps"]), disable=cfg["quiet"] or not lead, desc=os.path.basename(cfg["out"]))
    model.train()
    tick, tokens = time.perf_counter(), 0
    for step in bar:
        set_learning_rate(optimizer, step, cfg)
        optimizer.zero_grad(set_to_none=True)
        M = curriculum(step) if curriculum else top
        losses, highest = [], 0
        # A step takes the global batch, B x K x W samples, each its own forward (samples differ in length;
        # nothing is padded). Process r's k-th backward takes samples j = (k W + r) B .. + B - 1. Positions
        # are drawn from one stream in the order of j, whoever trains the sample, so that samples and
        # positions do not depend on how the batch is split (hf.step_samples says what that costs).
        ours = [(j // B) % W == dist.rank() for j in range(B * K * W)]
        try:
            samples = hf.step_samples(tokenizer, cfg, step, ours, randomized)
        except ValueError as e:  # checked on sample 0 above, but a later sample's facts may take more tokens
            raise UsageError(f"--train-len {n}: step {step}: {e}") from None
        for j, sample in enumerate(samples):
            if sample is not None:
                T = sample[0].shape[1]
                positions = lengen.randomized_positions(1, T, max(T, M), where) if randomized else torch.arange(T)[None]
                samples[j] = (*sample, positions)
        mine = [sample for sample, our in zip(samples, ours) if our]
        for i, (ids, n_prompt, positions) in enumerate(mine):
            if on_step:
                on_step(step, ids, positions)
            ids, positions = ids.to(device), positions.to(device)
            with dist.gradient_sync(model, sync=i == len(mine) - 1):
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=cuda or cfg["bf16"]):
                    logits = hf.answer_logits(model, ids, positions, n_prompt)
                loss = F.cross_entropy(logits[0], ids[0, n_prompt:])
                # the mean over the global batch: the processes average their gradients, so each divides by
                # the samples it trains
                (loss / len(mine)).backward()
            losses.append(loss.item())
            highest = max(highest, int(positions.max()))
            tokens += ids.shape[1]
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)  # of the global batch's gradient, before clipping
        optimizer.step()
        loss_sum, all_tokens = dist.total([sum(losses), tokens])
        highest = int(dist.total([highest], "max")[0])
        rate = all_tokens / (time.perf_counter() - tick)
        loss, norm = loss_sum / (B * K * W), dist.local(norm).item()
        if lead:
            log.write(json.dumps({"step": step + 1, "loss": round(loss, 5), "range": M if randomized else None,
                                  "max_position": highest, "grad_norm": round(norm, 6),
                                  "tokens_per_s": round(rate)}) + "\n")
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
    model = dist.unwrap(model)
    if cfg["lora"]:
        model = model.merge_and_unload()
    state = dist.full_state(model)  # every process takes part in gathering the shards
    if lead:
        log.close()
        model.save_pretrained(os.path.join(out, "model"), state_dict=state)
        tokenizer.save_pretrained(os.path.join(out, "model"))
    return model.eval(), tokenizer, cfg


def given_flags(argv: list[str] | None) -> dict:
    """The options typed on the command line, with their values: a default is not among them."""
    parser, unset = build_parser(), object()
    parser.set_defaults(**dict.fromkeys(vars(parser.parse_args([])), unset))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not unset}


def run(argv: list[str] | None = None, on_step=None) -> dict:
    """The whole command: parse, train, print the final table; returns {"run": dir, "rows": [...]}."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for key, value in DEFAULTS["llm" if args.llm else "small"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.llm:
        if args.resume:
            raise UsageError("--resume is for small-GPT runs; an LLM run is short: start it again with --force")
        try:
            cfg = resolve_llm(args, parser)
        except (ValueError, RuntimeError) as e:
            raise UsageError(str(e)) from None
        # Under a launcher only rank 0 holds and writes the run. A check that fails on rank 0 alone (the run
        # is held, or exists) ends that process, and the launcher then ends the others (so nothing waits for
        # the process group to be left: that would wait forever for the others).
        lead = dist.launch_rank() == 0
        with hold(cfg["out"]) if lead else contextlib.nullcontext():
            model, tokenizer, cfg = train_llm(cfg, on_step)  # builds the run beside --out (prepare_run_dir)
            if lead:
                swap_in(beside(cfg["out"], "new"), cfg["out"])
        dist.stop()
        if lead and not cfg["quiet"]:
            print(f"saved {cfg['out']}/model ({cfg['method']}); measure it with: python eval.py {cfg['out']}")
        return {"run": cfg["out"], "rows": []}
    if dist.launched():
        raise UsageError("torchrun spreads an LLM fine-tune (--llm) over processes; a small GPT trains in one "
                         "(many at once: python eval.py --experiment NAME --jobs N)")
    if args.resume:
        cfg = resume_config(args, given_flags(argv))
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


if __name__ == "__main__":  # run as the importable module, so that hf.py and experiments/ share its classes
    sys.exit(importlib.import_module("train").main())
