"""The benchmark's building blocks, a quick run of it (never asserting wall time), and its refusal of --render."""
import json
import os
import subprocess
import sys

import pytest
import torch

import eval as lengen_eval
import lengen
from experiments import bench, bench_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plain_reference_is_the_same_model():
    x = torch.randint(0, 64, (2, 16))
    for label, settings in bench.BENCH_VARIANTS:
        torch.manual_seed(0)
        model = lengen.GPT(lengen.GPTConfig(vocab_size=64, layers=2, heads=2, dim=32, original_len=16,
                                            **settings))
        with torch.no_grad():
            assert torch.allclose(model(x), bench.plain_forward(model, x), atol=1e-4), label


def test_rope_cos_sin_reused_while_positions_repeat():
    rope = lengen.Rotary(16)
    first = rope.rotary(torch.arange(10))
    assert rope.rotary(torch.arange(10)) is first
    assert rope.rotary(torch.arange(1, 11)) is not first


def test_render_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """The benchmark makes no claims, so there is nothing to decide again: bench_report.py has no decide_again.
    Bugs caught: --render re-running the whole benchmark, or rewriting results/bench.md with a note that verdicts
    were decided, or leaving an empty results/ or runs/bench/ behind; a traceback instead of one line."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--bench", "--render"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "eval.py: error: --render: bench makes no claims to decide again; run it instead"]
    assert result.stdout == "" and sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow  # ~15-20 s: the fast suite keeps under 3 minutes
def test_bench_quick_reports_consistent_ratios_and_targets(tmp_path, capfd):
    """Bug caught: a benchmark whose report contradicts its own measurements: a ratio inverted (cost vs NoPE
    as variant / NoPE, lengen vs plain upside down), a target marked met when its measured value misses it
    (or the reverse), a target measured on the wrong rows, a variant or encoding missing. Wall times
    themselves are never asserted: they depend on the machine."""
    assert lengen_eval.main(["--bench", "--quick", "--threads", "1", "--out-dir", str(tmp_path)]) == 0
    assert "USDT" not in capfd.readouterr().err  # torch.profiler's C++ lines (#35 item 25)
    md = (tmp_path / "bench.md").read_text()
    for section in ("Training steps", "Evaluation at long length", "Targets"):
        assert section in md
    data = json.loads((tmp_path / "bench.json").read_text())
    assert bench_report.markdown(data) == md  # the page is its recorded data's: nothing read from elsewhere
    variants = {r["variant"] for rows in data["training"].values() for r in rows}
    assert variants == {label for label, _ in bench.BENCH_VARIANTS}
    assert {r["encoding"] for r in data["memory"]} == set(lengen.ENCODINGS)
    assert all(r["tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0 for rows in data["training"].values()
               for r in rows)
    for rows in data["training"].values():  # every ratio from the rates it names
        nope = next(r for r in rows if r["variant"] == "nope")
        for r in rows:
            assert r["cost_vs_nope"] == pytest.approx(nope["tokens_per_s"] / r["tokens_per_s"])
            assert r["speedup_vs_plain"] == pytest.approx(r["tokens_per_s"] / r["plain_tokens_per_s"])
    assert all(r["ratio"] == pytest.approx(r["patched_s"] / r["unpatched_s"]) for r in data["hf"])
    # the step's options against the plain reference of the same turns; the profile's largest operators first
    options = {r["option"]: r for r in data["step_options"]}
    assert list(options)[:2] == ["plain reference", "lengen"] and options["lengen"]["identical"] is True
    for r in options.values():
        assert r["vs_plain"] == pytest.approx(r["tokens_per_s"] / options["plain reference"]["tokens_per_s"])
    shares = [r["share"] for r in data["step_profile"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    # every target: the measured value recomputed from the rows (first shape), and met exactly when it passes
    by = {r["variant"]: r for r in next(iter(data["training"].values()))}
    lengths = sorted({r["length"] for r in data["memory"]})
    peak = {(r["encoding"], r["length"]): r["peak_mb"] for r in data["memory"]}
    growth = max(peak[e, lengths[-1]] / max(peak[e, lengths[-2]], 1e-9) for e in lengen.ENCODINGS)
    expected = {"RoPE step cost": (by["rope"]["cost_vs_nope"], "<=", 1.10),
                "YaRN step cost": (by["rope+yarn"]["cost_vs_nope"], "<=", 1.10),
                "lengen at least as fast": (min(r["speedup_vs_plain"] for r in by.values()), ">=", 1.0),
                "peak memory": (growth, "<=", 2.2)}
    seconds = {(r["encoding"], r["length"]): r["seconds"] for r in data["memory"]}
    expected["every bias encoding within 2x RoPE"] = (
        max(seconds[e, lengths[-1]] / seconds["rope", lengths[-1]] for e in lengen.BIASES), "<=", 2.0)
    for name, rows in data["training"].items():
        speed = {r["variant"]: r["tokens_per_s"] for r in rows}
        expected[f"ALiBi step cost <= 1.10x RoPE's ({name})"] = (speed["rope"] / speed["alibi"], "<=", 1.10)
    expected["ALiBi forward"] = (seconds["alibi", lengths[-1]] / seconds["rope", lengths[-1]], "<=", 1.3)
    expected["ALiBi peak memory"] = (peak["alibi", lengths[-1]] / peak["rope", lengths[-1]], "<=", 1.1)
    # every row says its path: no bias or ALiBi -> fused; another bias at these short lengths -> blocks
    assert all(r["path"] == ("blocks" if r["encoding"] in lengen.BIASES and r["encoding"] != "alibi" else "fused")
               for r in data["memory"])
    if data["hf"]:
        expected["patched HF forward"] = (max(r["ratio"] for r in data["hf"]), "<=", 1.02)
    assert len(data["targets"]) == len(expected)
    for target in data["targets"]:
        value, comparison, bound = next(v for k, v in expected.items() if target["target"].startswith(k))
        assert target["measured"] == pytest.approx(value), target
        assert target["met"] == (value <= bound if comparison == "<=" else value >= bound), target
