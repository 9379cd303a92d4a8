"""The CUDA path, for the first minutes on a GPU: `python -m pytest -m cuda`. Where CUDA is absent every test
here is skipped, with the reason; the CPU tests check the same code on the CPU.

- a small GPT trains and evaluates on CUDA with every encoding, position sampler and rotary scaling, and its
  forward there equals its forward on the CPU (float32, TF32 off);
- each bias encoding's compiled flex attention (Triton) equals its query-block path on CUDA;
- an LLM fine-tune on CUDA, where bfloat16 autocast and activation checkpointing are on by themselves, with
  randomized positions: it attends across the gaps of its position ids and saves a run that reloads;
- a long prompt is scored with its KV cache on CUDA;
- the llm experiment's QA3 design (its --full, as `--experiment gpu --full` runs it) end to end, tiny;
- torchrun with NCCL trains a step of an LLM fine-tune in one process (and in two, where two GPUs exist).
"""
import os
import subprocess
import sys

import pytest
import torch

import eval
import lengen
import train

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device: torch.cuda.is_available() is False here")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--task", "copy", "--train-len", "8:16", "--steps", "5", "--eval-samples", "16", "--quiet"]
TOLERANCE = 1e-4  # float32 on both sides, TF32 off: only the order of the sums differs


def assert_cuda_forward_is_cpu_forward(out: str) -> None:
    """The run's model on CUDA and on the CPU, at contiguous and at randomized position ids."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu, cfg = eval.load_run(out, "cuda")
    cpu, _ = eval.load_run(out, "cpu")
    x = torch.randint(cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    drawn = lengen.randomized_positions(2, 16, cfg.max_position, torch.Generator().manual_seed(1))
    with torch.no_grad():
        for ids in (None, drawn):
            on_gpu = gpu(x.cuda(), None if ids is None else ids.cuda()).cpu()
            assert torch.allclose(on_gpu, cpu(x, ids), atol=TOLERANCE, rtol=TOLERANCE), \
                float((on_gpu - cpu(x, ids)).abs().max())


@pytest.mark.parametrize("positions", sorted(lengen.POSITION_SAMPLERS))
@pytest.mark.parametrize("encoding", sorted(lengen.ENCODINGS))
def test_small_gpt_trains_and_evaluates_on_cuda(tmp_path, encoding, positions):
    out = str(tmp_path / "run")
    rows = train.run([*SMALL, "--encoding", encoding, "--positions", positions, "--device", "cuda", "--out", out])["rows"]
    assert rows and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert_cuda_forward_is_cpu_forward(out)


@pytest.mark.parametrize("scaling", sorted(set(lengen.SCALINGS) - {"none"}))
def test_every_rotary_scaling_on_cuda(tmp_path, scaling):
    out = str(tmp_path / "run")
    train.run([*SMALL, "--scaling", scaling, "--factor", "2", "--device", "cuda", "--out", out])
    assert_cuda_forward_is_cpu_forward(out)


@pytest.mark.parametrize("encoding", lengen.BIASES)
def test_flex_attention_on_cuda_equals_the_block_path(encoding, monkeypatch):
    """test_flex.py's compiled check, on CUDA: uneven per-row ids, a length that ends inside a tile."""
    from test_flex import LENGTH, trained_looking, uneven_positions
    torch.backends.cuda.matmul.allow_tf32 = False
    assert lengen.flex_unavailable("cuda") is None
    model = trained_looking(encoding).cuda()
    idx, positions = torch.randint(0, 16, (2, LENGTH), device="cuda"), uneven_positions(2, LENGTH).cuda()
    with torch.no_grad():
        model.pos.flex_from = LENGTH
        assert model.attention_path(LENGTH)[0] == "flex"
        flex = model(idx, positions)
        model.pos.flex_from = LENGTH + 1
        blocks = model(idx, positions)
    assert (flex - blocks).abs().max() < TOLERANCE


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_llm_fine_tune import save_sharp_llm
    return save_sharp_llm(str(tmp_path_factory.mktemp("sharp-llama")))


def test_llm_fine_tune_on_cuda_attends_across_gaps_and_reloads(tiny_llm, tmp_path):
    """Randomized YaRN, ids from [0, 8 x 128) at once, on CUDA (bf16 autocast, activation checkpointing): the
    path on which transformers once read every gap in the ids as a new packed sequence. Changing the first
    token must change the last position's logits; the saved run must reload and score a prompt."""
    import hf
    from test_llm import gap_inputs
    out = str(tmp_path / "ryarn")
    train.run(["--llm", tiny_llm, "--task", "passkey", "--method", "ryarn", "--no-curriculum", "--range", "8",
               "--train-len", "128", "--steps", "3", "--lr", "1e-3", "--device", "cuda", "--quiet", "--out", out])
    model, tokenizer, _ = hf.load_for_eval(out, "cuda")
    ids, other, positions = gap_inputs(model)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        change = [hf.answer_logits(model, x.cuda(), positions.cuda(), 40)[0, -1].float() for x in (ids, other)]
    assert (change[0] - change[1]).abs().max() > 1e-3
    model.eval()
    score = hf.score_prompt(model, tokenizer, "The pass key is 12345 . Answer :", "12345", device="cuda", bf16=True)
    assert score["logprob"] <= 0


def test_long_prompt_is_scored_with_its_kv_cache_on_cuda(tiny_llm):
    """A prompt of about 4x the tiny model's 512-token context, scored with YaRN x8 at inference: the KV cache
    path of eval.py's LLM evaluation, on CUDA."""
    import llm_eval
    import hf
    model, tokenizer, _ = hf.load_for_eval(tiny_llm, "cuda", scaling="yarn", factor=8.0)
    row = llm_eval.evaluate_llm(model, tokenizer, "passkey", 2000, samples=2, device="cuda", bf16=True)
    assert row["samples"] == 2 and row["logprob"] <= 0


def test_the_llm_experiments_qa3_design_runs_on_cuda(tiny_llm, tmp_path, monkeypatch):
    """QA3's shape, as `python eval.py --experiment gpu --full` runs it (`--experiment llm --full --device cuda`),
    on the tiny model: a full fine-tune of each fine-tuned arm, ft+yarn read from ft's model, bf16 scoring, the
    seed-level primary comparisons written. The CPU twin: tests/test_llm.py's test of the same design."""
    import hf
    from experiments import llm
    monkeypatch.chdir(tmp_path)
    argv = llm.fine_tune_argv
    monkeypatch.setattr(llm, "fine_tune_argv", lambda *a: [tiny_llm if x == "smollm2" else x for x in argv(*a)])
    monkeypatch.setattr(hf, "smollm2_gguf", lambda: tiny_llm)
    monkeypatch.setitem(llm.PRESETS, "quick", {
        **llm.QA3, "train_len": 192, "steps": 2, "fit_every": 2, "fit_prompts": 2, "fit_bar": 0.01, "range": 4.0,
        "samples": {192: 3, 768: 3}, "methods": llm.arms(["base+yarn", "ft", "ft+yarn", "yarn", "ryarn"], 3)})
    assert eval.main(["--experiment", "llm", "--quick", "--device", "cuda", "--out-dir", "out"]) == 0
    import json
    data = json.loads((tmp_path / "out" / "llm.json").read_text())
    assert sorted(c["worse"] for c in data["comparisons"] if c["primary"]) == ["ft", "ft+yarn", "yarn"]
    assert all(r["logprob"] <= 0 for result in data["results"].values() for r in result["rows"])


@pytest.mark.parametrize("processes", [1, 2])
def test_torchrun_with_nccl_trains_a_step(tiny_llm, tmp_path, processes):
    if processes > torch.cuda.device_count():
        pytest.skip(f"needs {processes} GPUs, this machine has {torch.cuda.device_count()}")
    out = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                             str(processes), os.path.join(ROOT, "train.py"), "--llm", tiny_llm, "--task", "passkey",
                             "--method", "ryarn", "--train-len", "128", "--steps", "1", "--batch", str(processes),
                             "--device", "cuda", "--quiet", "--out", out],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isdir(os.path.join(out, "model"))
