"""Train one small GPT on one task and measure it beyond its training length; the command line of both trainers
(`--llm` hands a Hugging Face causal LM over to finetune.py, with the same flags).

    python train.py --task retrieval --offset 3 --encoding rope --train-len 8:24 --steps 2000
    python train.py --task copy --encoding rope --scaling yarn --factor 8 --original-len 32 \\
                    --positions randomized --curriculum 32:256 --init runs/copy-pretrained
    python train.py --llm smollm2 --method ryarn --train-len 512 --steps 100     # finetune.py

In reading order: the model and its optimizer; a batch and its position ids; one step; the fit check ("has it
learned its task?"); the loop; the command; and last the command line and its checks, which turn the flags
into a RunConfig (runs.py: one documented field per flag, saved as the run's config.json).

A run lives in runs/NAME/: config.json, checkpoint.pt (written to a temporary file, flushed, then renamed, so a
kill never leaves half a checkpoint), log.jsonl (one line per logged step), final.json (the accuracy table
printed at the end) and, with --fit-bar, fit.json. `--resume` continues a run from its checkpoint and ends
with the same numbers as an uninterrupted run; Ctrl-C or SIGTERM finishes the step in flight, saves and
stops; a new run replaces --out only once its first checkpoint is written. runs.RunFolder does that
choreography; runs.hold turns away a second train.py on the same run.
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

if __name__ == "__main__":  # Ctrl-C while torch and the rest load (a second or more): one line, as later
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, b"train.py: interrupted\n"), os._exit(130)))

import torch
import torch.nn.functional as F
from tqdm import tqdm

import dist
import finetune
import lengen
import tasks
import text_tasks
from eval import evaluate, final_table, load_run, markdown_table, mismatch, model_config
from runs import (MAX_SAMPLES, Interrupted, Parser, RunConfig, RunFolder, UsageError, check_fit_flags, check_machine,
                  check_memory, check_optimizer, check_runtime, cli_main, cut_log, finite, fit_due, fit_record, hold,
                  int_range, int_set, load_checkpoint, made_by_record, physical_memory, record_fit, refuse_unused,
                  resume_config, save_atomic)


# Defaults of a small GPT trained from scratch; an LLM fine-tune has its own (finetune.DEFAULTS).
DEFAULTS = {"train_len": (8, 24), "steps": 1000, "lr": 1e-3, "warmup": 100, "batch": 32, "factor": 1.0}

# ---------------------------------------------------------------------------------------------------------
# The model and its optimizer
# ---------------------------------------------------------------------------------------------------------


def initial_model(cfg: RunConfig) -> lengen.GPT:
    """The model before its first step: initialised from the seed, or with another run's weights (--init)."""
    torch.manual_seed(cfg.seed)  # model init and dropout
    model = lengen.GPT(model_config(cfg)).to(cfg.device)
    if cfg.init and not cfg.resume:  # a resumed run's weights are its checkpoint's
        source, trained = load_run(cfg.init)
        try:
            model.load_state_dict(source.state_dict())
        except RuntimeError:
            differ = [k for k in SHAPE_FLAGS if getattr(trained, k) != getattr(cfg, k)
                      and (k != "max_len" or "learned" in (cfg.encoding, trained.encoding))]
            raise UsageError(f"--init {cfg.init}: its weights do not fit this model "
                             f"({mismatch(model, source.state_dict())}); it was trained with "
                             f"{', '.join(flag(k, getattr(trained, k)) for k in differ)}, this run has "
                             f"{', '.join(flag(k, getattr(cfg, k)) for k in differ)}") from None
    return model


# The settings that size a model's weights: an --init run must share them.
SHAPE_FLAGS = ("layers", "dim", "heads", "no_mlp", "encoding", "max_len", "vocab_size")


def flag(key: str, value) -> str:
    """A setting as the command line gives it: --dim 32, --no-mlp, no --no-mlp; the vocabulary by its size."""
    if key == "vocab_size":
        return f"a vocabulary of {value} (the task and its options)"
    name = "--" + key.replace("_", "-")
    return (name if value else f"no {name}") if isinstance(value, bool) else f"{name} {value}"


def make_optimizer(model: lengen.GPT, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on 2-D weights, and never on an encoding's own parameters: on a position table
    decay would shrink the rows that training never reaches, and Paper A's pinning is about those rows as
    initialised; T5's, KERPLE's and FIRE's few parameters are the position signal itself."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and not name.startswith("pos.") else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.98))


# ---------------------------------------------------------------------------------------------------------
# A batch and its position ids
# ---------------------------------------------------------------------------------------------------------


def draw_batch(cfg: RunConfig, step: int, data_rng: torch.Generator, position_rng: torch.Generator):
    """Step `step`'s batch (x, y, mask) at a length drawn from --train-len, and its position ids (None:
    contiguous), drawn from [0, max_position); with a curriculum, from a range that widens with the step."""
    lo, hi = cfg.train_len
    length = int(torch.randint(lo, hi + 1, (1,), generator=data_rng))
    x, y, mask = tasks.make_batch(cfg.task, cfg.batch, length, data_rng, **cfg.task_options)
    if cfg.positions == "contiguous":
        return x, y, mask, None
    max_position = cfg.max_position
    if cfg.curriculum:
        start, end, shape = cfg.curriculum
        max_position = lengen.LengthCurriculum(start, end, cfg.steps, shape)(step)
    return x, y, mask, lengen.POSITION_SAMPLERS[cfg.positions](cfg.batch, length, max_position, position_rng)


# ---------------------------------------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------------------------------------


# The learning rate at every step, as nanoGPT's get_lr: a linear warm-up, then a cosine decay to a tenth of the
# peak. The LLM fine-tune (finetune.py) is handed set_learning_rate, so both loops follow one schedule.
def learning_rate(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def set_learning_rate(optimizer: torch.optim.Optimizer, step: int, lr: float, warmup: int, steps: int) -> None:
    """Every parameter group (decayed and not) at this step's learning rate."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, lr, warmup, steps)


def take_step(cfg: RunConfig, step: int, model: lengen.GPT, forward, optimizer, x, y, mask, positions) -> tuple:
    """One optimizer step on a batch (forward: the model, or its compiled twin); returns (loss, logits). A loss
    that is not finite stops training before anything of this step is applied or saved."""
    set_learning_rate(optimizer, step, cfg.lr, cfg.warmup, cfg.steps)
    logits = forward(x, positions)
    loss = F.cross_entropy(logits[mask], y[mask])
    if not torch.isfinite(loss):  # the last checkpoint stands
        raise UsageError(f"loss is {loss.item()} at step {step + 1}: training diverged or the positions "
                         f"overflow --encoding {cfg.encoding}; nothing of this step was saved")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    model.pos.after_step()  # an encoding's own range (KERPLE's floor on its rates)
    return loss, logits


# ---------------------------------------------------------------------------------------------------------
# Has the model learned its task? The fit check (--fit-bar)
# ---------------------------------------------------------------------------------------------------------

# "Has the model learned its task?" is asked of sequences drawn from a seed of their own, so neither the
# training stream (seed + 1) nor the test set (eval.evaluate's seed 1234), at the longest training length,
# with the positions the model trains with.
FIT_SEED, FIT_SAMPLES = 4321, 128


def fit_accuracy(model: lengen.GPT, cfg: RunConfig) -> float:
    """Accuracy on FIT_SAMPLES held-out sequences at the longest training length, in distribution: with the
    run's own positions (for a sampler, its widest range)."""
    model.eval()
    widest = cfg.curriculum[1] if cfg.curriculum else cfg.max_position
    accuracy = evaluate(model, cfg.task, cfg.train_len[1], cfg.task_options, FIT_SAMPLES, seed=FIT_SEED,
                        device=cfg.device, positions=cfg.positions, max_position=widest)["accuracy"]
    model.train()
    return accuracy


# The out-of-range check (--fit-far) is a curve over training, not a result: few sequences keep it cheap, and
# they come from the fit check's own seed.
FAR_SAMPLES = 64


def far_task(cfg: RunConfig, far: int) -> tuple[str, int, dict, int]:
    """What --fit-far measures, as (task, length, options, score_from): a delay task at delay `far` in its
    training window (a mixed_copy model on its C episodes alone, the task it shares with a delay_copy model, as
    Paper D measures transfer); any other task at `far` tokens, scoring only the answers at index >= the
    longest training length (those no training sequence reached)."""
    if "delays" not in cfg.task_options:
        return cfg.task, far, cfg.task_options, cfg.train_len[1]
    task = "delay_copy" if cfg.task == "mixed_copy" else cfg.task
    options = {k: v for k, v in cfg.task_options.items() if k != "selective_delays"}
    return task, cfg.train_len[1], {**options, "delays": (far,)}, 0


def far_accuracy(model: lengen.GPT, cfg: RunConfig) -> float:
    """Accuracy on FAR_SAMPLES held-out sequences out of range (far_task), with the run's own positions."""
    model.eval()
    task, length, options, score_from = far_task(cfg, cfg.fit_far)
    widest = cfg.curriculum[1] if cfg.curriculum else cfg.max_position
    accuracy = evaluate(model, task, length, options, FAR_SAMPLES, seed=FIT_SEED, device=cfg.device,
                        positions=cfg.positions, max_position=widest, score_from=score_from)["accuracy"]
    model.train()
    return accuracy


def check_fit(model: lengen.GPT, cfg: RunConfig, fit: dict, step: int, run: RunFolder) -> None:
    """With --fit-bar, every --fit-every steps and at the last: the fit check, recorded in fit and the log;
    fit["steps_to_fit"] is the step when this check reached the bar (the training loop stops there, unless
    --no-fit-stop). With --fit-far, the same check measures out of range too."""
    if fit_due(fit, step, cfg.steps):
        far = far_accuracy(model, cfg) if cfg.fit_far is not None else None
        run.log(record_fit(fit, step, fit_accuracy(model, cfg), far))


def stops(cfg: RunConfig, fit: dict) -> bool:
    """Whether training ends here, before --steps: the fit check reached the bar, and the run stops there."""
    return cfg.fit_stop and fit["steps_to_fit"] is not None


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------


def train(cfg: RunConfig, on_step=None) -> lengen.GPT:
    """Train from cfg (as resolve() or resume_config() made it) in cfg.out, which the caller holds (hold);
    returns the model in eval mode. on_step(step, x, positions) sees every batch fed to the model."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = initial_model(cfg)
    optimizer = make_optimizer(model, cfg)
    data_rng = torch.Generator().manual_seed(cfg.seed + 1)      # lengths and batches
    position_rng = torch.Generator().manual_seed(cfg.seed + 2)  # position ids
    step, fit = 0, fit_record(cfg.fit_bar, cfg.fit_every, cfg.fit_stop, cfg.fit_far)
    if cfg.resume:
        step, fit = restore(cfg.out, model, optimizer, data_rng, position_rng, fit)
    with RunFolder(cfg.out, cfg.saved(), cfg.resume, cfg.force) as run, \
            tqdm(total=cfg.steps, initial=step, disable=cfg.quiet, desc=os.path.basename(cfg.out)) as bar:
        model.train()
        forward = torch.compile(model) if cfg.compile else model  # same parameters, fused kernels
        tick, tokens = time.perf_counter(), 0
        while step < cfg.steps and not stops(cfg, fit):
            x, y, mask, positions = draw_batch(cfg, step, data_rng, position_rng)
            if on_step:
                on_step(step, x, positions)
            x, y, mask = x.to(cfg.device), y.to(cfg.device), mask.to(cfg.device)
            loss, logits = take_step(cfg, step, model, forward, optimizer, x, y, mask, positions)
            step += 1
            tokens += x.numel()
            if step % 10 == 0 or step == cfg.steps:
                acc = float((logits[mask].argmax(-1) == y[mask]).float().mean())
                rate = tokens / (time.perf_counter() - tick)
                run.log({"step": step, "loss": round(loss.item(), 5), "acc": round(acc, 4),
                         "lr": learning_rate(step - 1, cfg.lr, cfg.warmup, cfg.steps), "tokens_per_s": round(rate)})
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}", tok_s=f"{rate:,.0f}")
            bar.update(1)
            check_fit(model, cfg, fit, step, run)
            if step % cfg.save_every == 0 or step == cfg.steps or run.stop or not run.started or stops(cfg, fit):
                run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                                     "fit": fit, "data_rng": data_rng.get_state(),
                                     "position_rng": position_rng.get_state(), "torch_rng": torch.get_rng_state()})
            if run.stop:
                raise Interrupted(f"interrupted by {signal.Signals(run.stop[0]).name} at step {step}; checkpoint "
                                  f"saved: continue with python train.py --resume --out {cfg.out}")
        if fit["bar"]:  # what the caller reads: fitted at which step, or not within --steps
            run.save("fit.json", json.dumps(fit).encode())
    return model.eval()


def restore(out: str, model: lengen.GPT, optimizer, data_rng: torch.Generator, position_rng: torch.Generator,
            fit: dict) -> tuple[int, dict]:
    """Load the run's checkpoint into the model, the optimizer and the generators; returns its step and its fit
    record (`fit` for a run saved without one). The log is cut back to that step: a run killed after logging
    past its last checkpoint logs those steps again."""
    ckpt = load_checkpoint(out)
    try:
        model.load_state_dict(ckpt["model"])
    except (TypeError, RuntimeError, AttributeError):  # not a state dict, or not this model's: config.json edited?
        raise UsageError(f"{out}: checkpoint.pt does not fit its config.json ({mismatch(model, ckpt['model'])}); "
                         "put back the config.json it was saved with, or start again with --force") from None
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
        data_rng.set_state(ckpt["data_rng"])
        position_rng.set_state(ckpt["position_rng"])
        torch.set_rng_state(ckpt["torch_rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UsageError(f"{out}: checkpoint.pt does not fit its config ({str(e).splitlines()[0]})") from None
    cut_log(out, ckpt["step"])
    return ckpt["step"], ckpt.get("fit") or fit


# ---------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------


def run(argv: list[str] | None = None, on_step=None) -> dict:
    """The whole command: parse, train, print the final table; returns {"run": dir, "rows": [...], "cpu_s": the
    training's CPU seconds} (an LLM fine-tune: finetune.run's)."""
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
        return finetune.run(args, parser, set_learning_rate, on_step)
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
    with hold(cfg.out):
        since = time.process_time()
        model = train(cfg, on_step)
        rows, key = final_table(model, cfg) if cfg.eval_samples else ([], None)  # 0: the caller measures it
        if cfg.eval_samples:
            save_atomic(os.path.join(cfg.out, "final.json"), lambda f: f.write(json.dumps(rows, indent=1).encode()))
        # Last, once the run is whole: what an experiment reuses the run by (common.train_once), so that a model
        # trained from its recorded command, here or on a cluster's node, is never trained again.
        made_by = made_by_record(sys.argv[1:] if argv is None else argv, time.process_time() - since)
        save_atomic(os.path.join(cfg.out, "made-by.json"), lambda f: f.write(json.dumps(made_by).encode()))
    if cfg.eval_samples and not cfg.quiet:
        print(f"\n{cfg.out}: trained on {key}s " + (f"{cfg.train_len[0]}..{cfg.train_len[1]}" if key == "length"
                                                     else ",".join(map(str, cfg.task_options["delays"]))))
        print(markdown_table(rows, key))
    return {"run": cfg.out, "rows": rows, "cpu_s": made_by["cpu_s"]}


def main(argv: list[str] | None = None) -> int:
    return cli_main("train.py", run, argv)


# ---------------------------------------------------------------------------------------------------------
# The command line, and the checks that turn it into a RunConfig
# ---------------------------------------------------------------------------------------------------------


def curriculum_spec(text: str) -> tuple[int, int, str]:
    """'32:256' or '32:256:cosine' -> (32, 256, shape): the range widens from 32 to 256, linearly by default."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
        raise argparse.ArgumentTypeError(f"expected START:END[:{'|'.join(lengen.LengthCurriculum.SHAPES)}], "
                                         f"got '{text}'")
    shape = parts[2] if len(parts) == 3 else "linear"
    if shape not in lengen.LengthCurriculum.SHAPES:
        raise argparse.ArgumentTypeError(f"unknown curriculum shape '{shape}'")
    if not 0 < int(parts[0]) <= int(parts[1]):
        raise argparse.ArgumentTypeError(f"expected 0 < START <= END, got '{text}'")
    return int(parts[0]), int(parts[1]), shape


# Task options the command line knows; each task takes the ones in its signature (tasks.task_options).
TASK_FLAGS = {"symbols": int, "offset": int, "m": int, "keys": int, "values": int, "statements": int, "fillers": int,
              "hops": int, "chains": int, "delays": int_set, "selective_delays": int_set}


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
    add_model_arguments(p.add_argument_group("model"))
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
    add_run_arguments(p.add_argument_group("run"))
    finetune.add_arguments(p)
    return p


def add_model_arguments(model) -> None:
    model.add_argument("--encoding", default="rope", choices=tuple(lengen.ENCODINGS))
    model.add_argument("--layers", type=int, default=2)
    model.add_argument("--heads", type=int, default=2)
    model.add_argument("--dim", type=int, default=64)
    model.add_argument("--no-mlp", action="store_true", help="attention-only blocks")
    model.add_argument("--attention", default="softmax", choices=("softmax", "linear"))
    model.add_argument("--linear-normalised", action="store_true")
    model.add_argument("--rope-base", type=finite, default=10000.0)
    model.add_argument("--alibi-slope-heads", type=int, default=None, metavar="N",
                       help="ALiBi: the slopes its paper gives N heads, evenly spaced over --heads (a multiple of "
                            "it; default --heads: the paper's rule, which for 2 heads is nearly flat)")
    model.add_argument("--scaling", default="none", choices=tuple(lengen.SCALINGS))
    model.add_argument("--factor", type=finite, default=None,
                       help=f"rotary scaling factor s (>= 1; default {DEFAULTS['factor']:g}; --llm yarn/ryarn: "
                            f"{finetune.YARN_FACTOR:g}, and s = 1 is refused)")
    model.add_argument("--original-len", type=int, default=None,
                       help="the length L a scaling stretches (default: the longest training length)")
    model.add_argument("--max-len", type=int, default=None,
                       help="rows of a learned position table (default: 8x the longest training length)")


def add_run_arguments(run) -> None:
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
    run.add_argument("--fit-stop", action=argparse.BooleanOptionalAction, default=True,
                     help="stop at the first fit check that reaches --fit-bar (default); --no-fit-stop trains every "
                          "--steps and judges the fit by the last check (an equal budget for models compared)")
    run.add_argument("--fit-far", type=int, default=None, metavar="N",
                     help="each fit check also measures out of range: at N tokens (answers beyond the training "
                          "length), or for a delay task at delay N (fit.json's far)")
    run.add_argument("--eval-samples", type=int, default=256,
                     help="sequences per length in the final table (0: no final table)")
    run.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def given_flags(argv: list[str] | None) -> dict:
    """The options typed on the command line, with their values: a default is not among them."""
    parser, unset = build_parser(), object()
    parser.set_defaults(**dict.fromkeys(vars(parser.parse_args([])), unset))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not unset}


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RunConfig:
    """The parsed command line, checked, with every default resolved: the run's RunConfig."""
    args.task = args.task or "retrieval"
    if args.task in text_tasks.TEXT_TASKS:
        raise UsageError(f"'{args.task}' is a text task for an LLM: add --llm smollm2 (or another model)")
    refuse_unused(args, parser, finetune.LLM_ONLY, lambda flag: "is for --llm runs")
    refuse_ignored(args, parser)
    check_runtime(args)
    hi = args.train_len[1]
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    cfg = RunConfig(**{**{k: v for k, v in vars(args).items() if k in fields},
                       "task_options": task_options(args), "vocab_size": 0, "out": args.out or "",
                       "original_len": hi if args.original_len is None else args.original_len,
                       "max_len": 8 * hi if args.max_len is None else args.max_len,
                       "max_position": 8 * hi if args.max_position is None else args.max_position})
    check_positions(cfg)
    check_numbers(cfg)
    cfg.vocab_size = tasks.vocab_size(cfg.task, **cfg.task_options)
    check_weights(cfg)
    check_memory(cfg.dim, cfg.vocab_size, cfg.batch * hi, f"a batch of {cfg.batch} x {hi} tokens", cfg.device)
    for n in cfg.train_len:  # the task fits every training length
        tasks.make_batch(cfg.task, 1, n, torch.Generator(), **cfg.task_options)
    check_far(cfg)
    lengen.GPT(model_config(cfg))  # the model is buildable: bad combinations fail here, before anything is written
    cfg.out = cfg.out or os.path.join("runs", default_name(cfg))
    return cfg


def refuse_ignored(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """A setting this run would accept and then ignore is refused, with what it needs to mean something."""
    check_fit_flags(args, parser)
    ignored = {"max_position": (args.positions == "contiguous", "bounds sampled position ids: give --positions "
                                + "|".join(s for s in lengen.POSITION_SAMPLERS if s != "contiguous")),
               "max_len": (args.encoding != "learned", f"sizes a learned position table, not {args.encoding}'s"),
               "rope_base": (args.encoding not in ("rope", "xpos"), f"sets rotary frequencies, not {args.encoding}'s"),
               "alibi_slope_heads": (args.encoding != "alibi", f"sets ALiBi's slopes, not {args.encoding}'s"),
               "original_len": (args.scaling == "none", "is the length a rotary scaling stretches: give --scaling")}
    for flag, (unused, why) in ignored.items():
        if unused and getattr(args, flag) != parser.get_default(flag):
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag):g} {why}")


def task_options(args: argparse.Namespace) -> dict:
    """The task's own settings: the TASK_FLAGS given, over the task's defaults (tasks.task_options)."""
    given = {k: v for k, v in vars(args).items() if k in TASK_FLAGS and v is not None}
    accepted = tasks.task_options(args.task)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise UsageError(f"task '{args.task}' takes no --{unknown[0].replace('_', '-')} "
                         f"(it takes: {', '.join(accepted) or 'nothing'})")
    for key, value in given.items():
        if isinstance(value, int) and value < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be >= 1")
    return {**accepted, **given}


def check_positions(cfg: RunConfig) -> None:
    """The position ids training will draw: a sampler can draw them all, the encoding can take them."""
    hi = cfg.train_len[1]
    widest = cfg.curriculum[1] if cfg.curriculum else cfg.max_position if cfg.positions != "contiguous" else hi
    if cfg.positions != "contiguous":
        start = cfg.curriculum[0] if cfg.curriculum else cfg.max_position
        if start < hi:
            raise UsageError(f"--positions {cfg.positions} draws {hi} distinct ids from [0, {start}): "
                             f"--max-position / curriculum start must be >= the training length {hi}")
        try:  # the sampler can draw from the widest range it will be given (not only from the first)
            lengen.POSITION_SAMPLERS[cfg.positions](1, hi, widest, torch.Generator())
        except (ValueError, RuntimeError) as e:
            raise UsageError(f"--positions {cfg.positions} up to {widest:,}: {e}") from None
    elif cfg.curriculum:
        raise UsageError("--curriculum widens the range of sampled positions: use it with --positions "
                         f"{'|'.join(s for s in lengen.POSITION_SAMPLERS if s != 'contiguous')}")
    if cfg.encoding == "xpos" and widest > lengen.XPos(2).max_span:
        raise UsageError(f"--encoding xpos stays finite for positions spanning at most {lengen.XPos(2).max_span:,}; "
                         f"these reach {widest:,} (lower --max-position or the curriculum's end)")
    if cfg.encoding == "learned" and widest > cfg.max_len:
        raise UsageError(f"positions reach {widest} but the learned table has {cfg.max_len} rows (raise --max-len)")


def check_numbers(cfg: RunConfig) -> None:
    """Sizes, counts and the rotary settings, each in its range."""
    if cfg.fit_bar is not None and not 0 < cfg.fit_bar <= 1:
        raise UsageError(f"--fit-bar {cfg.fit_bar:g}: an accuracy in (0, 1]")
    for flag in ("steps", "batch", "save_every", "layers", "heads", "dim", "max_len", "fit_every"):
        if getattr(cfg, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if not 0 <= cfg.eval_samples <= MAX_SAMPLES:
        raise UsageError(f"--eval-samples must be >= 0 and at most {MAX_SAMPLES:,}")
    if cfg.rope_base <= 1:
        raise UsageError("--rope-base must be > 1 (rotary frequencies are base^(-2i/d))")
    # the slopes of at most 64x the heads: finer spacing of the same 2^-8..2^-8/N span says nothing new, and
    # 1e8 of them took minutes to list
    if cfg.alibi_slope_heads is not None and not 1 <= cfg.alibi_slope_heads <= 64 * cfg.heads:
        raise UsageError(f"--alibi-slope-heads must be >= 1 and at most {64 * cfg.heads} (64 x --heads)")
    if cfg.scaling == "none" and cfg.factor != 1:
        raise UsageError(f"--factor {cfg.factor:g} stretches a rotary scaling: give --scaling "
                         f"{'|'.join(s for s in lengen.SCALINGS if s != 'none')} with it")
    if cfg.original_len < 1:
        raise UsageError(f"--original-len {cfg.original_len}: the length a model was trained at is >= 1")


def check_far(cfg: RunConfig) -> None:
    """--fit-far: a place the check can measure beyond training (far_task), refused before the first step rather
    than at the first check: a length past the training length that the positions and the task can hold, or a
    delay the training window holds."""
    if cfg.fit_far is None:
        return
    task, length, options, score_from = far_task(cfg, cfg.fit_far)
    widest = cfg.curriculum[1] if cfg.curriculum else cfg.max_position
    if "delays" not in cfg.task_options and cfg.fit_far <= cfg.train_len[1]:
        raise UsageError(f"--fit-far {cfg.fit_far}: a length beyond the training length {cfg.train_len[1]}")
    if cfg.encoding == "learned" and length > cfg.max_len:
        raise UsageError(f"--fit-far {cfg.fit_far} is beyond the learned table's {cfg.max_len} rows (raise --max-len)")
    if cfg.positions != "contiguous" and length > widest:
        raise UsageError(f"--fit-far {cfg.fit_far}: {length} distinct position ids need a range of at least "
                         f"{length}, not {widest}")
    check_memory(cfg.dim, cfg.vocab_size, length, f"--fit-far {cfg.fit_far}", cfg.device)
    try:
        x, _, mask = tasks.make_batch(task, 1, length, torch.Generator(), **options)
    except ValueError as e:
        raise UsageError(f"--fit-far {cfg.fit_far}: {e}") from None
    if not mask[:, score_from:].any():
        raise UsageError(f"--fit-far {cfg.fit_far}: {task} has no answer beyond the training length there")


def check_weights(cfg: RunConfig) -> None:
    """Refuse, before the model is built (a million layers took minutes, then all memory), weights that cannot
    fit: per layer 4 dim^2 of attention and 8 dim^2 of MLP, the embedding, output and position tables; and for
    each weight its gradient and AdamW's two moments. A lower bound, as check_memory's."""
    per_layer = (4 + (0 if cfg.no_mlp else 8)) * cfg.dim ** 2
    table = cfg.max_len if cfg.encoding == "learned" else 0
    weights = cfg.layers * per_layer + (2 * cfg.vocab_size + table) * cfg.dim
    need, have = 16 * weights, physical_memory()
    if need > have:
        raise UsageError(f"--layers {cfg.layers:,} x --dim {cfg.dim:,}: the weights and AdamW's state need at least "
                         f"{need / 2 ** 30:,.4g} GiB; this machine has {have / 2 ** 30:,.0f} GiB")


def check_resumed(cfg: RunConfig) -> None:
    """What --resume reads from a config.json that may have been edited by hand (its types checked as it was read,
    runs.check_saved_types): every setting in the range the command line allows, a task that holds its training
    lengths, a model that can be built; and the machine has its device (say --device cpu to continue a GPU run
    here)."""
    try:
        check_optimizer(cfg)
        check_numbers(cfg)
        check_positions(cfg)
        check_weights(cfg)
        for n in cfg.train_len:
            tasks.make_batch(cfg.task, 1, n, torch.Generator(), **cfg.task_options)
        lengen.GPT(model_config(cfg))
    except (UsageError, TypeError, ValueError) as e:
        raise UsageError(f"{cfg.out}/config.json: {e}") from None
    check_machine(cfg.device, cfg.threads)


def default_name(cfg: RunConfig) -> str:
    parts = [cfg.task, cfg.encoding]
    if cfg.scaling != "none":
        parts.append(f"{cfg.scaling}{cfg.factor:g}")
    if cfg.positions != "contiguous":
        parts.append(cfg.positions)
    return "-".join(parts + [f"s{cfg.seed}"])


if __name__ == "__main__":
    sys.exit(main())
