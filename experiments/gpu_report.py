"""The writing of python eval.py --experiment gpu: results/gpu.md from the data experiments/gpu.py returns
(every setting it states is in the data: the preset's under "settings"). It makes no claims (nothing to decide
again) and draws no figure.
"""
from __future__ import annotations


def markdown(data: dict) -> str:
    """results/gpu.md: the device and its peak, the CUDA tests, then one table per measurement."""
    mfu = [f"{r['mfu']:.1%}" if r["mfu"] is not None else "—" for r in data["fine_tune"]]
    out = ["# The first minutes on a GPU", "",
           f"`{data['command']}`: {data['runtime_s'] / 60:.1f} min on {data['device']} (torch {data['torch']}); "
           f"bfloat16 peak {data['peak_tflops'] or '—'} TFLOP/s ({data['peak_from']}).", "",
           f"`python -m pytest -m cuda`: {data['cuda_tests']['summary'] if data['cuda_tests'] else 'not run'}.",
           "", "## Fine-tuning SmolLM2-135M-Instruct (every weight, AdamW, bf16 autocast, checkpointing)", "",
           "| tokens per sample | tokens/s | model TFLOP/s | MFU | peak memory (GiB) |", "|---:|---:|---:|---:|---:|"]
    out += [f"| {r['tokens']} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {m} | {r['peak_gib']:.1f} |"
            for r, m in zip(data["fine_tune"], mfu)]
    out += ["", f"Model FLOPs per token: 6 x {data['params']:,} weights + 12 x layers x width x tokens (PaLM's "
            "count; the forward recomputed by checkpointing is not counted).", "",
            "## One evaluation forward (YaRN over the model's 8192 tokens, bf16, no KV cache kept)", "",
            "| tokens | seconds | peak memory (GiB) |", "|---:|---:|---:|"]
    out += [f"| {r['tokens']} | {r['seconds']:.2f} | {r['peak_gib']:.1f} |" for r in data["eval_forward"]]
    out += ["", "## The small GPT's training step (4 layers x 128, 4 heads; float32)", "",
            "| encoding | batch x tokens | path | ms per step | tokens/s | vs RoPE |", "|---|---|---|---:|---:|---:|"]
    out += [f"| {r['encoding']} | {r['batch']} x {r['tokens']} | {r['path']} | {r['ms_per_step']:.2f} | "
            f"{r['tokens_per_s']:,.0f} | {r['vs_rope']:.2f}x |" for r in data["small_gpt"]]
    out += ["",
            f"## Every encoding, one forward at {data['settings']['encodings_at']} tokens (2 layers x 128, 4 heads, "
            "float32)", "", "| encoding | path | seconds | vs RoPE | peak memory (GiB) |", "|---|---|---:|---:|---:|"]
    out += [f"| {r['encoding']} | {r['path']} | {r['seconds']:.3f} | {r['vs_rope']:.2f}x | {r['peak_gib']:.2f} |"
            for r in data["encodings"]]
    if "llm_full" in data:
        full = data["llm_full"]
        out += ["", "## The llm experiment's --full design", "",
                full["skipped"] if "skipped" in full else f"`{full['command']}`: exit status {full['exit']}, "
                f"{full['minutes']:.1f} min; its results: results/full/llm.md."]
    out.append("")
    return "\n".join(out)


def figure(data: dict) -> None:
    """The GPU's numbers are tables: no figure."""
    return None
