"""The first minutes on a GPU: check the CUDA path, then measure what planning a GPU session needs; with --full,
then run the llm experiment's decisive design.

    python eval.py --experiment gpu            # results/gpu.{md,json}; about 8 minutes on one GPU
    python eval.py --experiment gpu --dry-run  # the llm --full design: its runs, time and memory (no GPU needed)
    python eval.py --experiment gpu --full     # the checks, then that design (results/full/llm.*)

First `python -m pytest -m cuda` (tests/test_cuda.py: every part of the CUDA path, against the CPU), then:
- a full fine-tuning step of SmolLM2-135M-Instruct (every weight, AdamW, bfloat16 autocast, activation
  checkpointing, as train.py --llm runs on CUDA) at 512, 4K and 8K tokens per sample: tokens/s, the model FLOPs
  utilisation against the device's bfloat16 peak, and peak memory;
- one evaluation forward of that model at 8K to 128K tokens (YaRN over its 8192-token context): time and peak
  memory;
- the small GPT's training step, RoPE and ALiBi (through the fused kernel), at the bench's shapes (4 layers x
  128, batch 12 x 64 tokens, and batch 4 x 256): ms per step and ALiBi's over RoPE's;
- every encoding's forward at 32K tokens in the bench's model (2 layers x 128, 4 heads; float32), with the
  attention path it took (ALiBi: the fused kernel; the other biases: compiled flex attention) and its
  time over RoPE's.
The fine-tuning and forward rates are what --dry-run plans from once results/gpu.json holds them. Without CUDA
it refuses in one line (but --dry-run). Until a GPU has run it, results/gpu.md does not exist.

Read top to bottom: the peak and the FLOP count; the measurements; the plan (--dry-run); run(args), which
returns the data. gpu_report.py writes them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import lengen
from experiments.common import command_line, preset_name
from runs import UsageError

PRESETS = {  # fine-tuning lengths, evaluation lengths, timed steps; the tests' own checks run in every preset
    "quick": dict(train_lengths=(1024,), eval_lengths=(8192,), steps=2, pytest=False, encodings_at=8192),
    # 512 and 8192..32768: the llm experiment's --full fine-tunes and scores there (--dry-run plans from them)
    "default": dict(train_lengths=(512, 4096, 8192), eval_lengths=(512, 8192, 16384, 32768, 65536, 131072),
                    steps=5, pytest=True, encodings_at=32768),
    # the checks and measurements, then the llm experiment's --full design (`--dry-run` prints it first)
    "full": dict(train_lengths=(512, 4096, 8192, 16384),
                 eval_lengths=(512, 8192, 16384, 32768, 65536, 131072, 262144),
                 steps=10, pytest=True, encodings_at=32768, llm_full=True),
}
WARMUP = 2  # untimed steps first: kernels chosen, memory pools grown

# ---------------------------------------------------------------------------------------------------------
# The peak and the FLOP count
# ---------------------------------------------------------------------------------------------------------

# Dense bfloat16 tensor-core peaks from the vendors' data sheets (no sparsity), matched in order against the
# device name; LENGEN_PEAK_TFLOPS overrides, for a device not listed or a clock the sheet does not describe.
BF16_PEAK_TFLOPS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
                    ("L4", 121.0)]


def bf16_peak(name: str) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from) for a device name; (None, why) when unknown."""
    given = os.environ.get("LENGEN_PEAK_TFLOPS")
    if given:
        try:
            peak = float(given)
        except ValueError:
            peak = float("nan")
        if not (math.isfinite(peak) and peak > 0):  # nan, inf, 0 or below would give an MFU of nan, 0 or < 0
            raise UsageError(f"LENGEN_PEAK_TFLOPS={given!r}: give the peak in TFLOP/s, a number > 0, e.g. 989")
        return peak * 1e12, "LENGEN_PEAK_TFLOPS"
    for part, tflops in BF16_PEAK_TFLOPS:
        if part in name:
            return tflops * 1e12, f"data sheet ({part})"
    return None, "unknown device: set LENGEN_PEAK_TFLOPS"


def train_flops_per_token(params: int, layers: int, width: int, tokens: int) -> float:
    """Model FLOPs of one training token (forward and backward), as PaLM counts them: 6 per weight, plus the
    attention scores and their weighted sum, 12 x layers x width x tokens (the causal half not subtracted).
    Activation checkpointing recomputes the forward; that work is not counted (model, not hardware, FLOPs)."""
    return 6 * params + 12 * layers * width * tokens


# ---------------------------------------------------------------------------------------------------------
# The measurements
# ---------------------------------------------------------------------------------------------------------


def timed(fn, steps: int) -> tuple[float, float]:
    """Seconds per call of fn after WARMUP calls, and the peak memory (GiB) of the timed calls."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps, torch.cuda.max_memory_allocated() / 2 ** 30


def run_cuda_tests() -> dict:
    result = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"],
                            capture_output=True, text=True, timeout=420,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lines = result.stdout.strip().splitlines()
    return {"exit": result.returncode, "summary": lines[-1] if lines else result.stderr[-300:]}


def fine_tune_speed(model, lengths, steps: int, peak: float | None) -> list[dict]:
    import hf
    hf.checkpoint_activations(model)
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    params = sum(p.numel() for p in model.parameters())
    layers, width = model.config.num_hidden_layers, model.config.hidden_size
    rows = []
    for n in lengths:
        ids = torch.randint(model.config.vocab_size, (1, n), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        seconds, memory = timed(step, steps)
        rate = n / seconds
        flops = rate * train_flops_per_token(params, layers, width, n)
        rows.append({"tokens": n, "tokens_per_s": rate, "tflops": flops / 1e12, "peak_gib": memory,
                     "mfu": flops / peak if peak else None})
    return rows


@torch.no_grad()
def eval_forward(model, lengths) -> list[dict]:
    import hf
    model.eval()
    model.config.use_cache = False
    hf.apply_llm_rope(model, "yarn", max(lengths) / hf.rope_geometry(model)[2])
    rows = []
    for n in lengths:
        ids = torch.randint(model.config.vocab_size, (1, n), device="cuda")

        def forward():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=ids, logits_to_keep=1)

        seconds, memory = timed(forward, 1)
        rows.append({"tokens": n, "seconds": seconds, "peak_gib": memory})
    return rows


SMALL_GPT_SHAPES = ((12, 64), (4, 256))  # (batch, tokens): the CPU bench's two shapes of its ALiBi rows


def small_gpt_speed(steps: int = 100) -> list[dict]:
    """A full training step (forward, backward, AdamW) of the bench's small GPT, 4 layers x 128 and 4 heads, for
    RoPE and for ALiBi (which takes torch's fused kernel: lengen.alibi_attention) at each SMALL_GPT_SHAPES."""
    rows = []
    for batch, tokens in SMALL_GPT_SHAPES:
        for encoding in ("rope", "alibi"):
            torch.manual_seed(0)
            model = lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=4, heads=4, dim=128, encoding=encoding,
                                                max_len=tokens)).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(64, (batch, tokens), device="cuda")

            def step():
                loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            seconds, _ = timed(step, steps)
            rows.append({"encoding": encoding, "batch": batch, "tokens": tokens, "ms_per_step": 1000 * seconds,
                         "path": model.attention_path(tokens)[0], "tokens_per_s": x.numel() / seconds})
    return over_rope(rows, "ms_per_step", "tokens")


def over_rope(rows: list[dict], seconds: str, shape: str | None = None) -> list[dict]:
    """Each row with "vs_rope": its time (the key `seconds`) over the RoPE row's of the same `shape` (a key of
    the rows; None: one shape for all)."""
    rope = {r.get(shape): r[seconds] for r in rows if r["encoding"] == "rope"}
    return [{**r, "vs_rope": r[seconds] / rope[r.get(shape)]} for r in rows]


@torch.no_grad()
def encodings_at(length: int) -> list[dict]:
    """Every encoding's forward at `length` tokens (the CPU bench's model), on CUDA in float32: time (after
    WARMUP forwards, where flex attention compiles), peak memory, path, and time over RoPE's."""
    rows = []
    for encoding in lengen.ENCODINGS:
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=2, heads=4, dim=128, encoding=encoding,
                                            max_len=length)).cuda().eval()
        idx = torch.randint(0, 64, (1, length), device="cuda")
        seconds, memory = timed(lambda: model(idx), 3)
        rows.append({"encoding": encoding, "path": model.attention_path(length)[0], "seconds": seconds,
                     "peak_gib": memory})
    return over_rope(rows, "seconds")


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# The plan: the llm experiment's --full design as this GPU would run it (--dry-run, which needs no GPU)
# ---------------------------------------------------------------------------------------------------------

# SmolLM2-135M-Instruct's shape (its config; tests/test_gpu_command.py checks it against the loaded model).
SMOLLM2 = dict(params=134_515_008, layers=30, width=576, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
# Until `python eval.py --experiment gpu` has measured the device (results/gpu.json), time is estimated from
# model FLOPs at an assumed utilisation of the bf16 peak, with a floor per forward for the ~600 kernel launches
# of 30 layers that one sample at a time cannot hide. Both are assumptions, printed as such.
ASSUMED_MFU, FORWARD_FLOOR_S = 0.2, 0.005
LLM_JOBS = 8  # the llm experiment's --full: fine-tunes and scorings this many at once (16 CPU cores, 139 GiB)
DECODE_TOKENS = 16  # hf.score_prompt's greedy answer: at most this many one-token forwards


def measured_rates(path: str) -> dict:
    """From results/gpu.json, if a GPU has written it: seconds of a fine-tuning step at each measured length (one
    sample), and of one evaluation forward; {} otherwise."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {"step": {r["tokens"]: r["tokens"] / r["tokens_per_s"] for r in data.get("fine_tune", [])},
            "forward": {r["tokens"]: r["seconds"] for r in data.get("eval_forward", [])},
            "device": data.get("device")}


def forward_flops(tokens: int) -> float:
    """One forward of SmolLM2 over `tokens` (batch 1): 2 FLOPs a weight a token, plus attention's scores and
    their weighted sum, 2 x layers x width x tokens^2 (the causal half counted once)."""
    m = SMOLLM2
    return 2 * m["params"] * tokens + 2 * m["layers"] * m["width"] * tokens ** 2


def forward_seconds(tokens: int, peak: float, rates: dict) -> float:
    """One forward: measured, or its FLOPs at ASSUMED_MFU, at least FORWARD_FLOOR_S."""
    if tokens in rates.get("forward", {}):
        return rates["forward"][tokens]
    return max(forward_flops(tokens) / (peak * ASSUMED_MFU), FORWARD_FLOOR_S)


def step_seconds(tokens: int, batch: int, peak: float, rates: dict) -> float:
    """A full fine-tuning step (forward, recomputed forward, backward, AdamW) over batch x tokens: measured (one
    sample, times batch), or train_flops_per_token at ASSUMED_MFU, at least four forwards' floor."""
    if tokens in rates.get("step", {}):
        return batch * rates["step"][tokens]
    m = SMOLLM2
    flops = batch * tokens * train_flops_per_token(m["params"], m["layers"], m["width"], tokens)
    return max(flops / (peak * ASSUMED_MFU), 4 * FORWARD_FLOOR_S * batch)


def memory_gib(tokens: int, train: bool) -> float:
    """Peak memory of one process: fine-tuning every weight keeps fp32 weights, grads and AdamW's two moments
    (16 bytes a weight), the checkpointed layer inputs and the fp32 logits and their grad; scoring keeps the fp32
    weights and two bf16 KV caches (score_prompt copies one for the greedy answer); either, one layer's
    activations."""
    m = SMOLLM2
    if train:
        held = 16 * m["params"] + m["layers"] * tokens * m["width"] * 2 + 2 * tokens * m["vocab"] * 4
    else:
        held = 4 * m["params"] + 2 * (2 * m["layers"] * m["kv_heads"] * m["head_dim"] * tokens * 2)
    return (held + tokens * (4 * m["width"] + 3 * m["intermediate"]) * 4) / 2 ** 30


def llm_full_plan(peak: float, rates: dict) -> dict:
    """The llm experiment's --full: its fine-tunes (train.py commands), every model scored at every length, and
    of each part the seconds one process at a time takes ("seconds") and those its FLOPs alone take at
    ASSUMED_MFU ("gpu_bound": what processes sharing the GPU cannot overlap), with each process's peak memory."""
    from experiments import llm
    setup = llm.PRESETS["full"]
    args = argparse.Namespace(device="cuda", threads=None)
    tunes = [m for m in setup["methods"] if not m.startswith("base") and llm.source(m) == m]
    n, steps = setup["train_len"], setup["steps"]
    checks = (steps // setup["fit_every"]) * setup["fit_prompts"]  # fit-check prompts a fine-tune answers

    def prompt_s(tokens):  # a prompt's forward and its greedy answer, one token a forward
        return forward_seconds(tokens, peak, rates) + DECODE_TOKENS * FORWARD_FLOOR_S

    m = SMOLLM2
    tune_flops = steps * setup["batch"] * n * train_flops_per_token(m["params"], m["layers"], m["width"], n) + \
        checks * forward_flops(n)
    parts = {"fine-tunes": (len(tunes) * (steps * step_seconds(n, setup["batch"], peak, rates) + checks * prompt_s(n)),
                            len(tunes) * tune_flops / (peak * ASSUMED_MFU))}
    for tokens, k in setup["samples"].items():
        scored = len(setup["methods"]) * k
        parts[f"scoring at {tokens}"] = (scored * prompt_s(tokens), scored * forward_flops(tokens) / (peak * ASSUMED_MFU))
    # a part's FLOPs cannot take longer than the part itself, as measured where a GPU measured it
    parts = {k: (serial, min(bound, serial)) for k, (serial, bound) in parts.items()}
    measured = {"fine-tunes": n in rates.get("step", {}) and n in rates.get("forward", {}),
                **{f"scoring at {t}": t in rates.get("forward", {}) for t in setup["samples"]}}
    return {"fine_tunes": ["python train.py " + " ".join(llm.fine_tune_argv(t, setup, "runs/llm-full", args))
                           for t in tunes],
            "models": setup["methods"], "samples": setup["samples"],
            "seconds": {k: v[0] for k, v in parts.items()}, "gpu_bound": {k: v[1] for k, v in parts.items()},
            "measured": measured,
            "memory_gib": {"fine-tune": memory_gib(n, True), **{t: memory_gib(t, False) for t in setup["samples"]}}}


def wall_minutes(plan: dict, jobs: int) -> float:
    """The plan's wall time with `jobs` processes sharing the GPU: what launches cost overlaps across processes,
    what the FLOPs cost does not."""
    return max(sum(plan["seconds"].values()) / jobs, sum(plan["gpu_bound"].values())) / 60


def dry_run(args) -> str:
    """--dry-run: what `python eval.py --experiment gpu --full` runs after its checks, the llm experiment's --full,
    with its time and memory estimates, on this CUDA device if there is one, else on an H200 (this project's)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "NVIDIA H200 (none here: assumed)"
    peak, known = bf16_peak(name)[0] or 989e12, bf16_peak(name)[0] is not None
    rates = measured_rates(os.path.join(args.out_dir or "results", "gpu.json"))
    plan = llm_full_plan(peak, rates)
    assumed = (f"model FLOPs at {ASSUMED_MFU:.0%} of {peak / 1e12:g} TFLOP/s ({name}'s bf16 peak"
               + ("" if known else ", assumed: not a device this project lists") + f"), at least "
               f"{1000 * FORWARD_FLOOR_S:g} ms a forward")
    source = (f"rates measured on {rates['device']} by `python eval.py --experiment gpu` (results/gpu.json) for the "
              f"parts marked *, {assumed} for the others" if rates else f"no GPU measured yet: {assumed} (assumed)")
    return "\n".join([
        f"python eval.py --experiment llm --full --device cuda --jobs {LLM_JOBS} --out-dir results/full: "
        f"{len(plan['fine_tunes'])} "
        f"fine-tunes, {len(plan['models'])} models each scored on " + ", ".join(
            f"{k} prompts at {n} tokens" for n, k in plan["samples"].items()) + ".",
        f"Time, estimated ({source}), one process at a time: " + ", ".join(
            f"{part}{'*' if plan['measured'][part] else ''} {s / 60:.1f} min" for part, s in plan["seconds"].items())
        + f"; {wall_minutes(plan, 1):.1f} min in all, about {wall_minutes(plan, LLM_JOBS):.1f} min with "
          f"{LLM_JOBS} processes sharing the GPU (their FLOPs alone: {wall_minutes(plan, 10 ** 9):.1f} min).",
        "Peak memory a process, estimated: " + ", ".join(
            f"{k if k == 'fine-tune' else f'scoring at {k}'} {g:.1f} GiB" for k, g in plan["memory_gib"].items())
        + f" (x {LLM_JOBS} processes).",
        "The fine-tunes, as train.py runs them:", *plan["fine_tunes"]])


def refuse(args) -> None:
    """Before eval.py makes any folder: this experiment needs a CUDA device."""
    if not torch.cuda.is_available():
        raise UsageError("--experiment gpu measures a CUDA device, and torch.cuda.is_available() is False here")


def run(args) -> dict:
    """Every measurement of the preset args name on this CUDA device, with the command, the device and the
    runtime."""
    import hf
    setup = PRESETS[preset_name(args)]
    start = time.perf_counter()
    name = torch.cuda.get_device_name()
    peak, source = bf16_peak(name)
    tests = run_cuda_tests() if setup["pytest"] else None
    model, _ = hf.load_llm("smollm2", "cuda")
    data = {"command": command_line(args), "device": name, "torch": torch.__version__, "settings": setup,
            "peak_tflops": peak / 1e12 if peak else None, "peak_from": source, "cuda_tests": tests,
            "params": sum(p.numel() for p in model.parameters()),
            "fine_tune": fine_tune_speed(model, setup["train_lengths"], setup["steps"], peak)}
    del model
    torch.cuda.empty_cache()
    model, _ = hf.load_llm("smollm2", "cuda")  # fresh weights, and no optimizer state in memory
    data["eval_forward"] = eval_forward(model, setup["eval_lengths"])
    data["small_gpt"] = small_gpt_speed()
    data["encodings"] = encodings_at(setup["encodings_at"])
    del model
    torch.cuda.empty_cache()
    if setup.get("llm_full"):  # the decisive design, once every check of the CUDA path has passed
        data["llm_full"] = run_llm_full(tests)
    data["runtime_s"] = time.perf_counter() - start
    return data


def run_llm_full(tests: dict | None) -> dict:
    """--full: `python eval.py --experiment llm --full --device cuda --jobs LLM_JOBS --out-dir results/full` in its
    own process (results/full/llm.*: the CPU default's results/llm.* stay), unless a CUDA test failed; its exit
    status and minutes."""
    if tests is None or tests["exit"] != 0:
        return {"skipped": "a CUDA test failed: " + (tests or {}).get("summary", "not run")}
    command = [sys.executable, "eval.py", "--experiment", "llm", "--full", "--device", "cuda", "--jobs", str(LLM_JOBS),
               "--out-dir", os.path.join("results", "full")]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {"command": " ".join(["python"] + command[1:]), "exit": done.returncode,
            "minutes": (time.perf_counter() - start) / 60}
