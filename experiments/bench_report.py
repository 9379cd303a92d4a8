"""The writing of python eval.py --bench: results/bench.md from the data experiments/bench.py returns, one
section per measurement in the order bench.measure() takes them, then the targets. The benchmark makes no
claims (nothing to decide again) and draws no figure.

Everything the page states is read from the data: the lengths from the memory rows, the first shape from the
training tables' order; the LLM fine-tune's sample length and steps, which the data do not record, from the
preset its recorded command names.
"""
from __future__ import annotations

import lengen
from experiments.bench import PRESETS, peak_growth, vs_rope


def speed_section(speed: dict) -> list[str]:
    """A table of training steps per shape: each variant's tokens/s against NoPE and its plain reference."""
    md = []
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
    return md


def memory_section(memory: list[dict], lengths: list[int]) -> list[str]:
    """One forward per encoding and length: peak memory, time, the attention path taken and why."""
    last = lengths[-1]
    md = ["\n## Evaluation at long length (2 layers x 128, 4 heads, batch 1, one forward)\n",
          "Path: `fused` torch's causal SDPA (no bias); `flex` the encoding's score_mod in compiled flex attention; "
          "`blocks` the bias built a block of queries at a time. A flex row's time is its second forward; the "
          "first, which compiles, is in the last column.\n",
          "| encoding | path | " + " | ".join(f"{n} tokens" for n in lengths)
          + f" | peak {last} / {lengths[-2]} | time vs RoPE at {last} | first forward at {last} |",
          "|---|---|" + "---:|" * (len(lengths) + 3)]
    for encoding in lengen.ENCODINGS:
        rows = {r["length"]: r for r in memory if r["encoding"] == encoding}
        paths = " / ".join(dict.fromkeys(rows[n]["path"] for n in lengths))
        cells = [f"{rows[n]['peak_mb']:.0f} MB, {rows[n]['seconds']:.1f} s" for n in lengths]
        first = rows[last]["first_forward_s"]
        md.append(f"| {encoding} | {paths} | " + " | ".join(cells) + f" | {peak_growth(memory, encoding, lengths):.2f}x"
                  f" | {vs_rope(memory, encoding, last):.2f}x | {'—' if first is None else f'{first:.1f} s'} |")
    reasons = dict.fromkeys(f"{r['path']}: {r['why']}" for r in memory if r["path"] != "fused")
    return md + ["", "Why: " + "; ".join(reasons) + "." if reasons else ""]


def paths_section(paths: list[dict]) -> list[str]:
    """Each bias encoding through flex attention against query blocks (none where flex is unavailable)."""
    if not paths:
        return []
    md = ["\n## Flex attention or query blocks (the same models, one process, best of 2 after a first forward)\n",
          "| encoding | tokens | flex | blocks | blocks / flex |", "|---|---:|---:|---:|---:|"]
    return md + [f"| {r['encoding']} | {r['length']} | {r['flex_s']:.2f} s | {r['blocks_s']:.2f} s | "
                 f"{r['blocks_s'] / r['flex_s']:.2f}x |" for r in paths]


def step_section(data: dict, shape_name: str) -> list[str]:
    """The RoPE step: its profile, then every option's speed."""
    md = [f"\n## The RoPE training step, {shape_name}: where its time goes, and what makes it faster\n",
          "| operator (torch.profiler) | share of the step's CPU time | calls per step |", "|---|---:|---:|"]
    md += [f"| {r['operator']} | {r['share']:.1%} | {r['calls_per_step']:g} |" for r in data["step_profile"]]
    md += ["", "| step | tokens/s | vs the plain reference | weights bit-identical to lengen's default |",
           "|---|---:|---:|---|"]
    md += [f"| {r['option']} | {r['tokens_per_s']:,.0f} | {r['vs_plain']:.2f}x | "
           f"{'n/a' if r['identical'] is None else 'yes' if r['identical'] else 'no'} |" for r in data["step_options"]]
    return md


def hf_section(hf: list[dict]) -> list[str]:
    """A Hugging Face forward before and after patch_hf_rope (none without transformers)."""
    if not hf:
        return []
    md = ["\n## Patched Hugging Face forward (YaRN x4 through patch_hf_rope)\n",
          "| model | tokens | unpatched | patched | ratio |", "|---|---:|---:|---:|---:|"]
    return md + [f"| {r['model']} | {r['length']} | {r['unpatched_s']:.3f} s | {r['patched_s']:.3f} s | "
                 f"{r['ratio']:.3f} |" for r in hf]


def recorded_preset(command: str) -> str:
    """The preset a recorded bench command ran: --quick, --full, or the default."""
    words = command.split()
    return next((preset for preset in ("quick", "full") if f"--{preset}" in words), "default")


def llm_section(data: dict) -> list[str]:
    """train.py --llm's throughput in 1 and 2 processes. Its sample length and steps are not in the data: they
    are the recorded command's preset's (bench.PRESETS)."""
    if not data["llm_throughput"]:
        return []
    llm = PRESETS[recorded_preset(data["command"])]["llm"]
    md = [f"\n## LLM fine-tuning throughput (train.py --llm smollm2 --method ryarn, {llm['length']}-token samples, "
          f"{llm['steps']} steps, 1 torch thread per process, CPU, gloo)\n",
          "| processes | training tokens/s (all processes) |", "|---|---:|"]
    return md + [f"| {r['processes']} | {r['tokens_per_s']:,} |" for r in data["llm_throughput"]]


def jobs_section(jobs: list[dict]) -> list[str]:
    """An experiment's wall time at each --jobs N, against --jobs 1."""
    if not jobs:
        return []
    md = [f"\n## --jobs: wall time of `python eval.py --experiment {jobs[0]['experiment']} --quick --threads 1 "
          "--jobs N`\n", "| N | wall time | vs --jobs 1 |", "|---:|---:|---:|"]
    return md + [f"| {r['jobs']} | {r['wall_s']:.1f} s | {jobs[0]['wall_s'] / r['wall_s']:.2f}x |" for r in jobs]


def targets_section(data: dict) -> list[str]:
    """What lengen promises about its speed and memory, each measured and met or not (bench.targets)."""
    md = [f"\n## Targets (first shape: {next(iter(data['training']))})\n", "| target | measured | met |",
          "|---|---:|---|"]
    return md + [f"| {t['target']} | {t['measured']:.2f} | {'yes' if t['met'] else 'no'} |" for t in data["targets"]]


def markdown(data: dict) -> str:
    """results/bench.md. The lengths are the memory rows' (measured in the preset's order), the first shape the
    first training table's."""
    lengths = list(dict.fromkeys(r["length"] for r in data["memory"]))
    md = [f"# Speed and memory\n\n`{data['command']}` on {data['machine']}; {data['runtime_s']:.0f} s.\n",
          "Timings are the best of repeats; ratios compare variants measured in the same run.\n"]
    md += speed_section(data["training"]) + memory_section(data["memory"], lengths) + paths_section(data["paths"])
    md += hf_section(data["hf"]) + step_section(data, next(iter(data["training"])))
    md += llm_section(data) + jobs_section(data["jobs_wall_time"]) + targets_section(data)
    return "\n".join(md) + "\n"


def figure(data: dict) -> None:
    """The benchmark's numbers are tables: no figure."""
    return None
