"""The GPU command's CPU-side parts: its refusal where CUDA is absent, and the arithmetic its MFU rests on.
(What it measures needs a GPU: tests/test_cuda.py and python eval.py --experiment gpu.)"""
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
