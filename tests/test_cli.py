"""train.py and eval.py as a user meets them: learning, round trips, bad input, determinism, resume."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "retrieval", "--offset", "1", "--train-len", "8:16", "--layers", "1", "--heads", "1",
        "--dim", "32", "--no-mlp", "--batch", "32", "--lr", "3e-3", "--warmup", "20", "--threads", "1",
        "--eval-samples", "64", "--quiet"]


def cli(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def in_process(script, args, capfd):
    """(exit status, stderr) of train.py's or eval.py's main() in this process, much faster than a new one per
    case; stderr captured at the file descriptor, so that a warning from any library counts as a line too."""
    import importlib
    previous = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM a Ctrl-C
    capfd.readouterr()
    try:
        code = importlib.import_module(script).main([str(a) for a in args])
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, capfd.readouterr().err


def set_steps(run_dir, steps):
    """Rewrite a run's config.json to `steps` in all: a run trained to fewer then reads as one stopped part-way
    (as a kill leaves it), and --resume takes it on to `steps`."""
    path = os.path.join(run_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "steps": steps}, f)


def weights(run_dir):
    return torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=False)["model"]


def test_tiny_model_learns_retrieval_offset_one(tmp_path):
    result = train.run(TINY + ["--steps", "300", "--out", str(tmp_path / "r")])
    at_train_len = result["rows"][0]
    assert at_train_len["length"] == 16 and at_train_len["accuracy"] >= 0.9


def test_train_then_eval_round_trip(tmp_path):
    run = str(tmp_path / "r")
    trained = cli("train.py", *TINY, "--steps", "200", "--out", run)
    assert trained.returncode == 0, trained.stderr
    assert {"config.json", "checkpoint.pt", "log.jsonl", "final.json"} <= set(os.listdir(run))
    log = [json.loads(line) for line in open(os.path.join(run, "log.jsonl"))]
    assert log[-1]["step"] == 200 and log[-1]["loss"] < log[0]["loss"]
    out = tmp_path / "e.json"
    evaluated = cli("eval.py", run, "--lengths", "16,32", "--samples", "64", "--threads", "1", "--json", str(out))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "| 16 |" in evaluated.stdout and "| 32 |" in evaluated.stdout
    rows = json.loads(out.read_text())["rows"]
    final = json.loads(open(os.path.join(run, "final.json")).read())
    # eval.py measures the saved model on the same held-out sequences train.py measured at the end
    assert rows[0]["accuracy"] == final[0]["accuracy"]


def test_same_seed_same_numbers(tmp_path):
    a = train.run(TINY + ["--steps", "40", "--out", str(tmp_path / "a")])
    b = train.run(TINY + ["--steps", "40", "--out", str(tmp_path / "b")])
    c = train.run(TINY + ["--steps", "40", "--seed", "1", "--out", str(tmp_path / "c")])
    wa, wb, wc = weights(a["run"]), weights(b["run"]), weights(c["run"])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert a["rows"] == b["rows"]


def test_interrupted_run_resumes_to_the_same_numbers(tmp_path):
    args = TINY + ["--steps", "400", "--save-every", "1000", "--positions", "randomized", "--max-position", "64"]
    whole = train.run(args + ["--out", str(tmp_path / "whole")])
    run = str(tmp_path / "cut")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args, "--out", run], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = os.path.join(run, "log.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(log) and os.path.getsize(log) > 0):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C in the middle of training
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    stopped_at = torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)["step"]
    assert 0 < stopped_at < 400 and "--resume" in err
    resumed = cli("train.py", "--resume", "--out", run, "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    wa, wb = weights(whole["run"]), weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads(open(os.path.join(run, "final.json")).read()) == whole["rows"]


def test_resume_of_a_finished_forced_run_keeps_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative --out, resumed from another directory, still means that run
    first = train.run(TINY + ["--steps", "30", "--force", "--out", "relative-run"])
    log_before = open("relative-run/log.jsonl").read()
    weights_before = weights("relative-run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = train.run(["--resume", "--out", str(tmp_path / "relative-run"), "--quiet"])
    assert again["rows"] == first["rows"] and not (elsewhere / "relative-run").exists()
    assert open(tmp_path / "relative-run" / "log.jsonl").read() == log_before  # nothing was retrained
    after = weights(str(tmp_path / "relative-run"))
    assert all(torch.equal(after[k], weights_before[k]) for k in after)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("runs") / "learned")
    train.run(TINY + ["--steps", "5", "--encoding", "learned", "--max-len", "64", "--out", run])
    return run


BAD_TRAIN = [
    (["--task", "sorting"], "invalid choice"),
    (["--encoding", "sine"], "invalid choice"),
    (["--scaling", "longrope"], "invalid choice"),
    (["--positions", "shuffled"], "invalid choice"),
    (["--scaling", "yarn", "--factor", "0.5"], ">= 1"),
    (["--positions", "randomized", "--max-position", "10", "--train-len", "24"], "must be >= the training length"),
    (["--encoding", "learned", "--max-len", "16", "--train-len", "24"], "learned table"),
    (["--curriculum", "32:abc"], "START:END"),
    (["--task", "shift", "--delays", "3:5"], "takes no --delays"),
    (["--offset", "5", "--train-len", "5:24"], "offset < length"),
    (["--init", "/nonexistent/run"], "not a run directory"),
    (["--heads", "0"], ">= 1"),
    (["--eval-samples", "-1"], ">= 0"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--threads", "0"], "--threads"),
    (["--device", "foo"], "unknown --device"),
    (["--symbols", "0"], "--symbols must be >= 1"),
    (["--positions", "randomized", "--curriculum", "30:25"], "START <= END"),
    (["--scaling", "yarn", "--factor", "2", "--rope-base", "1"], "base must be > 1"),
    (["--encoding", "sinusoidal", "--dim", "31", "--heads", "1"], "must be even"),
    (["--method", "ft"], "is for --llm runs"),
    # issue 53, item 17: no bound, and the model was built for ever (minutes, then out of memory)
    (["--layers", "1000000"], "GiB; this machine has"),
    (["--dim", "64", "--layers", "2", "--encoding", "alibi", "--alibi-slope-heads", "100000000"],
     "at most 128 (64 x --heads)"),
]


@pytest.mark.parametrize("args, message", BAD_TRAIN)
def test_bad_train_input_exits_2_with_one_line(tmp_path, capfd, args, message):
    code, err = in_process("train", ["--steps", "2", "--quiet", "--out", tmp_path / "r", *args], capfd)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_unwritable_out_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = cli("train.py", "--steps", "2", "--quiet", "--out", str(blocker / "run"))
    assert result.returncode == 2 and "cannot write" in result.stderr and "Traceback" not in result.stderr


def test_existing_run_is_never_overwritten_without_force(trained_run):
    before = open(os.path.join(trained_run, "checkpoint.pt"), "rb").read()
    result = cli("train.py", *TINY, "--steps", "3", "--out", trained_run)
    assert result.returncode == 2 and "--force" in result.stderr
    assert open(os.path.join(trained_run, "checkpoint.pt"), "rb").read() == before


def test_bad_eval_input_exits_2(trained_run, tmp_path, capfd):
    """Bug caught: an eval.py input that ends in a traceback, in more than one line, or is silently evaluated
    anyway: among them bad overrides of a run's schedule (--factor below 1, --original-len 0) and LLM options
    an LLM evaluation would ignore (checked before any model is loaded)."""
    rope = train.run(TINY + ["--steps", "2", "--out", str(tmp_path / "rope")])["run"]
    missing_llm = str(tmp_path / "no-such-llm")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text(open(os.path.join(trained_run, "config.json")).read())
    (corrupt / "checkpoint.pt").write_bytes(b"\x80\x04 not a checkpoint")
    wider = tmp_path / "wider"  # its config.json edited by hand: the weights are for dim 32
    wider.mkdir()
    (wider / "checkpoint.pt").write_bytes(open(os.path.join(trained_run, "checkpoint.pt"), "rb").read())
    (wider / "config.json").write_text(json.dumps({**json.load(open(os.path.join(trained_run, "config.json"))),
                                                   "dim": 64}))
    cases = [
        # issue 53, item 27: torch's first line, "Error(s) in loading state_dict for GPT:", said nothing
        ((str(wider),), "tok.weight is (17, 32) in the weights, (17, 64) in the model"),
        ((str(tmp_path / "missing"),), "not a run directory"),
        ((str(corrupt),), "corrupt"),
        ((trained_run, "--lengths", "32,128"), "beyond the learned position table"),
        ((trained_run, "--delays", "0:4"), "needs a delay task"),
        ((trained_run, "--lengths", "a,b"), "comma-separated"),
        (("--experiment", "nonsense"), "unknown experiment"),
        ((rope, "--scaling", "yarn", "--factor", "0.5"), "factor must be >= 1"),
        ((rope, "--scaling", "yarn", "--factor", "2", "--original-len", "0"), "original_len > 0"),
        ((trained_run, "--scaling", "yarn", "--factor", "2"), "needs encoding 'rope'"),
        (("--llm", missing_llm), "no such model directory"),
        (("--llm", missing_llm, "--scaling", "yarn", "--factor", "0.5"), "factor must be >= 1"),
        (("--llm", missing_llm, "--scaling", "pi"), "--scaling pi"),
        (("--llm", missing_llm, "--factor", "2"), "--factor needs --scaling yarn"),
        (("--llm", missing_llm, "--original-len", "100"), "--original-len"),
        # issue 53, item 24: accepted, then ignored
        (("--llm", missing_llm, "--plot", str(tmp_path / "llm.png")), "or an LLM's length x depth grid (--depths)"),
        (("--llm", missing_llm, "--delays", "0:4"), "--delays is for a small GPT's delay tasks"),
        (("--llm", missing_llm, "--depths", "0,1.5"), "depths lie in [0, 1]"),
        (("--llm", missing_llm, "--depths", "a"), "comma-separated list of depths"),
        (("--llm", missing_llm, "--depths", "0,0.5,0"), "each depth once"),
        (("--llm", missing_llm, "--threshold", "1"), "--threshold must lie in [0, 1)"),
        (("--llm", missing_llm, "--task", "mrcr", "--depths", "0.5"), "mrcr hides nothing at a depth"),
        ((trained_run, "--depths", "0.5"), "small-GPT task hides nothing"),
        ((trained_run, "--threshold", "0.5"), "sets an LLM's effective length"),
        # issue 54: several scalings, the passkey template, sequential sampling, bf16
        (("--llm", missing_llm, "--scaling", "yarn,nope"), "'nope' is not a scaling"),
        (("--llm", missing_llm, "--scaling", "none,yarn,none"), "each at most once"),
        (("--llm", missing_llm, "--task", "passkey", "--sequential"), "give --depths"),
        (("--llm", missing_llm, "--template", "varied"), "--template is passkey's"),
        ((trained_run, "--bf16"), "--bf16 is for an LLM's text task"),
        ((rope, "--scaling", "yarn,pi", "--factor", "2"), "under one scaling at a time"),
        (("--experiment", "retrieval", "--depths", "0.5"), "leave out --depths"),
        # issue 50: --cache keeps an LLM's prompt scores
        ((trained_run, "--cache", str(tmp_path / "scores.jsonl")), "--cache is for an LLM's text task"),
        (("--experiment", "retrieval", "--cache", str(tmp_path / "scores.jsonl")), "leave out --cache"),
        (("--llm", missing_llm, "--cache", os.path.join(trained_run, "config.json")), "that is a file of the run"),
    ]
    for args, message in cases:
        code, err = in_process("eval", args, capfd)
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, (args, err)


def test_eval_of_an_unfinished_run_says_where_it_stands(tmp_path, capsys):
    """#35 item 27: a run stopped at step 20 of 40 is evaluated as it is, and says so; a finished run, or one
    stopped at its --fit-bar, says nothing. Bug caught: a half-trained model's table read as the trained one's."""
    import eval as lengen_eval
    run = str(tmp_path / "r")
    train.run(TINY + ["--steps", "20", "--eval-samples", "0", "--out", run])
    assert lengen_eval.main([run, "--lengths", "16", "--samples", "8", "--threads", "1"]) == 0
    assert "unfinished" not in capsys.readouterr().out
    set_steps(run, 40)  # as a run killed at step 20 of 40 leaves it
    assert lengen_eval.main([run, "--lengths", "16", "--samples", "8", "--threads", "1"]) == 0
    assert "unfinished: its checkpoint is at step 20 of 40" in capsys.readouterr().out
    with open(os.path.join(run, "fit.json"), "w") as f:
        json.dump({"bar": 0.5, "every": 10, "checks": [[20, 0.6]], "steps_to_fit": 20}, f)
    assert lengen_eval.main([run, "--lengths", "16", "--samples", "8", "--threads", "1"]) == 0
    assert "unfinished" not in capsys.readouterr().out
    # issue 51: a run trained every step (--no-fit-stop) does not stop at the bar; at it at step 20 of 40, it
    # is still unfinished
    with open(os.path.join(run, "fit.json"), "w") as f:
        json.dump({"bar": 0.5, "every": 10, "stop": False, "checks": [[20, 0.6]], "steps_to_fit": 20}, f)
    assert lengen_eval.main([run, "--lengths", "16", "--samples", "8", "--threads", "1"]) == 0
    assert "unfinished: its checkpoint is at step 20 of 40" in capsys.readouterr().out


def test_plot_is_written_in_the_format_its_name_says(trained_run, tmp_path):
    """Issue 53, item 14: --plot x.pdf and x.svg held PNG bytes under those names (a viewer refuses them)."""
    pytest.importorskip("matplotlib")
    import eval as lengen_eval
    magic = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}
    for ending, start in magic.items():
        path = tmp_path / f"accuracy.{ending}"
        assert lengen_eval.main([trained_run, "--lengths", "16", "--samples", "4", "--threads", "1",
                                 "--plot", str(path)]) == 0
        assert path.read_bytes().startswith(start), ending


def test_a_fitted_run_without_its_fit_json_is_not_called_unfinished(tmp_path, capsys):
    """Issue 53, item 29: a run that stopped at its --fit-bar before --steps was called "unfinished" once its
    fit.json was gone; the checkpoint holds the same fit record."""
    import eval as lengen_eval
    run = str(tmp_path / "r")
    train.run(TINY + ["--steps", "400", "--fit-bar", "0.5", "--fit-every", "10", "--eval-samples", "0",
                      "--out", run])
    step = torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)["step"]
    assert step < 400  # it fitted, and stopped
    os.remove(os.path.join(run, "fit.json"))
    assert lengen_eval.main([run, "--lengths", "16", "--samples", "8", "--threads", "1"]) == 0
    assert "unfinished" not in capsys.readouterr().out


def test_dynamic_yarn_reads_a_run_as_trained_inside_its_context(tmp_path, capfd):
    """Bug caught (planted and watched failing): dynamic YaRN with a fixed factor (1: it never stretches; s: it
    stretches inside the context too). Inside L = 16 (the run's training length) it reads the run as trained,
    and at 64 = 4 L it is YaRN x4 exactly; train.py takes it as a scaling like the others."""
    run = train.run(TINY + ["--steps", "150", "--out", str(tmp_path / "r")])["run"]

    def rows(*extra):
        out = tmp_path / "e.json"
        code, err = in_process("eval", [run, "--lengths", "16,64", "--samples", "64", "--json", out, *extra], capfd)
        assert code == 0, err
        return [{k: r[k] for k in ("accuracy", "low", "high")} for r in json.loads(out.read_text())["rows"]]
    plain, dynamic = rows(), rows("--scaling", "dynamic_yarn")
    static = rows("--scaling", "yarn", "--factor", "4", "--original-len", "16")
    assert dynamic[0] == plain[0] and dynamic[1] == static[1] and static[1] != plain[1]
    trained = train.run(TINY + ["--steps", "2", "--scaling", "dynamic_yarn", "--out", str(tmp_path / "d")])
    assert json.loads(open(os.path.join(trained["run"], "config.json")).read())["scaling"] == "dynamic_yarn"
