"""Several processes (torchrun, gloo on the CPU) compute what one process computes: a fine-tune split over 2
processes (DDP, and FSDP2 with gradient accumulation) against one process with the same global batch, and an
evaluation whose prompts are shared out against one process scoring them all. The model is the tiny random
Llama of test_llm_fine_tune.py. (Skipped without transformers.)
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import train

transformers = pytest.importorskip("transformers")
from test_llm_fine_tune import ROOT, save_sharp_llm  # noqa: E402

pytestmark = pytest.mark.slow

# Randomized YaRN, positions drawn from [0, 8 x 128) from the first step: a sample trained with another
# sample's positions, or another sample, changes the loss in its third decimal.
FINE_TUNE = ["--task", "passkey", "--method", "ryarn", "--no-curriculum", "--range", "8", "--train-len", "128",
             "--steps", "3", "--lr", "1e-3", "--threads", "1", "--quiet"]


def torchrun(processes: int, script: str, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                             str(processes), os.path.join(ROOT, script), *args], capture_output=True, text=True,
                            cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]


def logged(run: str, key: str) -> list[float]:
    return [row[key] for row in map(json.loads, open(os.path.join(run, "log.jsonl"))) if key in row]


def weights(folder: str) -> dict:
    """A saved model as plain Hugging Face reloads it."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()


@pytest.fixture(scope="module")
def sharp_llm(tmp_path_factory):
    return save_sharp_llm(str(tmp_path_factory.mktemp("sharp-llama")))


@pytest.fixture(scope="module")
def one_process(sharp_llm, tmp_path_factory):
    """The reference: one process, a global batch of 4 samples in one backward each step (with LoRA too)."""
    runs = {}
    lora = importlib.util.find_spec("peft") is not None  # LoRA needs peft, an optional install
    for kind, extra in (("full", []), ("lora", ["--lora", "4"]))[: 2 if lora else 1]:
        runs[kind] = str(tmp_path_factory.mktemp("runs") / kind)
        train.run(["--llm", sharp_llm, *FINE_TUNE, *extra, "--batch", "4", "--out", runs[kind]])
    return runs


@pytest.mark.parametrize("split", [["--batch", "2"], ["--batch", "1", "--grad-accum", "2", "--fsdp", "--fit-bar", "1",
                                                     "--fit-every", "2"],
                                   ["--batch", "2", "--lora", "4"]], ids=["ddp", "fsdp2-accumulating", "ddp-lora"])
def test_two_processes_train_what_one_process_trains(sharp_llm, one_process, tmp_path, split):
    """Bug caught: processes drawing the same samples (the seed from the step and local index alone), or one
    process's samples in another order over the backwards of a step, positions drawn per process instead of
    from the one stream, a loss divided by the local batch only (gradients K times too large with
    accumulation), a log written from rank 0's samples alone, a saved model that is rank 0's shard, not the
    whole model gathered, or LoRA's adapters left out of the saved model (not merged after DDP). 2
    processes x the split must log the same loss at every step and save the same weights, which plain Hugging
    Face reloads, as one process with --batch 4; under FSDP2 with the fit check (--fit-bar) too, which must
    run on the sharded model and change nothing of the training."""
    if "--lora" in split:
        pytest.importorskip("peft")
    out = str(tmp_path / "split")
    torchrun(2, "train.py", "--llm", sharp_llm, *FINE_TUNE, *split, "--out", out)
    one = one_process["lora" if "--lora" in split else "full"]
    assert logged(out, "loss") == pytest.approx(logged(one, "loss"), abs=2e-5)
    # the size of the step's gradient, before clipping: AdamW, which scales each weight's step by its own
    # gradient's size, would hide a loss divided by the wrong number of samples
    assert logged(out, "grad_norm") == pytest.approx(logged(one, "grad_norm"), rel=1e-5)
    ours, reference = weights(os.path.join(out, "model")), weights(os.path.join(one, "model"))
    assert sorted(ours) == sorted(reference)
    base = weights(sharp_llm)
    for name, tensor in reference.items():
        assert torch.allclose(ours[name], tensor, atol=1e-6, rtol=0), name
    # the tolerance can tell: training moved the weights (LoRA's merged into them) by far more than it allows
    assert max(float((reference[n] - base[n]).abs().max()) for n in reference) > 1e-4
    config = json.load(open(os.path.join(out, "config.json")))
    assert (config["processes"], config["global_batch"]) == (2, 4)
    if "--fit-bar" in split:  # the fit check ran on the sharded model (every process forwards the prompts together)
        fit = json.load(open(os.path.join(out, "fit.json")))  # and, as the equalities above show, changed no step
        assert [step for step, _ in fit["checks"]] == [2, 3] and fit["steps_to_fit"] is None


def test_two_processes_evaluate_what_one_process_evaluates(one_process, tmp_path):
    """Bug caught: prompts shared out so that some are scored twice and some never, scores gathered out of
    prompt order, or a row computed from rank 0's share alone: the 2-process rows (accuracy, intervals, every
    prompt's scores and answer) must equal one process's."""
    args = [one_process["full"], "--task", "passkey", "--lengths", "128,256", "--samples", "3", "--threads", "1"]
    torchrun(2, "eval.py", *args, "--json", str(tmp_path / "two.json"))
    torchrun(1, "eval.py", *args, "--json", str(tmp_path / "one.json"))
    two, one = (json.load(open(tmp_path / f"{n}.json"))["rows"] for n in ("two", "one"))
    assert two == one
    assert all(len({p["answer"] for p in row["prompts"]}) == 3 for row in one)  # three prompts, not one thrice


@pytest.mark.parametrize("command", [["train.py", "--steps", "1", "--out", "run"],
                                     ["eval.py", "--experiment", "ryarn", "--quick"]], ids=["small-gpt", "experiment"])
def test_what_runs_in_one_process_is_refused_under_a_launcher(tmp_path, command):
    """torchrun spreads the LLM path only: a small GPT or an experiment started by it would run N copies
    racing for the same files. Refused in one line before anything is written (the launcher's environment,
    without a launcher)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, command[0]), *command[1:]], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "WORLD_SIZE": "2", "RANK": "0"})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--jobs" in result.stderr and os.listdir(tmp_path) == []


@pytest.mark.parametrize("case", ["bad flag", "existing run"])
def test_a_refusal_under_torchrun_is_said_once_before_the_model_loads(sharp_llm, tmp_path, case):
    """Bug caught (#24 item 15): under torchrun each process printed the same refusal; with an existing --out,
    rank 0 refused only after loading the model, and rank 1, waiting for it in the process group, died with a
    74-line gloo traceback. (torchrun then adds its own failure report and exits 1: that is the launcher's.)"""
    existing = tmp_path / "run"
    existing.mkdir()
    (existing / "config.json").write_text("{}")
    args = ["--range", "0.5", "--out", str(tmp_path / "new")] if case == "bad flag" else ["--out", str(existing)]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             os.path.join(ROOT, "train.py"), "--llm", sharp_llm, *FINE_TUNE, *args],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    said = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(said) == 1 and "gloo" not in result.stderr.lower(), result.stderr[-3000:]
    # an existing folder whose config.json is not a run's is refused as another tool's model (issue 53, item 9)
    assert ("--range 0.5" if case == "bad flag" else "holds a config.json that is not a lengen run's") in said[0]
    assert sorted(os.listdir(tmp_path)) == ["run"] and os.listdir(existing) == ["config.json"]
