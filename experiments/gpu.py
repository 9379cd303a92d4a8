"""The first minutes on a GPU: check the CUDA path, then measure what planning a GPU session needs.

    python eval.py --experiment gpu        # results/gpu.{md,json}; about 8 minutes on one GPU

First `python -m pytest -m cuda` (tests/test_cuda.py: every part of the CUDA path, against the CPU), then:
- a full fine-tuning step of SmolLM2-135M-Instruct (every weight, AdamW, bfloat16 autocast, activation
  checkpointing, as train.py --llm runs on CUDA) at 4K and 8K tokens per sample: tokens/s, the model FLOPs
  utilisation against the device's bfloat16 peak, and peak memory;
- one evaluation forward of that model at 32K, 64K and 128K tokens (YaRN over its 8192-token context): time
  and peak memory;
- the small GPT's training step, RoPE and ALiBi (through the fused kernel), at the bench's shapes (4 layers x
  128, batch 12 x 64 tokens, and batch 4 x 256): ms per step and ALiBi's over RoPE's;
- every encoding's forward at 32K tokens in the bench's model (2 layers x 128, 4 heads; float32), with the
  attention path it took (ALiBi: the fused kernel; the other biases: compiled flex attention) and its
  time over RoPE's.
Without CUDA it refuses in one line. Until a GPU has run it, results/gpu.md does not exist.

Read top to bottom: the peak and the FLOP count; the measurements; run(args), which returns the data.
gpu_report.py writes them.
"""
from __future__ import annotations

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
    "default": dict(train_lengths=(4096, 8192), eval_lengths=(32768, 65536, 131072), steps=5, pytest=True,
                    encodings_at=32768),
    "full": dict(train_lengths=(4096, 8192, 16384), eval_lengths=(32768, 65536, 131072, 262144), steps=10,
                 pytest=True, encodings_at=32768),
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
    data["runtime_s"] = time.perf_counter() - start
    return data
