"""What an LLM fine-tune (train.py --llm) computes, and what eval.py measures on its run, against explicit
references: the YaRN-patched forward, a cross-entropy over the answer tokens written out by hand, and the
saved model's own greedy answers. (Skipped without transformers.)

The model is a tiny random Llama whose rope base, 5e4, is no library's default, so a schedule built from a
fallback base cannot pass for the model's own. Its query and key weights are 8x larger than at init: at init
attention is nearly uniform and a wrong rotation changes the output by little; here by O(1).
"""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

import lengen
import text_tasks
import train

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
import hf  # noqa: E402  (after the skip: hf is the LLM path)
import llm_eval  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, CONTEXT, FACTOR, HEAD_DIM = 5e4, 512, 4.0, 16


@pytest.fixture(scope="module")
def sharp_llm(tmp_path_factory):
    return save_sharp_llm(str(tmp_path_factory.mktemp("sharp-llama")))


def save_sharp_llm(folder: str) -> str:
    """A Hugging Face directory: a 2-layer random Llama (rope base 5e4, 512-token context, head dim 16) and a
    word-level tokenizer covering every word of the passkey task."""
    vocab = {"[UNK]": 0, "</s>": 1}
    for seed in range(40):
        prompt, answer = text_tasks.make_text_sample("passkey", 400, seed, lambda s: len(s.split()))
        for word in re.findall(r"\w+|[^\w\s]", prompt + " " + answer + " Answer :"):
            vocab.setdefault(word, len(vocab))
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                                         eos_token="</s>").save_pretrained(folder)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=CONTEXT, eos_token_id=1,
                                      rope_parameters={"rope_type": "default", "rope_theta": BASE})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(8)
    model.save_pretrained(folder)
    return folder


def load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def ryarn_run(sharp_llm, tmp_path_factory):
    """A 2-step Randomized YaRN x4 fine-tune, positions from the whole range [0, 8 x 128) at once (beyond L). Records what the
    loop fed (on_step) and the decoder's output of every forward, through a global module hook, so that nothing
    depends on how train_llm calls the model. lr 1e-3 moves the weights enough that the saved model answers
    otherwise than the base model, and not so far that it learns to answer nothing but </s>."""
    out = str(tmp_path_factory.mktemp("runs") / "ryarn")
    fed, decoded = [], []

    def record(module, args, output):
        if isinstance(module, transformers.LlamaModel):
            decoded.append(output.last_hidden_state.detach().clone())

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        train.run(["--llm", sharp_llm, "--task", "passkey", "--method", "ryarn", "--no-curriculum", "--factor",
                   str(FACTOR), "--range", "8", "--train-len", "128", "--steps", "2", "--lr", "1e-3", "--threads", "1", "--quiet",
                   "--out", out], on_step=lambda step, ids, positions: fed.append((ids.clone(), positions.clone())))
    finally:
        hook.remove()
    log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    return {"out": out, "fed": fed, "decoded": decoded, "log": log}


def test_fine_tune_forward_is_the_yarn_patched_forward(sharp_llm, ryarn_run):
    """Bug caught: the LLM fine-tuned without its schedule (the YaRN patch dropped or applied after the
    forward, so training runs on plain RoPE while config.json and the saved model say YaRN), with a schedule
    built from a fallback base (rope_geometry not reading the model's 5e4), or with the sampled position ids
    never reaching the model. Step 0's forward runs on the saved base weights, so an explicitly patched copy of
    those, at the same ids, must reproduce it."""
    assert hf.rope_geometry(load(sharp_llm)) == (HEAD_DIM, BASE, CONTEXT)
    ids, positions = ryarn_run["fed"][0]
    assert positions.max() >= CONTEXT  # ids beyond the model's context: where the schedule matters most
    trained = ryarn_run["decoded"][0]

    def decoder_output(base=None):
        model = load(sharp_llm)
        if base is not None:
            lengen.patch_hf_rope(model, *lengen.yarn_frequencies(HEAD_DIM, base, FACTOR, CONTEXT))
        with torch.no_grad():
            return model.model(input_ids=ids, position_ids=positions,
                               attention_mask=torch.ones_like(ids)).last_hidden_state

    assert torch.allclose(trained, decoder_output(BASE), atol=1e-5)
    # the comparison can tell: plain RoPE, or YaRN from the default base 1e4, give another forward
    assert (trained - decoder_output()).abs().max() > 0.1
    assert (trained - decoder_output(10000.0)).abs().max() > 0.1


def test_answer_only_loss_is_on_exactly_the_answer_tokens(sharp_llm, ryarn_run):
    """Bug caught: the answer-only loss shifted by one token (taking the last prompt token as a target, or
    dropping the end-of-turn token, or predicting each token from itself), or taken over the whole sequence.

    By hand: the prompt ends with 'Answer :', the targets are the tokens after it (the passkey, then </s>),
    each predicted from the position before it."""
    ids, _ = ryarn_run["fed"][0]
    ids = ids[0].tolist()
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(sharp_llm)
    answer_at = max(t for t in range(len(ids) - 1) if tokenizer.convert_ids_to_tokens(ids[t:t + 2]) == ["Answer", ":"]) + 2
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[answer_at:-1]).isdigit()
    with torch.no_grad():  # the logits of the training forward itself: its decoder output, the base model's head
        logits = load(sharp_llm).lm_head(ryarn_run["decoded"][0][0]).double()

    def cross_entropy(first, last):
        """Mean of -log p(token t | tokens before t) for t = first .. last - 1, term by term."""
        terms = [-(logits[t - 1].log_softmax(-1)[ids[t]]) for t in range(first, last)]
        return float(sum(terms) / len(terms))

    logged = ryarn_run["log"][0]["loss"]  # rounded to 5 decimals
    assert logged == pytest.approx(cross_entropy(answer_at, len(ids)), abs=2e-5)
    # the tolerance can tell: one token more, one fewer, or the whole sequence is another loss, 10x beyond it
    for first, last in ((answer_at - 1, len(ids)), (answer_at + 1, len(ids)), (answer_at, len(ids) - 1), (1, len(ids))):
        assert abs(logged - cross_entropy(first, last)) > 2e-4, (first, last)


def test_eval_measures_an_llm_run_with_its_saved_schedule(sharp_llm, ryarn_run, tmp_path):
    """Bug caught: eval.py, given an LLM run directory, evaluating something other than the run's fine-tuned
    model with its saved YaRN (the base model, or the run's weights read back as plain RoPE): its answers
    must be those of the saved model as Hugging Face itself reloads it."""
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), ryarn_run["out"], "--task", "passkey",
                             "--lengths", "128,256", "--samples", "3", "--json", str(out), "--threads", "1"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["model"] == "ryarn" and [r["length"] for r in data["rows"]] == [128, 256]
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(sharp_llm)
    saved = load(os.path.join(ryarn_run["out"], "model"))
    assert saved.config.rope_parameters["rope_type"] == "yarn"

    def answers(model):
        return [[e["said"] for e in llm_eval.evaluate_llm(model, tokenizer, "passkey", n, 3)["prompts"]]
                for n in (128, 256)]

    said = [[e["said"] for e in r["prompts"]] for r in data["rows"]]
    assert said == answers(saved)
    # the comparison can tell: the base model, and the fine-tuned weights under plain RoPE, answer otherwise
    plain = load(os.path.join(ryarn_run["out"], "model"))
    lengen.patch_hf_rope(plain, *lengen.rope_frequencies(HEAD_DIM, BASE))
    assert said != answers(load(sharp_llm)) and said != answers(plain)


def test_a_later_sample_too_long_for_train_len_is_one_line(sharp_llm, tmp_path, capsys):
    """Bug caught: --train-len was checked on sample 0 alone, so a later sample whose facts need more tokens
    (here step 3's, at 120 tokens) ended the fine-tune with a traceback. Now: one line, exit 2, no run left."""
    previous = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM a Ctrl-C; this process gets its own back
    try:
        assert train.main(["--llm", sharp_llm, "--task", "babilong", "--method", "ft", "--train-len", "120",
                           "--steps", "5", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")]) == 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--train-len 120: step 3:" in err, err
    assert os.listdir(tmp_path) == []


def test_the_fit_check_scores_held_out_prompts_and_stops_at_the_bar(sharp_llm, tmp_path, monkeypatch):
    """Bug caught: the LLM fit check (--fit-bar) scoring training samples or the test prompts instead of its own,
    at another length, in train mode (dropout on), not stopping once the bar is reached, going on in eval mode,
    or fit.json not saying when. The scorer is replaced by one that records what it is asked and answers right
    on a planned share of the prompts: half at the first check, all at the second (bar 0.9), so training must
    stop at step 4 of 10, with two checks."""
    import finetune
    asked, modes = [], []
    right = iter([i < finetune.FIT_PROMPTS // 2 for i in range(finetune.FIT_PROMPTS)] + [True] * finetune.FIT_PROMPTS)

    def scorer(model, tokenizer, prompt, answer, candidates=(), device="cpu", bf16=False):
        asked.append((prompt, answer))
        modes.append(model.training)
        return {"right": next(right), "said": "", "rank": None, "logprob": 0.0}

    monkeypatch.setattr(hf, "score_prompt", scorer)
    trained = []
    out = str(tmp_path / "run")
    train.run(["--llm", sharp_llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--steps", "10",
               "--fit-bar", "0.9", "--fit-every", "2", "--threads", "1", "--quiet", "--out", out],
              on_step=lambda step, ids, positions: trained.append(step))
    assert trained == [0, 1, 2, 3]  # stopped after the check at step 4
    fit = json.load(open(os.path.join(out, "fit.json")))
    assert fit == {"bar": 0.9, "every": 2, "stop": True, "checks": [[2, 0.5], [4, 1.0]], "steps_to_fit": 4,
                   "first_fit": 4}
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(sharp_llm)
    held_out = [hf.text_sample(tokenizer, "passkey", 128, finetune.FIT_SEED + i, {})
                for i in range(finetune.FIT_PROMPTS)]
    assert asked == held_out * 2 and not any(modes)
    test_prompts = {hf.text_sample(tokenizer, "passkey", 128, 10 ** 9 + i, {}) for i in range(finetune.FIT_PROMPTS)}
    assert not test_prompts & set(held_out)
    log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert [r["fit_accuracy"] for r in log if "fit_accuracy" in r] == [0.5, 1.0]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4]


def test_no_fit_stop_trains_every_step_and_fit_prompts_sets_the_checks_prompts(sharp_llm, tmp_path, monkeypatch):
    """A probe reads an LLM's fit over its whole budget: --no-fit-stop trains every step past the bar and judges
    the fit at the last check; --fit-prompts N answers N held-out prompts at each check (the next N seeds of
    the fit check's own). Bugs caught: the run stopping at the bar anyway, the default count used, a bad count
    taken."""
    import finetune
    asked = []

    def scorer(model, tokenizer, prompt, answer, candidates=(), device="cpu", bf16=False):
        asked.append(prompt)
        return {"right": len(asked) % 5 != 0, "said": "", "rank": None, "logprob": 0.0}  # 4 of every 5 right

    monkeypatch.setattr(hf, "score_prompt", scorer)
    trained, out = [], str(tmp_path / "run")
    train.run(["--llm", sharp_llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--steps", "6",
               "--fit-bar", "0.5", "--fit-every", "2", "--no-fit-stop", "--fit-prompts", "5", "--threads", "1",
               "--quiet", "--out", out], on_step=lambda step, ids, positions: trained.append(step))
    assert trained == list(range(6))  # on past the bar at step 2
    fit = json.load(open(os.path.join(out, "fit.json")))
    assert fit == {"bar": 0.5, "every": 2, "stop": False, "checks": [[2, 0.8], [4, 0.8], [6, 0.8]],
                   "steps_to_fit": 6, "first_fit": 2}
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(sharp_llm)
    assert asked == [hf.text_sample(tokenizer, "passkey", 128, finetune.FIT_SEED + i, {})[0] for i in range(5)] * 3
    for flags, message in ((["--fit-prompts", "0", "--fit-bar", "0.5"], "--fit-prompts 0: "),
                           (["--fit-prompts", "8"], "--fit-prompts 8: ")):
        with pytest.raises(train.UsageError, match=message):
            train.run(["--llm", sharp_llm, "--task", "passkey", "--train-len", "128", *flags, "--out", out, "--force"])


def test_the_fit_check_trains_on_in_train_mode_between_checks(sharp_llm, tmp_path, monkeypatch):
    """Bug caught: the fit check leaving the model in eval mode, so the steps after it train without dropout (and
    whatever else a module does only in training); and fit.json saying nothing of a run that never fitted."""
    import finetune
    monkeypatch.setattr(hf, "score_prompt", lambda *a, **k: {"right": False})
    seen = []
    real = finetune.take_step

    def take_step(model, *args, **kwargs):
        seen.append(model.training)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(finetune, "take_step", take_step)
    train.run(["--llm", sharp_llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--steps", "3",
               "--fit-bar", "0.9", "--fit-every", "1", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")])
    assert seen == [True, True, True]
    fit = json.load(open(os.path.join(str(tmp_path / "run"), "fit.json")))
    assert fit["checks"] == [[1, 0.0], [2, 0.0], [3, 0.0]] and fit["steps_to_fit"] is None


def test_a_fine_tune_cut_short_resumes_from_its_checkpoint_to_the_same_model(sharp_llm, tmp_path, monkeypatch):
    """--checkpoint-every N: a fine-tune killed part way goes on with --resume from its last checkpoint and saves
    the very model an uninterrupted run saves, its log and fit checks each step once; the checkpoint goes once
    the model is saved. Bugs caught: the optimizer's state, the position ids' generator (ryarn) or the fit checks
    not restored; the log keeping the steps trained past the checkpoint (logged twice); the checkpoint left; a
    model/ saved just before a kill blocking the resumed run's (no rename onto a folder); a checkpoint made
    before train.py gained a flag refused; a log garbled by a power cut a traceback."""
    import finetune
    monkeypatch.setattr(hf, "score_prompt", lambda *a, **k: {"right": True})
    argv = ["--llm", sharp_llm, "--task", "passkey", "--method", "ryarn", "--range", "4", "--train-len", "128",
            "--steps", "6", "--fit-bar", "0.5", "--fit-every", "3", "--no-fit-stop", "--checkpoint-every", "2",
            "--threads", "1", "--quiet"]
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    train.run(argv + ["--out", whole])

    def killed(step, ids, positions):
        if step == 5:  # steps 1-5 trained and logged, the last checkpoint at 4
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train.run(argv + ["--out", cut], on_step=killed)
    assert os.path.isfile(os.path.join(cut, finetune.CHECKPOINT)) and not os.path.isdir(os.path.join(cut, "model"))
    # killed as its model was saved, before the checkpoint went: that model/ is replaced by the resumed run's
    os.makedirs(os.path.join(cut, "model"))
    open(os.path.join(cut, "model", "stale"), "w").close()
    # a flag train.py gained since the run began, left unset, is no difference
    config = json.load(open(os.path.join(cut, "config.json")))
    assert config.pop("fsdp") is False
    json.dump(config, open(os.path.join(cut, "config.json"), "w"))
    with open(os.path.join(cut, "log.jsonl"), "ab") as f:  # a power cut: NUL bytes, a line cut short
        f.write(b'\x00\x00\x00\n{"step": 6, "lo')
    trained = []
    train.run(argv + ["--out", cut, "--resume"], on_step=lambda step, ids, positions: trained.append(step))
    assert trained == [4, 5]
    a, b = (transformers.AutoModelForCausalLM.from_pretrained(os.path.join(d, "model")).state_dict()
            for d in (whole, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = [[json.loads(line) for line in open(os.path.join(d, "log.jsonl"))] for d in (whole, cut)]
    assert [r["step"] for r in logs[1]] == [r["step"] for r in logs[0]] == [1, 2, 3, 3, 4, 5, 6, 6]
    assert [r.get("loss") for r in logs[1]] == [r.get("loss") for r in logs[0]]
    assert json.load(open(os.path.join(cut, "fit.json"))) == json.load(open(os.path.join(whole, "fit.json")))
    assert not os.path.exists(os.path.join(cut, finetune.CHECKPOINT))
    assert not os.path.exists(os.path.join(whole, finetune.CHECKPOINT))


def test_resume_refuses_another_recipe_or_no_checkpoint(sharp_llm, tmp_path, monkeypatch):
    """--resume goes on only with the run's own command (but for how it runs) from a checkpoint: one line
    otherwise, and the run's files stay. Bugs caught: a run resumed with another learning rate (a model no
    command describes), or from a folder with no checkpoint."""
    import finetune
    argv = ["--llm", sharp_llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--steps", "4",
            "--checkpoint-every", "2", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")]

    def killed(step, ids, positions):
        if step == 3:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        train.run(argv, on_step=killed)
    files = sorted(os.listdir(tmp_path / "run"))
    with pytest.raises(train.UsageError, match=r"started by another command \(lr differ\)"):
        train.run(argv + ["--resume", "--lr", "1e-3"])
    with pytest.raises(train.UsageError, match="give one"):
        train.run(argv + ["--resume", "--force"])
    config = json.load(open(tmp_path / "run" / "config.json"))
    json.dump({**config, "bogus": 3}, open(tmp_path / "run" / "config.json", "w"))  # a flag set, that is gone now
    with pytest.raises(train.UsageError, match=r"started by another command \(bogus differ\)"):
        train.run(argv + ["--resume"])
    json.dump(config, open(tmp_path / "run" / "config.json", "w"))
    assert sorted(os.listdir(tmp_path / "run")) == files
    os.remove(tmp_path / "run" / finetune.CHECKPOINT)
    with pytest.raises(train.UsageError, match="no checkpoint to resume"):
        train.run(argv + ["--resume"])
    with pytest.raises(train.UsageError, match="--checkpoint-every 0: "):
        train.run(argv[:-2] + ["--checkpoint-every", "0", "--out", str(tmp_path / "other")])
