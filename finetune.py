"""Fine-tune a Hugging Face causal LM on short text-task samples with one of Paper R's methods, then hand the
model to eval.py for long prompts. This is what `python train.py --llm ...` runs: train.py parses one command
line for both kinds of run (add_arguments adds the flags only an LLM run reads; each kind refuses the other's) and
hands over here (run); hf.py loads the model and puts the rotary scaling into it; dist.py spreads the work under
torchrun; runs.py keeps the run folder safe.

    python train.py --llm smollm2 --method ryarn --train-len 512 --steps 100
    torchrun --nproc_per_node 4 train.py --llm DIR --method ryarn --fsdp        # DDP, or FSDP2 with --fsdp

Paper R's four methods are two switches, YaRN's scaling and randomized positions (METHODS). A run writes
config.json (LLMConfig.saved), log.jsonl, fit.json under --fit-bar, and model/ (save_pretrained, with its rope
settings, so that Hugging Face itself reloads it as YaRN). Importing this file never imports transformers:
hf.load_llm does, when a model is loaded.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import shutil
import time
import warnings

import torch
import torch.nn.functional as F
from tqdm import tqdm

import dist
import hf
import lengen
import text_tasks
from hf import YARN_FACTOR  # YaRN's s where yarn or ryarn is not given --factor
from runs import (RUNTIME_KEYS, UsageError, check_fit_flags, check_out, check_runtime, check_weights, cut_log,
                  fit_due, fit_record, hold, open_log, physical_memory, prepare_run_dir, record_fit, refuse_unused,
                  save_atomic, saved_settings, swap_in, write_config)


# Paper R's methods: (YaRN scaling, randomized positions). Evaluation always uses contiguous positions.
METHODS = {"ft": (False, False), "yarn": (True, False), "rpe": (False, True), "ryarn": (True, True)}

# Defaults of an LLM fine-tune where they differ from a small GPT's (train.DEFAULTS).
DEFAULTS = {"train_len": (512, 512), "steps": 100, "lr": 2e-5, "warmup": 10, "batch": 1}
# Randomized positions: the range tops out at this multiple of the training sample length, and widens in
# the stages a secondary digest gives Paper R (8K -> 10K -> 12K -> 16K -> 16K for data under 8K).
RANGE, RANGE_SHAPE = 2.0, "paper-r"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags only an LLM run reads, added to train.py's command line."""
    llm = parser.add_argument_group("LLM (Paper R on a Hugging Face causal LM)")
    llm.add_argument("--llm", default=None, metavar="smollm2|DIR|FILE.gguf|HUB_ID",
                     help="fine-tune this model instead of a small GPT")
    llm.add_argument("--method", default=None, choices=tuple(METHODS), help="default: ryarn")
    llm.add_argument("--range", type=float, default=None, metavar="MULT",
                     help=f"rpe/ryarn: positions are drawn from [0, MULT x the sample length) (default {RANGE:g}, "
                          "Paper R's proportion)")
    llm.add_argument("--range-shape", default=None, choices=lengen.LengthCurriculum.SHAPES,
                     help=f"rpe/ryarn: how the range widens from 1x to MULT x the sample length (default "
                          f"{RANGE_SHAPE}: 1, 1.25, 1.5, 2, 2 x for MULT 2, in equal stages)")
    llm.add_argument("--no-curriculum", action="store_true",
                     help="rpe/ryarn: the ablation: draw from the whole range from the first step")
    llm.add_argument("--lora", type=int, default=None, metavar="R", help="LoRA rank (needs peft)")
    llm.add_argument("--bf16", action="store_true",
                     help="bfloat16 autocast on the CPU too (always on CUDA): ~3x faster on a CPU with bfloat16 "
                          "instructions (AVX-512 BF16, AMX), 4-5x slower on one without")
    llm.add_argument("--facts", type=int, default=None, help="babilong: bAbI task qa1 to qa5 (1-3: supporting facts)")
    llm.add_argument("--grad-accum", type=int, default=1, metavar="K",
                     help="backwards per optimizer step: the global batch is batch x K x processes")
    llm.add_argument("--fit-prompts", type=int, default=None, metavar="N",
                     help=f"with --fit-bar: held-out prompts the fit check answers (default {FIT_PROMPTS}); more "
                          "make a bar that one prompt cannot tip")
    llm.add_argument("--fsdp", action="store_true",
                     help="under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP")
    llm.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                     help="save the trained weights and the optimizer's state every N steps (checkpoint.pt), so "
                          "that --resume goes on from there after a kill (one process; default: none)")


# The options only an LLM run reads; and those both kinds read. --llm refuses every other one rather than
# ignore it, and a small-GPT run refuses these.
LLM_ONLY = {"method", "no_curriculum", "range", "range_shape", "lora", "facts", "bf16", "grad_accum", "fsdp",
            "fit_prompts", "checkpoint_every"}
LLM_FLAGS = LLM_ONLY | {"llm", "task", "train_len", "steps", "batch", "lr", "wd", "warmup", "seed", "factor", "out",
                        "force", "resume", "device", "threads", "quiet", "fit_bar", "fit_every", "fit_stop"}


@dataclasses.dataclass
class LLMConfig:
    """An LLM fine-tune's settings: train.py --llm's command line, checked, with every default resolved (resolve),
    saved as the run's config.json (saved). One name each: the field, the flag (--range-shape) and the key."""
    # the model and its rotary scaling
    llm: str                            # smollm2, a model directory, a .gguf file or a hub id (hf.load_llm)
    method: str                         # a name in METHODS: YaRN's scaling, randomized positions, both or neither
    scaling: str                        # "yarn" or "none", as the method says (hf.apply_llm_rope)
    factor: float                       # YaRN's s (1: none)
    # randomized positions (rpe, ryarn): ids drawn from [0, the range's end), widened by a curriculum
    range: float                        # the range's end once widest, as a multiple of the sample length
    range_shape: str                    # how the curriculum widens it, a name in lengen.LengthCurriculum.SHAPES
    no_curriculum: bool                 # the ablation: the whole range from the first step
    # the task (text_tasks.py)
    task: str                           # a name in text_tasks.TEXT_TASKS
    task_options: dict                  # its own settings (--facts)
    facts: int | None                   # babilong's supporting facts, as given (task_options holds it)
    train_len: tuple[int, int]          # (n, n): n tokens per training sample
    # optimisation
    steps: int
    batch: int                          # samples per process and backward, each its own forward
    grad_accum: int                     # backwards per optimizer step
    lr: float                           # peak: linear warm-up, cosine decay to a tenth (train.learning_rate)
    wd: float                           # AdamW weight decay
    warmup: int
    seed: int                           # samples from seed * 1,000,003 + i; LoRA's init; seed + 2 the position ids
    lora: int | None                    # LoRA rank (peft); None: a full fine-tune
    bf16: bool                          # bfloat16 autocast on the CPU too (always on CUDA)
    fsdp: bool                          # under torchrun: FSDP2's shards instead of DDP
    # the run
    out: str                            # its folder
    device: str
    threads: int | None                 # torch CPU threads
    fit_bar: float | None               # stop once held-out exact match at n reaches it (fit.json)
    fit_every: int                      # steps between fit checks
    fit_stop: bool                      # False (--no-fit-stop): train every step, the fit judged at the last
    fit_prompts: int                    # the held-out prompts each fit check answers
    checkpoint_every: int | None        # steps between checkpoints (checkpoint.pt), None: none
    # train.py's whole command line as parsed, the small-GPT flags at their defaults (--llm refuses them):
    # config.json holds every flag, in the command line's order, as it always has (saved)
    command: dict = dataclasses.field(repr=False)
    # set by train, once the model is loaded and the processes have started
    original_len: int | None = None     # the model's own context L (hf.rope_geometry)
    processes: int | None = None        # how many train together (torchrun's world size; 1 without it)
    global_batch: int | None = None     # samples per optimizer step: batch x grad_accum x processes
    # how this command runs it, never saved
    quiet: bool = False
    force: bool = False
    resume: bool = False

    def saved(self) -> dict:
        """What config.json holds: train.py's flags in their order, this run's value for each the run has, then
        what only the run knows (task_options, processes, global_batch)."""
        mine = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "command"}
        flags = {k: mine.pop(k, v) for k, v in self.command.items()}
        return {k: v for k, v in {**flags, **mine}.items() if k not in RUNTIME_KEYS}


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LLMConfig:
    """The parsed command line of `train.py --llm`, checked, with every default resolved: the run's config."""
    check_runtime(args)
    refuse_unused(args, parser, set(vars(args)) - LLM_FLAGS, lambda flag: "is for small-GPT runs, not --llm" + (
        ", --method chooses the scaling and positions" if flag in ("positions", "curriculum", "scaling", "encoding",
                                                                    "max_position") else ""))
    method = args.method or "ryarn"
    yarn, randomized = METHODS[method]
    if not yarn and args.factor is not None:
        raise UsageError(f"--factor is YaRN's: --method {method} uses none (yarn and ryarn do)")
    if not randomized:
        refuse_unused(args, parser, ("range", "range_shape", "no_curriculum"),
                      lambda flag: f"is for randomized positions: --method {method} uses contiguous ones")
    if yarn and args.factor is not None and args.factor <= 1:
        raise UsageError(f"--factor {args.factor:g}: YaRN with s <= 1 is plain RoPE; give s > 1 "
                         f"(default {YARN_FACTOR:g})")
    cfg = LLMConfig(
        llm=args.llm, method=method, scaling="yarn" if yarn else "none",
        factor=(args.factor or YARN_FACTOR) if yarn else 1.0, range=args.range if args.range is not None else RANGE,
        range_shape=args.range_shape or RANGE_SHAPE, no_curriculum=args.no_curriculum, task=args.task or "babilong",
        task_options={"facts": args.facts} if args.facts is not None else {}, facts=args.facts,
        train_len=args.train_len, steps=args.steps, batch=args.batch, grad_accum=args.grad_accum, lr=args.lr,
        wd=args.wd, warmup=args.warmup, seed=args.seed, lora=args.lora, bf16=args.bf16, fsdp=args.fsdp,
        out=args.out or os.path.join("runs", f"llm-{method}-s{args.seed}"), device=args.device,
        threads=args.threads, fit_bar=args.fit_bar, fit_every=args.fit_every, fit_stop=args.fit_stop,
        fit_prompts=args.fit_prompts or FIT_PROMPTS, checkpoint_every=args.checkpoint_every,
        command=dict(vars(args)), quiet=args.quiet, force=args.force, resume=args.resume)
    if not cfg.range >= 1:
        raise UsageError(f"--range {cfg.range:g}: the range must hold the sample (>= 1 x its length)")
    if not cfg.range * cfg.train_len[1] < 2 ** 53:  # inf and nan too; positions are exact integers below that
        raise UsageError(f"--range {cfg.range:g}: positions up to {cfg.range:g} x {cfg.train_len[1]} tokens "
                         "cannot be drawn (keep the range below 2^53 positions)")
    if args.no_curriculum and args.range_shape is not None:
        raise UsageError("--range-shape is how the curriculum widens the range; --no-curriculum has none")
    if cfg.task not in text_tasks.TEXT_TASKS:
        raise UsageError(f"--llm trains on a text task ({', '.join(text_tasks.TEXT_TASKS)}), not '{cfg.task}'")
    text_tasks.make_text_sample(cfg.task, 10 ** 6, 0, len, **cfg.task_options)  # unknown options fail here
    if args.train_len[0] != args.train_len[1]:
        raise UsageError("--llm takes one --train-len N (tokens per training sample)")
    check_step_size(args)
    check_fit_flags(args, parser)
    if args.fit_prompts is not None and (args.fit_bar is None or args.fit_prompts < 1):
        raise UsageError(f"--fit-prompts {args.fit_prompts}: how many prompts the fit check answers, >= 1, "
                         "with --fit-bar")
    return cfg


def check_step_size(args: argparse.Namespace) -> None:
    """The batch, its accumulation and its spread over processes (DDP, FSDP2, LoRA), before anything is loaded."""
    for flag in ("steps", "batch", "grad_accum"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    # A step's global batch is tokenized up front: its ids and positions alone (int64) must fit in memory.
    samples = args.batch * args.grad_accum * int(os.environ.get("WORLD_SIZE", "1"))
    need, have = samples * args.train_len[1] * 16, physical_memory()
    if need > have:
        raise UsageError(f"--batch {args.batch} x --grad-accum {args.grad_accum}: a step of {samples:,} samples of "
                         f"{args.train_len[1]} tokens needs {need / 2 ** 30:,.4g} GiB for its token ids alone; "
                         f"this machine has {have / 2 ** 30:,.0f} GiB")
    if args.lora is not None and args.lora < 1:
        raise UsageError(f"--lora {args.lora}: a LoRA rank is >= 1 (leave --lora out for a full fine-tune)")
    if args.lora is not None and importlib.util.find_spec("peft") is None:
        raise UsageError("--lora needs peft: pip install peft")
    if args.checkpoint_every is not None and (args.checkpoint_every < 1 or dist.launched()):
        raise UsageError(f"--checkpoint-every {args.checkpoint_every}: steps between checkpoints, >= 1, in one "
                         "process (not yet under torchrun)")
    if args.fsdp and not dist.launched():
        raise UsageError("--fsdp shards the model over several processes: start them with torchrun "
                         "--nproc_per_node N train.py ...")
    if args.fsdp and not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        raise UsageError("--fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard): torch >= 2.6, not "
                         f"{torch.__version__}")
    if args.fsdp and args.lora:
        raise UsageError("--fsdp is for full fine-tuning; LoRA trains a few weights beside a frozen model: "
                         "leave --fsdp out (DDP)")


def load_checked(cfg: LLMConfig, device: str):
    """The model and tokenizer, once they are known to suit the run: a rotary model whose context holds the
    training samples, and samples that hold the task (its question and facts) at --train-len."""
    model, tokenizer = hf.load_llm(cfg.llm, device)
    if not hf.rotary_modules(model):
        raise UsageError(f"{type(model).__name__} has no rotary embedding with inv_freq: lengen cannot patch it")
    original, n = hf.rope_geometry(model)[2], cfg.train_len[1]
    width = getattr(model.config, "hidden_size", None)
    if cfg.lora and width and cfg.lora > width:  # before peft allocates adapters of that rank
        raise UsageError(f"--lora {cfg.lora}: a rank above the model's width ({width}) adds nothing that a "
                         f"full fine-tune does not; give R <= {width}, or leave --lora out")
    if n > original:
        raise UsageError(f"--train-len {n} is beyond the model's context of {original} tokens")
    try:  # every sample of the first step, in every process (one sample's facts may take more tokens than another's)
        hf.step_samples(tokenizer, cfg, 0, [True] * (cfg.batch * cfg.grad_accum * dist.world()), True)
    except ValueError as e:
        raise UsageError(f"--train-len {n}: {e}") from None
    return model, tokenizer, original


def trainable(model, cfg: LLMConfig, device: str):
    """The model as it trains: activations recomputed on CUDA, LoRA adapters with --lora, wrapped in DDP or
    FSDP2 under a launcher; and the parameters the optimizer updates (under FSDP2, this process's shards)."""
    if torch.device(device).type == "cuda":
        hf.checkpoint_activations(model)
    torch.manual_seed(cfg.seed)  # LoRA's initial weights, dropout
    if cfg.lora:
        import peft
        with warnings.catch_warnings():  # peft reads transformers 5's deprecated is_gradient_checkpointing: not ours
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = peft.get_peft_model(model, peft.LoraConfig(r=cfg.lora, lora_alpha=2 * cfg.lora,
                                                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model = dist.wrap(model, cfg.fsdp, device)
    return model, [p for p in model.parameters() if p.requires_grad]


def step_batch(tokenizer, cfg: LLMConfig, step: int, range_end: int, position_rng: torch.Generator,
               rank: int | None = None, world: int | None = None) -> list:
    """Process `rank`'s share of step `step`'s global batch (default: this process's, under a launcher or not):
    (ids (1, T), prompt tokens, positions (1, T)) each; a function of its arguments and position_rng's state alone.

    The global batch is B x K x W samples, each its own forward (samples differ in length; nothing is padded).
    Process r's k-th backward takes samples j = (k W + r) B .. + B - 1. Randomized positions (n sorted distinct
    ids from [0, range_end)) are drawn from one stream in the order of j, whoever trains the sample, so that
    samples and positions do not depend on how the batch is split (hf.step_samples says what that costs)."""
    B, randomized = cfg.batch, METHODS[cfg.method][1]
    W, rank = dist.world() if world is None else world, dist.rank() if rank is None else rank
    ours = [(j // B) % W == rank for j in range(cfg.global_batch)]
    try:
        samples = hf.step_samples(tokenizer, cfg, step, ours, randomized)
    except ValueError as e:  # sample 0 was checked, but a later sample's facts may take more tokens
        raise UsageError(f"--train-len {cfg.train_len[1]}: step {step}: {e}") from None
    for j, sample in enumerate(samples):
        if sample is not None:
            T = sample[0].shape[1]
            positions = (lengen.randomized_positions(1, T, max(T, range_end), position_rng) if randomized
                         else torch.arange(T)[None])
            samples[j] = (*sample, positions)
    return [sample for sample, our in zip(samples, ours) if our]


# Has the model learned the task? With --fit-bar, every --fit-every steps and at the last: greedy exact match on
# --fit-prompts (FIT_PROMPTS) held-out prompts at the training length, from seeds of their own (training samples
# come from seed * 1,000,003 + i, eval.py's prompts from 10^9 + i). Training stops once the bar is reached
# (--no-fit-stop: it trains every step, judged at the last); fit.json says when (runs.read_fit reads it).
FIT_SEED, FIT_PROMPTS = 2 * 10 ** 9, 32


def fit_accuracy(model, tokenizer, cfg: LLMConfig, device) -> float:
    """Exact match on the fit check's prompts (--fit-prompts), contiguous positions, the model in eval mode for
    the while, with the numerics it trains with (bfloat16 autocast on CUDA and with --bf16). Every process
    scores every prompt (under FSDP2 their forwards gather the shards together)."""
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(cfg.fit_prompts):
            prompt, answer = hf.text_sample(tokenizer, cfg.task, cfg.train_len[1], FIT_SEED + i, cfg.task_options)
            right += hf.score_prompt(model, tokenizer, prompt, answer, (), device,
                                     bf16=cfg.bf16 or torch.device(device).type == "cuda")["right"]
    model.train()
    return right / cfg.fit_prompts


def check_fit(model, tokenizer, cfg: LLMConfig, fit: dict, step: int, device, log) -> None:
    """With --fit-bar, every --fit-every steps and at the last: the fit check, recorded in fit and (rank 0, the
    one with a log) in log.jsonl; fit["steps_to_fit"] is the step once the bar is reached."""
    if fit_due(fit, step, cfg.steps):
        row = record_fit(fit, step, fit_accuracy(dist.unwrap(model), tokenizer, cfg, device))
        if log is not None:
            log.write(json.dumps(row) + "\n")


def train(cfg: LLMConfig, set_learning_rate, on_step=None):
    """Fine-tune a Hugging Face causal LM on short text-task samples with one of Paper R's methods; the loss
    is on the answer tokens only. Saves the model (with its rope settings) and the tokenizer in the folder where
    the run is built (prepare_run_dir), returned last (None on ranks other than 0), for run() to swap in. Under a
    launcher (torchrun) every process runs this; rank 0 alone writes (dist.py says how it spreads).
    set_learning_rate(optimizer, step, lr, warmup, steps): train.py's, which the small GPT's loop calls too;
    on_step(step, ids, positions) sees every sample this process trains."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = dist.start(cfg.device)
    lead = dist.rank() == 0
    try:
        model, tokenizer, original = load_checked(cfg, device)
    except UsageError as e:  # the same in every process
        e.everywhere = True
        raise
    cfg.original_len, cfg.processes = original, dist.world()
    cfg.global_batch = cfg.batch * cfg.grad_accum * cfg.processes
    if cfg.resume:
        check_resumable(cfg)
    # only now, when everything has been checked, is anything written
    out = cfg.out if cfg.resume else prepare_run_dir(cfg.out, cfg.force) if lead else None
    hf.apply_llm_rope(model, cfg.scaling, cfg.factor)
    randomized, range_at = METHODS[cfg.method][1], range_end_at(cfg)
    model, params = trainable(model, cfg, device)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.wd)
    position_rng = torch.Generator().manual_seed(cfg.seed + 2)
    fit = fit_record(cfg.fit_bar, cfg.fit_every, cfg.fit_stop)
    first = resume_from(out, model, optimizer, position_rng, fit) if cfg.resume else 0
    if lead and not cfg.resume:
        write_config(out, cfg.saved())
    log = open_log(out, fresh=not cfg.resume) if lead else None
    bar = tqdm(range(first, cfg.steps), disable=cfg.quiet or not lead, desc=os.path.basename(cfg.out))
    model.train()
    tick, tokens = time.perf_counter(), 0
    for step in bar:
        set_learning_rate(optimizer, step, cfg.lr, cfg.warmup, cfg.steps)
        range_end = range_at(step)
        mine = step_batch(tokenizer, cfg, step, range_end, position_rng)
        losses, highest_position, norm = take_step(model, params, optimizer, mine, device, cfg.bf16, step, on_step)
        tokens += sum(ids.shape[1] for ids, _, _ in mine)
        loss_sum, all_tokens = dist.total([sum(losses), tokens])
        check_finite(loss_sum, step + 1)
        rate = all_tokens / (time.perf_counter() - tick)
        row = {"step": step + 1, "loss": round(loss_sum / cfg.global_batch, 5),
               "range": range_end if randomized else None,
               "highest_position": int(dist.total([highest_position], "max")[0]),
               "grad_norm": round(dist.local(norm).item(), 6), "tokens_per_s": round(rate)}
        if lead:
            log.write(json.dumps(row) + "\n")
        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{rate:,.0f}")
        check_fit(model, tokenizer, cfg, fit, step + 1, device, log)
        if cfg.fit_stop and fit["steps_to_fit"]:
            break
        if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            out = save_checkpoint(out, cfg.out, model, optimizer, step + 1, position_rng, fit)
    return save(model, tokenizer, cfg, out, log, fit), tokenizer, cfg, out


# --checkpoint-every: a fine-tune cut short (a kill, a session's end) goes on with --resume from its last
# checkpoint, and ends with the model an uninterrupted run saves (the samples are a function of the seed and the
# step, the learning rate of the step; the rest is in the checkpoint). One process: under torchrun the shards and
# the processes' generators would each need saving. The first checkpoint puts the run in --out's place, as a
# small GPT's does (runs.RunFolder), so that a kill after it leaves a run that --resume finds.
CHECKPOINT = "checkpoint.pt"


def save_checkpoint(out: str, final: str, model, optimizer, step: int, position_rng, fit: dict) -> str:
    """checkpoint.pt in the run's folder, written whole or not at all: the weights being trained (a full
    fine-tune's every weight, LoRA's adapters alone), the optimizer's state, the step, the position ids' and
    torch's generators and the fit checks so far. Returns the run's folder: --out from the first checkpoint on."""
    state = {"weights": {k: p.detach() for k, p in trained_weights(model).items()},
             "optimizer": optimizer.state_dict(), "step": step, "positions": position_rng.get_state(),
             "torch_rng": torch.get_rng_state(), "fit": fit}
    check_weights(state["weights"], f"after step {step}")
    save_atomic(os.path.join(out, CHECKPOINT), lambda f: torch.save(state, f))
    if out != final:
        swap_in(out, final)
    return final


def trained_weights(model) -> dict:
    """The weights a checkpoint holds, by name: those the optimizer updates."""
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def check_resumable(cfg: LLMConfig) -> None:
    """--resume: --out holds a checkpoint, and a config.json that this command line would write but for how it
    runs (--out, --device, --threads, --checkpoint-every), so that the run goes on as it began."""
    saved = saved_settings(cfg.out)
    if saved is None or not os.path.isfile(os.path.join(cfg.out, CHECKPOINT)):
        raise UsageError(f"{cfg.out}: no checkpoint to resume (a run started with --checkpoint-every N saves one "
                         "every N steps); start it without --resume")
    mine = json.loads(json.dumps(cfg.saved()))
    how = {"out", "device", "threads", "checkpoint_every"}
    # a flag one side lacks (added to train.py since, or gone) is no difference where the other leaves it unset
    unset = (None, False)
    differ = sorted(k for k in set(saved) | set(mine) if k not in how and saved.get(k) != mine.get(k)
                    and not (k not in saved and mine[k] in unset or k not in mine and saved[k] in unset))
    if differ:
        raise UsageError(f"{cfg.out}: its run was started by another command ({', '.join(differ)} differ): "
                         "resume it with its own, or start again with --force")


def resume_from(out: str, model, optimizer, position_rng, fit: dict) -> int:
    """The checkpoint's state loaded into the model, the optimizer, the generators and the fit record; the log
    cut back to its step (a run killed past its last checkpoint trains those steps again). Returns the step."""
    try:
        state = torch.load(os.path.join(out, CHECKPOINT), map_location="cpu", weights_only=True)  # any device
        trained = trained_weights(model)
        if set(state["weights"]) != set(trained):
            raise KeyError("weights")
        with torch.no_grad():
            for k, p in trained.items():
                p.copy_(state["weights"][k])
        optimizer.load_state_dict(state["optimizer"])
        position_rng.set_state(state["positions"])
        torch.set_rng_state(state["torch_rng"])
    except Exception as e:
        raise UsageError(f"{os.path.join(out, CHECKPOINT)} is not this run's checkpoint ({type(e).__name__}): "
                         "start again with --force") from None
    fit.update(state["fit"])
    step = state["step"]
    cut_log(out, step)
    return step


def check_finite(loss_sum: float, step: int) -> None:
    """A loss that is not finite ends the run: every process sees the same sum, so all stop, and nothing is
    saved."""
    if not math.isfinite(loss_sum):
        error = UsageError(f"loss is {loss_sum} at step {step}: training diverged (lower --lr); nothing was saved")
        error.everywhere = True
        raise error


def range_end_at(cfg: LLMConfig):
    """The range's end as a function of the step (logged as "range"): randomized positions come from
    [0, range_end) for an n-token sample, range_end a multiple of n that widens from 1x to cfg.range x (Paper R's
    stages by default), or is cfg.range x n from the first step with --no-curriculum. Every process computes the
    same range_end from the step."""
    n = cfg.train_len[1]
    widest = int(round(cfg.range * n))
    if cfg.no_curriculum:
        return lambda step: widest
    return lengen.LengthCurriculum(n, widest, cfg.steps, cfg.range_shape)


def take_step(model, params, optimizer, mine: list, device, bf16: bool, step: int, on_step=None) -> tuple:
    """One optimizer step on this process's share of the global batch (step_batch), each sample its own forward
    and backward; returns the samples' losses, the highest position id fed (logged as "highest_position"), and
    the gradient norm before clipping (of the global batch's gradient: the processes average theirs at the last
    backward). bfloat16 autocast on CUDA, and on the CPU with bf16."""
    autocast = dict(device_type=torch.device(device).type, dtype=torch.bfloat16,
                    enabled=torch.device(device).type == "cuda" or bf16)
    optimizer.zero_grad(set_to_none=True)
    losses, highest_position = [], 0
    for i, (ids, n_prompt, positions) in enumerate(mine):
        if on_step:
            on_step(step, ids, positions)
        ids, positions = ids.to(device), positions.to(device)
        with dist.gradient_sync(model, sync=i == len(mine) - 1):
            with torch.autocast(**autocast):
                logits = hf.answer_logits(model, ids, positions, n_prompt)
            loss = F.cross_entropy(logits[0], ids[0, n_prompt:])
            # the mean over the global batch: the processes average their gradients, so each divides by the
            # samples it trains
            (loss / len(mine)).backward()
        losses.append(loss.item())
        highest_position = max(highest_position, int(positions.max()))
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return losses, highest_position, norm


def save(model, tokenizer, cfg: LLMConfig, out: str | None, log, fit: dict):
    """Gather the whole model (every process takes part in gathering FSDP2's shards), merge LoRA adapters into
    it, and save it in out/model on rank 0 (out is None elsewhere), with fit.json under --fit-bar. Returns the
    model, unwrapped, in eval mode."""
    model = dist.unwrap(model)
    if cfg.lora:
        model = model.merge_and_unload()
    state = dist.full_state(model)
    if out is not None:
        log.close()
        check_weights(state, "after the last step")  # rank 0 holds them all; its error ends the launch
        if fit["bar"]:
            save_atomic(os.path.join(out, "fit.json"), lambda f: f.write(json.dumps(fit).encode()))
        saving = os.path.join(out, "model.saving")  # renamed model/ once whole: a build with model/ is whole
        with hf.hushed(cfg.quiet):  # its "Writing model shards" bar
            model.save_pretrained(saving, state_dict=state)
            tokenizer.save_pretrained(saving)
        # a model/ already here is this run's, saved before a kill that left the checkpoint too (then resumed)
        shutil.rmtree(os.path.join(out, "model"), ignore_errors=True)
        os.rename(saving, os.path.join(out, "model"))
        with contextlib.suppress(FileNotFoundError):  # the model is whole: the run need not go on
            os.remove(os.path.join(out, CHECKPOINT))
    return model.eval()


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, set_learning_rate, on_step=None) -> dict:
    """`train.py --llm ...` from its parsed command line: check, fine-tune, swap the run in; {"run": dir}."""
    try:  # every process checks the command line, and whether --out is free, before any model loads
        try:
            cfg = resolve(args, parser)
        except (ValueError, RuntimeError) as e:
            raise UsageError(str(e)) from None
        if args.resume and (args.force or dist.launched()):
            raise UsageError("--resume goes on with the run in --out, in one process; --force replaces it: give "
                             "one, without torchrun")
        if not args.resume:
            check_out(cfg.out, cfg.force)
    except UsageError as e:  # found alike by every process: rank 0 says it
        e.everywhere = True
        raise
    # Under a launcher only rank 0 holds and writes the run. A check that fails on rank 0 alone (the run is
    # held, or exists) ends that process, and the launcher then ends the others (so nothing waits for the
    # process group to be left: that would wait forever for the others).
    lead = dist.launch_rank() == 0
    with hold(cfg.out) if lead else contextlib.nullcontext():
        # the run is built where prepare_run_dir chose when training began: beside --out, or inside it (--out
        # may appear as a folder while it trains; swap_in moves the run in from where it is)
        model, tokenizer, cfg, built = train(cfg, set_learning_rate, on_step)
        if lead and built != cfg.out:  # a run checkpointed (or resumed) stands in --out already
            swap_in(built, cfg.out)
    dist.stop()
    if lead and not cfg.quiet:
        print(f"saved {cfg.out}/model ({cfg.method}); measure it with: python eval.py {cfg.out}")
    return {"run": cfg.out, "rows": []}
