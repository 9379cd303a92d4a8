"""The benchmark's building blocks, and a quick run of it (never asserting wall time)."""
import json

import torch

import eval as lengen_eval
import lengen
from experiments import bench


def test_plain_reference_is_the_same_model():
    x = torch.randint(0, 64, (2, 16))
    for label, settings in bench.BENCH_VARIANTS:
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, original_max_len=16,
                                            **settings))
        with torch.no_grad():
            assert torch.allclose(model(x), bench.plain_forward(model, x), atol=1e-4), label


def test_rope_cos_sin_reused_while_positions_repeat():
    rope = lengen.Rotary(16)
    first = rope.rotary(torch.arange(10))
    assert rope.rotary(torch.arange(10)) is first
    assert rope.rotary(torch.arange(1, 11)) is not first


def test_bench_quick_writes_every_section(tmp_path):
    assert lengen_eval.main(["--bench", "--quick", "--threads", "1", "--out-dir", str(tmp_path)]) == 0
    md = (tmp_path / "bench.md").read_text()
    for section in ("Training steps", "Evaluation at long length", "Targets"):
        assert section in md
    data = json.loads((tmp_path / "bench.json").read_text())
    variants = {r["variant"] for rows in data["training"].values() for r in rows}
    assert variants == {label for label, _ in bench.BENCH_VARIANTS}
    assert {r["encoding"] for r in data["memory"]} == set(lengen.ENCODINGS)
    assert all(r["tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0 for rows in data["training"].values()
               for r in rows)
