"""Speed and memory: training speed per encoding against a plain reference, where a training step's time
goes and which options make it faster, evaluation memory and time at long length with the attention path each
encoding takes there, the bias encodings through flex attention against query blocks, the cost of patching a
Hugging Face model, an LLM fine-tune's throughput in 1 and 2 processes, and what --jobs does to an
experiment's wall time.

    python eval.py --bench                     # results/bench.{md,json}

Machines here are shared and noisy, so every figure is a ratio measured in the same run, each timing the best
of several repeats. Read top to bottom: the plain reference; the timed measurements; the presets; measure()
and the targets lengen promises; run(args), which returns the data. bench_report.py writes them.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import lengen
from experiments.common import command_line, preset_name

BENCH_VARIANTS = [  # label, GPTConfig settings
    ("nope", dict(encoding="nope")),
    ("learned", dict(encoding="learned")),
    ("sinusoidal", dict(encoding="sinusoidal")),
    ("rope", dict(encoding="rope")),
    ("rope+yarn", dict(encoding="rope", scaling="yarn", factor=4.0)),
    ("alibi", dict(encoding="alibi")),
    ("nope, linear", dict(encoding="nope", attention="linear")),
    ("rope, linear", dict(encoding="rope", attention="linear")),
]


def plain_forward(model: lengen.GPT, idx: torch.Tensor) -> torch.Tensor:
    """The same model written the plain way, as the speed reference: attention spelled out with a T x T
    mask, RoPE's cos/sin recomputed in every layer of every step, ALiBi's T x T bias built in every layer.
    It shares model's weights, and the bench checks it gives the same logits."""
    cfg, pos = model.config, model.pos
    B, T = idx.shape
    H, D = cfg.heads, cfg.dim // cfg.heads
    positions = torch.arange(T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = model.tok(idx)
    if pos.acts_on == "input":
        x = x + pos.embed(positions)
    for block in model.blocks:
        q, k, v = block.attn.qkv(block.ln1(x)).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        if pos.acts_on == "qk":
            phase = positions.float()[:, None] * pos.inv_freq[None]
            cos = torch.cat((phase, phase), -1).cos() * pos.attention_scale
            sin = torch.cat((phase, phase), -1).sin() * pos.attention_scale
            q, k = q * cos + lengen.rotate_half(q) * sin, k * cos + lengen.rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / D ** 0.5  # (B, H, T, T)
        if pos.acts_on == "logits":
            scores = scores - pos.slopes[:, None, None] * (positions[:, None] - positions[None, :])
        if cfg.attention == "linear":
            weights = scores * causal
        else:
            weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + block.attn.proj((weights @ v).transpose(1, 2).reshape(B, T, H * D))
        if block.mlp is not None:
            x = x + block.mlp(block.ln2(x))
    return model.head(model.ln_f(x))


def best_times(fns: dict, repeats: int) -> dict:
    """Best wall time of each function, the functions taking turns in every repeat so that a noisy
    neighbour slows them all alike; one untimed warm-up call each."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def bench_model(shape: dict, **settings) -> lengen.GPT:
    """The shape's GPT on 64 symbols, from the same initial weights every time."""
    torch.manual_seed(0)
    return lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=shape["layers"], heads=shape["heads"], dim=shape["dim"],
                                       original_len=shape["length"], max_len=shape["length"], **settings))


def bench_batch(shape: dict) -> torch.Tensor:
    """The one batch every timed step trains on: (batch, length) random symbols."""
    return torch.randint(0, 64, (shape["batch"], shape["length"]), generator=torch.Generator().manual_seed(0))


def training(model: lengen.GPT, forward, x: torch.Tensor, steps: int, **adamw):
    """`steps` training steps on x as one call, to time or to profile: forward (the model itself, its plain
    reference or a compiled one), cross-entropy against x itself (a timing loss, not a task), backward, and a
    step of its own AdamW (lr 1e-4; adamw: foreach, fused) on model's weights."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **adamw)

    def go():
        for _ in range(steps):
            loss = F.cross_entropy(forward(x).flatten(0, 1), x.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return go


def training_speed(shape: dict, steps: int, repeats: int, compile_rope: bool) -> list[dict]:
    """Tokens/s of full training steps (forward, backward, AdamW) for every variant, lengen vs plain."""
    x = bench_batch(shape)
    fns = {}
    for label, settings in BENCH_VARIANTS:
        model = bench_model(shape, **settings)
        with torch.no_grad():
            assert torch.allclose(model(x), plain_forward(model, x), atol=1e-4), f"{label}: plain != lengen"
        fns[label] = training(model, model, x, steps)
        fns[label, "plain"] = training(model, lambda i, m=model: plain_forward(m, i), x, steps)
        if compile_rope and label == "rope":
            fns[label, "compiled"] = training(model, torch.compile(model), x, steps)
    best = best_times(fns, repeats)
    rate = {name: x.numel() * steps / seconds for name, seconds in best.items()}
    rows = []
    for label, _ in BENCH_VARIANTS:
        row = {"variant": label, "tokens_per_s": rate[label], "plain_tokens_per_s": rate[label, "plain"],
               "cost_vs_nope": rate["nope"] / rate[label],  # > 1: slower than NoPE
               "speedup_vs_plain": rate[label] / rate[label, "plain"]}
        if (label, "compiled") in rate:
            row["compiled_tokens_per_s"] = rate[label, "compiled"]
        rows.append(row)
    return rows


def step_options(shape: dict, steps: int, repeats: int, compile_too: bool) -> list[dict]:
    """The RoPE training step with the options that could make it faster, each as tokens/s and as a ratio to
    the plain reference timed in the same turns: AdamW's for-loop (torch's default on the CPU), foreach and
    fused implementations, and torch.compile of the forward. Every option starts from the same weights and
    takes the same steps, so `identical` says whether it ends with bit-identical weights to the default."""
    x = bench_batch(shape)
    options = {"plain reference": ({}, False), "lengen": ({}, False),
               "lengen, AdamW foreach": ({"foreach": True}, False), "lengen, AdamW fused": ({"fused": True}, False)}
    if compile_too:
        options["lengen, torch.compile"] = ({}, True)
    fns, models = {}, {}
    for label, (adamw, compiled) in options.items():
        model = bench_model(shape)
        forward = (lambda i, m=model: plain_forward(m, i)) if label == "plain reference" else \
            torch.compile(model) if compiled else model
        fns[label], models[label] = training(model, forward, x, steps, **adamw), model
    best = best_times(fns, repeats)
    default = list(models["lengen"].parameters())
    return [{"option": label, "tokens_per_s": x.numel() * steps / best[label],
             "vs_plain": best["plain reference"] / best[label],
             "identical": None if label == "plain reference" else
             all(torch.equal(p, q) for p, q in zip(models[label].parameters(), default))} for label in options]


@contextlib.contextmanager
def stderr_silenced():
    """The process's stderr to /dev/null while the block runs: torch.profiler's C++ side writes 'USDT: ...
    profiler_start' lines there, which would say nothing to the user."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def step_profile(shape: dict, steps: int) -> list[dict]:
    """Where the RoPE training step spends its time: torch.profiler's self CPU time per operator, the largest
    first, as a share of the whole."""
    from torch.profiler import ProfilerActivity, profile
    model = bench_model(shape)
    step = training(model, model, bench_batch(shape), 1)
    step()  # warm-up, outside the profile
    with stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    return [{"operator": e.key, "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps}
            for e in ops[:8]]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(words: list[str], folder: str) -> None:
    """Run a command of one torch thread per process in `folder`; a failure stops the bench with its last line."""
    done = subprocess.run(words, cwd=folder, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise RuntimeError(f"{' '.join(words)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def llm_throughput(length: int, steps: int) -> list[dict]:
    """Training tokens/s of train.py --llm smollm2 (Randomized YaRN, one sample of `length` tokens per process
    and step) in 1 process, and in 2 under torchrun (DDP, and FSDP2), one torch thread each, on the CPU (gloo).
    The rate is the one train.py logs at its last step: every process's tokens since the loop began (loading
    the model is not counted)."""
    import hf
    if not hf.smollm2_gguf():
        return []
    train_args = ["train.py", "--llm", "smollm2", "--method", "ryarn", "--train-len", str(length), "--steps",
                  str(steps), "--threads", "1", "--quiet"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ways = [("1 process", [sys.executable]), ("2 processes, DDP", torchrun), ("2 processes, FSDP2", torchrun)]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for label, launcher in ways:
            out = os.path.join(folder, "run")
            extra = ["--fsdp"] if "FSDP2" in label else []
            _command(launcher + train_args + extra + ["--out", out, "--force"], ROOT)
            with open(os.path.join(out, "log.jsonl")) as f:
                last = [json.loads(line) for line in f][-1]
            rows.append({"processes": label, "tokens_per_s": last["tokens_per_s"]})
    return rows


def jobs_wall_time(experiment: str, jobs: tuple[int, ...]) -> list[dict]:
    """Wall time of `python eval.py --experiment NAME --quick --threads 1 --jobs N` for each N, each in a
    fresh folder (its runs/ and results/ land there)."""
    rows = []
    for n in jobs:
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            _command([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", experiment, "--quick",
                      "--threads", "1", "--jobs", str(n)], folder)
            rows.append({"experiment": experiment, "jobs": n, "wall_s": time.perf_counter() - start})
    return rows


def _resident_kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak since the last reset) of this process, from Linux's /proc."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _memory_probe(encoding: str, length: int, threads: int | None, result) -> None:
    """Runs in a fresh process: reset the peak resident size (Linux: write 5 to /proc/self/clear_refs), run one
    forward, and report how far the peak rose above what was resident before it, the time, and the attention
    path. A forward through compiled flex attention is run once first, so that neither the compile's time nor
    its memory is counted; that first forward's time is reported too."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=2, heads=4, dim=128, encoding=encoding,
                                        max_len=length)).eval()
    idx = torch.randint(0, 64, (1, length))
    with torch.no_grad():
        path = model.attention_path(length)
        first = None
        if path[0] == "flex":
            start = time.perf_counter()
            model(idx)
            first = time.perf_counter() - start
    linux = os.path.exists("/proc/self/clear_refs")  # elsewhere the peak cannot be reset: time only
    if linux:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _resident_kib("VmRSS")
    start = time.perf_counter()
    with torch.no_grad():
        model(idx)
    seconds = time.perf_counter() - start
    result.put(((_resident_kib("VmHWM") - before) * 1024 if linux else float("nan"), seconds, path, first))


def evaluation_memory(lengths: list[int], threads: int | None) -> list[dict]:
    """Peak memory and time of one forward per encoding and length, each in a fresh process. The processes
    run with glibc's MALLOC_MMAP_THRESHOLD_=65536, so every large tensor is returned to the system when freed:
    with the default, the blocked ALiBi path's tensors of ever-growing width stay resident as heap fragments
    (we measured 2-3 GB at 32K tokens instead of ~0.2 GB). Set it yourself for long ALiBi evaluations."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # read by each new process's allocator
    rows = []
    for encoding in lengen.ENCODINGS:
        for length in lengths:
            queue = context.Queue()
            probe = context.Process(target=_memory_probe, args=(encoding, length, threads, queue))
            probe.start()
            extra, seconds, (path, why), first = queue.get()
            probe.join()
            rows.append({"encoding": encoding, "length": length, "peak_mb": extra / 2 ** 20, "seconds": seconds,
                         "path": path, "why": why, "first_forward_s": first})
    return rows


def paths_compared(lengths: list[int], repeats: int) -> list[dict]:
    """Each bias encoding's forward at each length through compiled flex attention and through query blocks,
    in this process, after a first forward each (flex compiles there): the evidence for each flex_from. ALiBi
    takes either only at ids too sparse for its fused path: here ALIBI_SPAN (64) apart."""
    if lengen.flex_unavailable(torch.device("cpu").type):
        return []
    rows = []
    for encoding, length in itertools.product(lengen.BIASES, lengths):
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=2, heads=4, dim=128, encoding=encoding,
                                            max_len=length)).eval()
        idx = torch.randint(0, 64, (1, length))
        positions = torch.arange(length) * (int(lengen.ALIBI_SPAN) if encoding == "alibi" else 1)

        def forward(flex_from):
            def go():
                model.pos.flex_from = flex_from  # this model alone: 0 takes flex, length + 1 blocks
                with torch.no_grad():
                    model(idx, positions)
            return go
        best = best_times({"flex": forward(0), "blocks": forward(length + 1)}, repeats)
        rows.append({"encoding": encoding, "length": length, "flex_s": best["flex"], "blocks_s": best["blocks"]})
    return rows


def hf_patch_cost(length: int, repeats: int, smollm2: bool) -> list[dict]:
    """Forward time of a Hugging Face Llama before and after patch_hf_rope (YaRN x4): the same kernels run,
    so the patch should cost nothing."""
    try:
        import transformers
    except ImportError:
        return []
    models = []
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=length)
    torch.manual_seed(0)
    models.append(("tiny random Llama", transformers.LlamaForCausalLM(config).eval(), length))
    import hf
    if smollm2 and hf.smollm2_gguf():
        models.append(("SmolLM2-135M", hf.load_llm("smollm2")[0], 2048))
    rows = []
    for label, model, n in models:
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        patched = copy.deepcopy(model)
        lengen.patch_hf_rope(patched, *lengen.yarn_frequencies(head_dim, model.config.rope_parameters["rope_theta"],
                                                               4.0, n))

        def forward(m):
            def go():
                with torch.no_grad():
                    m(ids, position_ids=torch.arange(n)[None], logits_to_keep=1)
            return go

        best = best_times({"unpatched": forward(model), "patched": forward(patched)}, repeats)
        rows.append({"model": label, "length": n, "unpatched_s": best["unpatched"], "patched_s": best["patched"],
                     "ratio": best["patched"] / best["unpatched"]})
    return rows


# Each shape: the model, and how many training steps one timed call runs; lengths: one forward each, for
# memory; hf_length: the tiny Llama's tokens in the patch-cost probe.
_DEFAULT = dict(shapes=[dict(name="4x128, T 64, batch 12", layers=4, dim=128, heads=4, length=64, batch=12, steps=10),
                        dict(name="4x256, T 256, batch 4", layers=4, dim=256, heads=8, length=256, batch=4, steps=4)],
                lengths=[4096, 8192, 16384, 32768], repeats=5, compile_rope=True, smollm2=True, hf_length=512,
                paths=[4096, 8192, 16384],
                llm=dict(length=256, steps=4), jobs=dict(experiment="ryarn", jobs=(1, 2)))
PRESETS = {
    "quick": dict(shapes=[dict(name="2x32, T 32, batch 4", layers=2, dim=32, heads=2, length=32, batch=4, steps=2)],
                  lengths=[256, 512], repeats=1, compile_rope=False, smollm2=False, hf_length=64, llm=None, paths=None,
                  jobs=None),
    "default": _DEFAULT,
    "full": _DEFAULT,  # the benchmark measures speed, not a paper's claim: its default is already its full size
}


def measure(setup: dict, threads: int | None) -> dict:
    """Every measurement, in this order, under the names results/bench.json keeps them by."""
    first, repeats = setup["shapes"][0], setup["repeats"]
    return {"training": {s["name"]: training_speed(s, s["steps"], repeats, setup["compile_rope"])
                         for s in setup["shapes"]},
            "memory": evaluation_memory(setup["lengths"], threads),
            "paths": paths_compared(setup["paths"], 2) if setup["paths"] else [],
            "hf": hf_patch_cost(setup["hf_length"], repeats + 2, setup["smollm2"]),
            "step_options": step_options(first, first["steps"], repeats, setup["compile_rope"]),
            "step_profile": step_profile(first, first["steps"]),
            "llm_throughput": llm_throughput(**setup["llm"]) if setup["llm"] else [],
            "jobs_wall_time": jobs_wall_time(**setup["jobs"]) if setup["jobs"] else []}


def peak_growth(memory: list[dict], encoding: str, lengths: list[int]) -> float:
    """How much an encoding's peak memory grows from the second longest length to the longest."""
    peak = {r["length"]: r["peak_mb"] for r in memory if r["encoding"] == encoding}
    return peak[lengths[-1]] / max(peak[lengths[-2]], 1e-9)


def vs_rope(memory: list[dict], encoding: str, length: int) -> float:
    """An encoding's forward time at `length` tokens over RoPE's, in the same run."""
    seconds = {r["encoding"]: r["seconds"] for r in memory if r["length"] == length}
    return seconds[encoding] / seconds["rope"]


def targets(data: dict, lengths: list[int]) -> list[dict]:
    """What lengen promises about its speed and memory (first shape), each with its measured value and
    whether it is met."""
    first = next(iter(data["training"].values()))
    by = {r["variant"]: r for r in first}
    growth = max(peak_growth(data["memory"], e, lengths) for e in lengen.ENCODINGS)
    slowest = min(r["speedup_vs_plain"] for r in first)
    out = [("RoPE step cost <= 1.10x NoPE", by["rope"]["cost_vs_nope"], by["rope"]["cost_vs_nope"] <= 1.10),
           ("YaRN step cost <= 1.10x NoPE", by["rope+yarn"]["cost_vs_nope"], by["rope+yarn"]["cost_vs_nope"] <= 1.10),
           ("lengen at least as fast as plain (worst variant)", slowest, slowest >= 1.0),
           (f"peak memory {lengths[-1]} / {lengths[-2]} <= 2.2x (worst encoding)", growth, growth <= 2.2)]
    slowest_bias = max(vs_rope(data["memory"], e, lengths[-1]) for e in lengen.BIASES)
    out.append((f"every bias encoding within 2x RoPE at {lengths[-1]} tokens (slowest)", slowest_bias,
                slowest_bias <= 2.0))
    out += alibi_targets(data, lengths[-1])
    if data["hf"]:
        worst = max(r["ratio"] for r in data["hf"])
        out.append(("patched HF forward <= 1.02x unpatched (worst model)", worst, worst <= 1.02))
    return [{"target": name, "measured": value, "met": ok} for name, value, ok in out]


def alibi_targets(data: dict, length: int) -> list[tuple]:
    """ALiBi through the fused kernel against RoPE: its training step in every shape, one forward at `length`
    tokens, and the peak memory of that forward."""
    out = []
    for name, rows in data["training"].items():
        by = {r["variant"]: r for r in rows}
        cost = by["rope"]["tokens_per_s"] / by["alibi"]["tokens_per_s"]
        out.append((f"ALiBi step cost <= 1.10x RoPE's ({name})", cost, cost <= 1.10))
    seconds = vs_rope(data["memory"], "alibi", length)
    peak = {r["encoding"]: r["peak_mb"] for r in data["memory"] if r["length"] == length}
    memory = peak["alibi"] / max(peak["rope"], 1e-9)
    return out + [(f"ALiBi forward at {length} tokens <= 1.3x RoPE's", seconds, seconds <= 1.3),
                  (f"ALiBi peak memory at {length} tokens <= 1.1x RoPE's", memory, memory <= 1.1)]


def run(args) -> dict:
    """Every measurement of the preset args name, with the command, the machine, the runtime and the targets."""
    start = time.perf_counter()
    setup = PRESETS[preset_name(args)]
    measured = measure(setup, args.threads)
    runtime = time.perf_counter() - start
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"{torch.get_num_threads()} threads")
    data = {"command": command_line(args), "machine": machine, "runtime_s": runtime, **measured}
    data["targets"] = targets(data, setup["lengths"])
    return data
