"""Bad input, tried as a careful user would: each case ends with exit status 2 and one line on stderr, never a
traceback, and leaves every existing run byte for byte as it was. Then what a kill, a scheduler's SIGTERM or a
second train.py on the same run may do: nothing is lost, and a resumed run equals an uninterrupted one."""
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from test_cli import ROOT, TINY, cli, set_steps, weights


def main(script, args):
    """train.py's or eval.py's main() in this process, which is faster than a new one: a traceback would fail
    the test as an error. main() makes SIGTERM a Ctrl-C; the test process gets its own handler back."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return importlib.import_module(script).main(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def snapshot(folder):
    """Every file under `folder` (hidden ones too), by relative path, with its bytes."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder of runs: 'run', a good tiny run, and broken copies of it named after what is wrong."""
    root = tmp_path_factory.mktemp("runs")
    run = str(root / "run")
    train.run(TINY + ["--steps", "20", "--out", run])
    broken = {"config-list": ("config.json", b"[1, 2]"), "config-empty": ("config.json", b"{}"),
              "config-binary": ("config.json", b"\xff\xfe\x00 not utf-8")}
    for name, (file, content) in broken.items():
        shutil.copytree(run, root / name)
        (root / name / file).write_bytes(content)
    ckpt = torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)
    nan = {**ckpt, "model": {k: v.clone() for k, v in ckpt["model"].items()}}
    for tensor in nan["model"].values():
        tensor.fill_(float("nan"))
    for name, content in {"ckpt-tensor": torch.zeros(3), "ckpt-nan": nan,
                          "ckpt-no-model": {k: v for k, v in ckpt.items() if k != "model"},
                          "ckpt-no-optimizer": {k: v for k, v in ckpt.items() if k != "optimizer"}}.items():
        shutil.copytree(run, root / name)
        torch.save(content, root / name / "checkpoint.pt")
    config = json.loads((root / "run" / "config.json").read_text())
    edits = {"config-bogus-encoding": {"encoding": "bogus"}, "config-steps-ten": {"steps": "ten"},
             "config-vocab-string": {"vocab_size": "18"}, "config-cuda": {"device": "cuda"},
             "config-train-len": {"train_len": [20, 10]}, "config-dim": {"dim": 64},
             "config-len-text": {"train_len": "ab"}, "config-options-list": {"task_options": [1]},
             "config-threads-text": {"threads": "x"}, "config-init-number": {"init": 5},
             "config-save-every-0": {"save_every": 0, "steps": 30}, "config-lr-negative": {"lr": -1.0, "steps": 30},
             "config-eval-samples": {"eval_samples": -4}, "config-curriculum": {"curriculum": [24, 48, 3]}}
    for name, edit in edits.items():  # config.json edited by hand
        shutil.copytree(run, root / name)
        (root / name / "config.json").write_text(json.dumps({**config, **edit}))
    shutil.copytree(run, root / "log-folder")  # a log that cannot be read as a file
    os.remove(root / "log-folder" / "log.jsonl")
    os.makedirs(root / "log-folder" / "log.jsonl")
    os.makedirs(root / "llm-run" / "model")  # what train.py --llm leaves: config.json, log.jsonl, model/
    (root / "llm-run" / "config.json").write_text(json.dumps({"llm": "smollm2", "method": "ryarn"}))
    os.makedirs(root / "llm-cut")  # one cut short: config.json and its checkpoint, no model/ yet
    (root / "llm-cut" / "config.json").write_text(json.dumps({"llm": "smollm2", "method": "ryarn"}))
    (root / "llm-cut" / "checkpoint.pt").write_bytes(b"")
    return root


cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the case is a machine without CUDA")

# (script, arguments, a piece of the one line it must print). {runs} is the folder of runs above, {tmp} an empty
# folder that must stay empty. train.py also gets --quiet, --steps 2 --threads 1 unless it resumes, and
# --out {tmp}/new unless the case names one.
CASES = [
    # --force replaces a run only once the new one has passed every check
    ("train", ["--out", "{runs}/run", "--force", "--init", "{tmp}/missing"], "not a run directory"),
    # weights of another shape (#53 item 27: torch's own first line said only "Error(s) in loading state_dict")
    ("train", ["--out", "{runs}/run", "--force", "--init", "{runs}/run", *TINY, "--dim", "16"],
     "in the weights, (17, 16) in the model); it was trained with --dim 32, this run has --dim 16"),
    ("train", ["--out", "{runs}/run", "--force", "--init", "{runs}/run", *TINY, "--layers", "2"],
     "it was trained with --layers 1, this run has --layers 2"),
    ("train", ["--out", "{runs}/run", "--force", "--init", "{runs}/ckpt-tensor"], "not a lengen checkpoint"),
    ("train", ["--out", "{runs}/run", "--force", "--lr", "nan"], "finite"),
    # numbers that are not numbers
    ("train", ["--lr", "inf"], "finite"),
    ("train", ["--wd", "nan"], "finite"),
    ("train", ["--rope-base", "nan"], "finite"),
    ("train", ["--scaling", "yarn", "--factor", "inf"], "finite"),
    ("train", ["--scaling", "yarn", "--factor", "nan"], "finite"),
    ("eval", ["{runs}/run", "--scaling", "yarn", "--factor", "inf"], "finite"),
    ("eval", ["{runs}/run", "--scaling", "yarn", "--factor", "nan"], "finite"),
    ("train", ["--seed", str(2 ** 64)], "64-bit"),
    # --resume continues a run with its own settings, or refuses
    ("train", ["--resume", "--out", "{runs}/run", "--steps", "60"], "--steps 60 (the run has 20)"),
    ("train", ["--resume", "--out", "{runs}/run", "--encoding", "alibi", "--lr", "5"],
     "--encoding alibi (the run has rope), --lr 5.0"),
    ("train", ["--resume", "--out", "{runs}/run", "--force"], "choose one"),
    ("train", ["--resume", "--out", "{runs}/ckpt-tensor"], "not a lengen checkpoint"),
    ("train", ["--resume", "--out", "{runs}/ckpt-no-optimizer"], "no 'optimizer'"),
    ("train", ["--resume", "--out", "{runs}/config-empty"], "not a small-GPT run's config"),
    # runs that are not runs
    ("eval", ["{runs}/config-list"], "not a small-GPT run's config"),
    ("eval", ["{runs}/config-empty"], "not a small-GPT run's config"),
    ("eval", ["{runs}/config-binary"], "corrupt"),
    ("eval", ["{runs}/ckpt-tensor"], "not a lengen checkpoint"),
    ("eval", ["{runs}/ckpt-no-model"], "no 'model'"),
    # evaluation settings
    ("eval", ["{runs}/run", "--scaling", "yarn"], "needs --factor"),
    ("eval", ["{runs}/run", "--original-len", "8"], "give --scaling"),
    pytest.param("eval", ["{runs}/run", "--device", "cuda"], "no such device", marks=cuda),
    ("eval", ["{runs}/run", "--device", "nosuch"], "unknown --device"),
    ("eval", ["{runs}/run", "--threads", "-1"], "--threads must be >= 1"),
    ("eval", ["--experiment", "distance", "--jobs", "0"], "--jobs 0: give N >= 1"),
    ("eval", ["--experiment", "retrieval", "--probe"], "--probe: retrieval has no probe"),
    ("eval", ["--experiment", "encodings", "--probe", "--quick"], "choose one of --quick and --probe"),
    ("eval", ["--experiment", "encodings", "--probe", "--render"], "a probe has none"),
    # --cells and --launcher (#52): only a study that lists its models; never a probe; one of the two; a launcher
    # this runner knows
    ("eval", ["--experiment", "retrieval", "--quick", "--cells", "{tmp}/cells"], "does not list its models as cells"),
    ("eval", ["--experiment", "ryarn", "--probe", "--cells", "{tmp}/cells"], "--probe trains nothing to share out"),
    ("eval", ["--experiment", "ryarn", "--quick", "--cells", "{tmp}/c", "--launcher", "submitit"], "choose one"),
    ("eval", ["--experiment", "ryarn", "--quick", "--launcher", "slurm"], "give local, submitit or submitit:"),
    ("eval", ["--experiment", "ryarn", "--quick", "--launcher", "submitit:lsf"], "give local, submitit or submitit:"),
    ("eval", ["{runs}/run", "--cells", "{tmp}/cells"], "--cells is for --experiment"),
    ("eval", ["--bench", "--jobs", "2"], "--bench measures what --jobs does"),
    ("eval", ["--experiment", "gpu", "--render"], "--render: gpu makes no claims to decide again"),  # #53 item 4
    # flags the command would drop without a word (#35 item 21)
    ("eval", ["{runs}/run", "--experiment", "ryarn"], "--experiment runs with its own settings: leave out RUN"),
    ("eval", ["--experiment", "ryarn", "--lengths", "64"], "leave out --lengths"),
    ("eval", ["--bench", "--samples", "4"], "--bench runs with its own settings: leave out --samples"),
    ("eval", ["--experiment", "ryarn", "--json", "{tmp}/x.json"], "leave out --json"),
    ("eval", ["--experiment", "ryarn", "--llm", "smollm2"], "leave out --llm"),
    ("eval", ["{runs}/run", "--jobs", "2"], "--jobs is for --experiment and --bench"),
    ("eval", ["{runs}/run", "--quick"], "--quick is for --experiment and --bench"),
    ("eval", ["{runs}/run", "--out-dir", "{tmp}"], "--out-dir is for --experiment"),
    ("eval", ["{runs}/run", "--force"], "--force is for --experiment"),
    ("eval", ["{runs}/run", "--task", "babilong"], "a small-GPT run is evaluated on its own task"),
    ("eval", ["{runs}/run", "--llm", "smollm2"], "not both"),
    ("train", ["--threads", "-1"], "--threads must be >= 1"),
    ("train", ["--threads", "100000"], "CPU cores"),             # #35 item 14: was a segfault
    ("eval", ["{runs}/run", "--threads", str(10 ** 12)], "CPU cores"),  # was a traceback
    ("eval", ["{runs}/run", "--samples", str(10 ** 12)], "--samples must be >= 1 and at most 1,000,000"),
    ("train", ["--eval-samples", str(10 ** 12)], "--eval-samples must be >= 0 and at most 1,000,000"),
    # sizes that cannot fit are refused with what they would need, before anything is allocated
    ("eval", ["{runs}/run", "--lengths", "1000000000"], "GiB"),
    ("eval", ["{runs}/run", "--lengths", str(2 ** 63)], "GiB"),
    ("eval", ["{runs}/run", "--delays", "0:1000000000"], "more than 100,000 values"),
    ("train", ["--train-len", "1000000000"], "GiB"),
    ("eval", ["{runs}/llm-run", "--lengths", "1000000000"], "an LLM prompt here is at most 1,048,576 tokens"),
    # where results go is checked before they are computed
    ("eval", ["{runs}/run", "--json", "{tmp}/missing/rows.json"], "No such file or directory"),
    ("eval", ["{runs}/run", "--json", "{runs}"], "Is a directory"),
    ("eval", ["{runs}/run", "--json", "{runs}/run/config.json/rows.json"], "Not a directory"),
    ("eval", ["{runs}/run", "--plot", "{tmp}/missing/accuracy.png"], "No such file or directory"),
    ("eval", ["{runs}/run", "--plot", "{tmp}/accuracy.txt"], "give a file name ending .png, .pdf, .svg"),  # #35 19
    ("eval", ["{runs}/run", "--plot", "{tmp}/accuracy"], "give a file name ending .png"),  # it wrote accuracy.png
    ("eval", ["--experiment", "ryarn", "--quick", "--out-dir", "{runs}/run/config.json"], "--out-dir"),
    # settings a run would accept and ignore
    ("train", ["--factor", "4"], "--factor 4 stretches a rotary scaling"),
    ("train", ["--encoding", "fire", "--original-len", "-7"], "--original-len -7"),
    ("train", ["--fit-every", "50"], "--fit-every 50 sets how often the fit check runs: give --fit-bar"),  # #35 22
    ("train", ["--max-position", "100"], "--max-position 100 bounds sampled position ids: give --positions"),
    ("train", ["--encoding", "rope", "--max-len", "100"], "--max-len 100 sizes a learned position table"),
    ("train", ["--encoding", "alibi", "--rope-base", "500"], "--rope-base 500 sets rotary frequencies, not alibi's"),
    ("train", ["--encoding", "rope", "--alibi-slope-heads", "8"], "--alibi-slope-heads 8 sets ALiBi's slopes"),
    ("train", ["--encoding", "alibi", "--alibi-slope-heads", "3"], "do not space evenly over 2 heads"),
    ("train", ["--encoding", "alibi", "--alibi-slope-heads", "0"], "--alibi-slope-heads must be >= 1"),
    ("train", ["--original-len", "16"], "--original-len 16 is the length a rotary scaling stretches"),
    ("eval", ["{runs}/run", "--scaling", "none", "--factor", "4"], "give --scaling with them"),
    ("train", ["--llm", "smollm2", "--lora", "0"], "a LoRA rank is >= 1"),
    ("train", ["--llm", "smollm2", "--lora", "-2"], "a LoRA rank is >= 1"),
    ("train", ["--llm", "smollm2", "--no-curriculum", "--range-shape", "linear"], "--no-curriculum has none"),
    ("train", ["--llm", "smollm2", "--range", "inf"], "cannot be drawn"),
    ("train", ["--llm", "smollm2", "--range", "1e300"], "cannot be drawn"),
    ("train", ["--llm", "smollm2", "--fit-bar", "2"], "--fit-bar 2: an accuracy in (0, 1]"),
    ("train", ["--llm", "smollm2", "--fit-every", "50"], "give --fit-bar with it"),
    ("train", ["--llm", "smollm2", "--fit-bar", "0.9", "--fit-every", "0"], "--fit-every must be >= 1"),
    ("train", ["--resume", "--out", "{runs}/llm-run"], "is an LLM run: resume it with the command line that"),
    ("train", ["--resume", "--out", "{runs}/llm-cut"], "is an LLM run: resume it with the command line that"),
    ("train", ["--resume", "--out", "{runs}/config-bogus-encoding"], "unknown encoding 'bogus'"),
    ("train", ["--resume", "--out", "{runs}/config-steps-ten"], 'steps is "ten", not an integer'),
    ("train", ["--resume", "--out", "{runs}/config-vocab-string"], 'vocab_size is "18", not an integer'),
    ("train", ["--resume", "--out", "{runs}/config-train-len"], "train_len is [20, 10]"),
    ("train", ["--resume", "--out", "{runs}/config-dim"],
     "checkpoint.pt does not fit its config.json (tok.weight is (17, 32) in the weights, (17, 64) in the model)"),
    pytest.param("train", ["--resume", "--out", "{runs}/config-cuda"], "no such device", marks=cuda),
    # more of the same (#53 item 23): each was a traceback
    ("eval", ["{runs}/config-steps-ten", "--lengths", "16"], 'steps is "ten", not an integer'),
    ("eval", ["{runs}/config-len-text"], 'train_len is "ab", not [LOW, HIGH]'),
    ("eval", ["{runs}/config-curriculum"], "curriculum is [24, 48, 3], not [START, END, SHAPE] or null"),
    ("eval", ["{runs}/config-options-list", "--lengths", "16"], "task_options is [1], not an object"),
    ("train", ["--resume", "--out", "{runs}/config-options-list"], "task_options is [1], not an object"),
    ("train", ["--resume", "--out", "{runs}/config-threads-text"], 'threads is "x", not an integer'),
    ("train", ["--resume", "--out", "{runs}/config-init-number"], "init is 5, not a run's folder"),
    ("train", ["--resume", "--out", "{runs}/config-save-every-0"], "config.json: --save-every must be >= 1"),
    ("train", ["--resume", "--out", "{runs}/config-lr-negative"], "config.json: --lr must be > 0"),
    ("train", ["--resume", "--out", "{runs}/config-eval-samples"], "config.json: --eval-samples must be >= 0"),
    ("train", ["--resume", "--out", "{runs}/log-folder"], "log.jsonl: Is a directory"),
    ("train", ["--lr", "1e308"], "--lr 1e+308 is beyond float32's range"),  # torch's overflow at the first step
    # ranges the position samplers cannot draw from, and spans xPos cannot represent, before --force replaces
    ("train", ["--out", "{runs}/run", "--force", "--encoding", "t5", "--positions", "randomized",
               "--max-position", "100000000000000000000"], "above 2^53"),
    ("train", ["--out", "{runs}/run", "--force", "--positions", "pose", "--curriculum", "24:100000000000000000000"],
     "above 2^53"),
    ("train", ["--out", "{runs}/run", "--force", "--positions", "stretch", "--max-position", "1" + "0" * 20],
     "above 2^53"),
    ("train", ["--out", "{runs}/run", "--force", "--encoding", "xpos", "--positions", "randomized",
               "--max-position", "200000"], "xpos stays finite for positions spanning at most 56,463"),
    # a model whose outputs are NaN: no weights saved, no accuracy reported
    ("train", ["--out", "{runs}/run", "--force", *TINY, "--init", "{runs}/ckpt-nan"], "loss is nan at step 1"),
    ("eval", ["{runs}/ckpt-nan"], "not finite"),
]


@pytest.mark.parametrize("script, args, message", CASES)
def test_bad_input_is_one_line_and_changes_nothing(runs, tmp_path, capsys, script, args, message):
    args = [a.format(runs=runs, tmp=tmp_path) for a in args]
    if script == "train":
        args = ["--quiet"] + ([] if "--resume" in args else ["--steps", "2", "--threads", "1"]) \
            + ([] if "--out" in args else ["--out", f"{tmp_path}/new"]) + args
    before = snapshot(runs)
    assert main(script, args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert snapshot(runs) == before  # no run touched, no lock or half-built run left beside them
    assert os.listdir(tmp_path) == []  # and nothing new anywhere else


@pytest.mark.parametrize("script, spec, message", [("train.py", "{tmp}/missing.gguf", "no such file"),
                                                   ("train.py", "nosuch-org/nosuch-model", "not in the local cache"),
                                                   ("eval.py", "nosuch-org/nosuch-model", "not in the local cache")])
def test_llm_that_cannot_be_loaded_is_one_line_at_once(tmp_path, script, spec, message):
    """A hub id that is not in the local cache, with no hub in reach (a .invalid name never resolves): one
    line, not a minute of download retries. In a new process: the hub's address is read at import."""
    pytest.importorskip("transformers")
    args = ["--llm", spec.format(tmp=tmp_path)] + (["--out", str(tmp_path / "new")] if script == "train.py" else [])
    env = {**os.environ, "HF_ENDPOINT": "http://hub.invalid", "HF_HOME": str(tmp_path / "hf-home")}
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                            cwd=ROOT, timeout=300, env=env)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert set(os.listdir(tmp_path)) <= {"hf-home"}  # no run folder


def test_a_run_started_from_another_resumes_once_that_one_is_gone(tmp_path):
    """Bug caught (#53 item 23): --resume loaded the --init run's weights again (then replaced them by the
    checkpoint's), so a run whose --init source had since been deleted could not be resumed."""
    source, run = str(tmp_path / "source"), str(tmp_path / "run")
    assert main("train", [*TINY, "--steps", "3", "--out", source]) == 0
    assert main("train", [*TINY, "--steps", "3", "--init", source, "--out", run]) == 0
    shutil.rmtree(source)
    assert main("train", ["--resume", "--out", run]) == 0


def test_output_closed_early_is_one_line(runs):
    """`eval.py RUN | head -2`: the reader leaves before the table is written (here: before anything is)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), str(runs / "run"), "--lengths", "16",
                             "--samples", "8", "--threads", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "closed" in err, err


def test_a_forced_run_stopped_before_it_is_whole_leaves_the_old_one(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    train.run(TINY + ["--steps", "5", "--out", run])
    open(os.path.join(run, "figure.png"), "wb").write(b"the user's own file")
    before = snapshot(tmp_path)

    def ctrl_c(*_):  # as the new run, all checks passed and its step-0 checkpoint written, is about to go in
        raise KeyboardInterrupt
    monkeypatch.setattr("runs.swap_in", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        train.run(TINY + ["--steps", "5", "--seed", "1", "--out", run, "--force"])
    assert snapshot(tmp_path) == before  # the old run whole, nothing half-built beside it, the lock gone
    monkeypatch.undo()
    train.run(TINY + ["--steps", "5", "--seed", "1", "--out", run, "--force"])
    assert snapshot(tmp_path)["run/figure.png"] == b"the user's own file"  # --force replaces the run's files only
    assert json.loads(open(os.path.join(run, "config.json")).read())["seed"] == 1
    assert sorted(os.listdir(tmp_path)) == ["run"]


def start(*args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def logged(run):
    """The steps logged so far (the last line may be cut: skipped), without the timing column."""
    path = os.path.join(run, "log.jsonl")
    lines = open(path).read().split("\n")[:-1] if os.path.exists(path) else []
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]


def wait_for_step(run, step):
    deadline = time.time() + 120
    while not any(r["step"] >= step for r in logged(run)):
        assert time.time() < deadline, f"{run} did not reach step {step}"
        time.sleep(0.01)


KILLED = TINY + ["--steps", "600", "--positions", "randomized", "--max-position", "64"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("whole") / "run")
    train.run(KILLED + ["--out", run])
    return run


# Only the first is in the fast suite: resuming from step 0 is the same restore, and SIGTERM stops a run as Ctrl-C
# does (test_cli.test_interrupted_run_resumes_to_the_same_numbers; SIGTERM's 130: test_two_trainings_into_one_folder).
@pytest.mark.parametrize("sig, save_every, kill_at", [
    pytest.param(signal.SIGKILL, 50, 70, id="SIGKILL"),  # past the checkpoint at step 50: 60 and 70 logged, not saved
    pytest.param(signal.SIGKILL, 1000, 10, id="SIGKILL-early", marks=pytest.mark.slow),  # resumes from step 0
    pytest.param(signal.SIGTERM, 50, 70, id="SIGTERM", marks=pytest.mark.slow)])
def test_killed_run_resumes_to_the_same_weights_and_log(uninterrupted, tmp_path, sig, save_every, kill_at):
    run = str(tmp_path / "run")
    proc = start(*KILLED, "--save-every", str(save_every), "--out", run)
    wait_for_step(run, kill_at)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:  # a scheduler's preemption: the step finishes, is saved, and the user told how to go on
        assert proc.returncode == 130 and f"--resume --out {run}" in err, err
    assert torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)["step"] < 600, "not interrupted"
    resumed = cli("train.py", "--resume", "--out", run, "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert logged(run) == logged(uninterrupted)  # every step once
    wa, wb = weights(uninterrupted), weights(run)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert sorted(os.listdir(tmp_path)) == ["run"] and not [f for f in os.listdir(run) if f.endswith(".tmp")]


def test_two_trainings_into_one_folder_one_is_turned_away(tmp_path, capsys):
    run = str(tmp_path / "run")
    both = [start(*TINY, "--steps", "100000", "--out", run) for _ in range(2)]
    try:
        wait_for_step(run, 10)
        deadline = time.time() + 120
        while all(p.poll() is None for p in both):
            assert time.time() < deadline, "both are still running"
            time.sleep(0.01)
        second, first = sorted(both, key=lambda p: p.poll() is None)
        err = second.communicate()[1]
        assert second.returncode == 2 and len(err.splitlines()) == 1 and "in use" in err, err
        for args in (["--force", *TINY, "--steps", "5"], ["--resume"]):  # nor can --force or --resume get in
            assert main("train", [*args, "--out", run]) == 2
            assert "in use" in capsys.readouterr().err
        assert first.poll() is None
    finally:
        for p in both:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 130
    assert sorted(os.listdir(tmp_path)) == ["run"]  # the lock file went with the lock


def test_an_experiment_never_replaces_results_of_another_command(tmp_path, monkeypatch, capsys):
    """Bug caught: `--quick` (or another scale, or other options) overwriting the committed results of the
    default run without a word. --quick writes to results/quick/ by default; results written by another command
    are replaced only with --force; the same command may write again."""
    from experiments import common
    reached = []

    class Stub:  # the study and its report at once: the runner's checks run, nothing is trained
        run = staticmethod(lambda args: reached.append(args.out_dir) or {"command": common.command_line(args)})
        markdown = staticmethod(lambda data: "")
        figure = staticmethod(lambda data: None)
    monkeypatch.setattr(common, "importlib", type("stub", (), {"import_module": staticmethod(lambda name: Stub)}))
    monkeypatch.chdir(tmp_path)
    os.makedirs("results")
    committed = json.dumps({"command": "python eval.py --experiment ryarn --threads 1"}).encode()
    (tmp_path / "results" / "ryarn.json").write_bytes(committed)
    assert main("eval", ["--experiment", "ryarn", "--quick", "--threads", "1"]) == 0
    assert reached == [os.path.join("results", "quick")]
    assert main("eval", ["--experiment", "ryarn", "--threads", "2"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "results" / "ryarn.json").read_bytes() == committed
    assert main("eval", ["--experiment", "ryarn", "--threads", "1"]) == 0  # the command that wrote them
    assert main("eval", ["--experiment", "ryarn", "--threads", "2", "--force"]) == 0
    assert reached[1:] == ["results", "results"]


@cuda
def test_a_gpu_run_resumes_on_the_cpu(runs, tmp_path):
    """Bug caught: the device saved in config.json taken as what the run is, so that a run trained on a GPU
    could not continue on a CPU (--resume --device cpu refused as a changed setting)."""
    shutil.copytree(runs / "config-cuda", tmp_path / "run")
    set_steps(tmp_path / "run", 25)  # 5 steps left to train
    assert main("train", ["--resume", "--out", str(tmp_path / "run"), "--device", "cpu", "--quiet"]) == 0
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == 25



def test_a_model_that_cannot_be_read_is_one_line(tmp_path, capsys):
    """Bugs caught: a GGUF file cut short (a download that stopped) ending in a struct.error traceback; a folder
    that holds no model answered with half a sentence from the tokenizer ("Couldn't instantiate ... from one
    of: ")."""
    import importlib.util

    import hf
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    cases = [(tmp_path / "notes", "not a model directory")]
    gguf = hf.smollm2_gguf()
    if gguf and importlib.util.find_spec("transformers"):  # the cut files are read by transformers' GGUF reader
        with open(gguf, "rb") as f:
            head = f.read(10 ** 6)
        for size in (100, 10 ** 6):
            (tmp_path / f"cut-{size}.gguf").write_bytes(head[:size])
            cases.append((tmp_path / f"cut-{size}.gguf", "is truncated or corrupt"))
    for spec, message in cases:
        assert main("eval", ["--llm", str(spec), "--lengths", "64", "--samples", "1"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err


def test_jobs_are_capped_at_what_the_machine_can_run(monkeypatch, capsys):
    """Bug caught (#24 item 6): --jobs 1000 started one process per queued model (34, 10 GB, nothing done)."""
    from experiments import common
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert common.usable_jobs(1000, 34) == 2
    assert "running 2 at once (2 CPU cores" in capsys.readouterr().err
    assert common.usable_jobs(1000, 34, threads=2) == 1  # one worker of 2 threads fills 2 cores
    assert "running 1 at once" in capsys.readouterr().err
    assert common.usable_jobs(2, 1) == 1 and capsys.readouterr().err == ""  # one model: one process, quietly
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert common.map_jobs(abs, [-1, -2, -3], jobs=1000) == [1, 2, 3]  # here, in this process
    assert "running 1 at once" in capsys.readouterr().err


def test_jobs_are_capped_at_free_memory_read_in_its_unit(monkeypatch, capsys):
    """Issue 53: /proc/meminfo gives MemAvailable in kB; a worker takes 1 GiB of it. Faked at 3 GiB on 64 cores:
    3 workers. Bugs caught: the figure read as bytes (0 GiB: always 1 worker) or as MiB (3,072: no cap)."""
    import io
    from experiments import common
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/meminfo":
            return io.StringIO(f"MemTotal:       {64 * 2 ** 20} kB\nMemFree:          123 kB\n"
                               f"MemAvailable:    {3 * 2 ** 20 + 512} kB\n")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(common, "open", fake_open, raising=False)
    assert common.usable_jobs(16, 100) == 3
    assert "running 3 at once (64 CPU cores, 3 GiB free)" in capsys.readouterr().err


def test_a_worker_that_dies_is_one_line(capsys):
    """Bug caught (#24 item 9): a --jobs worker killed outright gave a 40-line BrokenProcessPool traceback."""
    from experiments import common
    with pytest.raises(train.UsageError, match="a worker process died"):
        common.map_jobs(os._exit, [9, 9], jobs=2)  # each worker ends at once, as a kill -9 would end it


def test_a_second_experiment_on_the_same_runs_is_turned_away(tmp_path, monkeypatch, capsys):
    """Bug caught (#24 item 8): a second `eval.py --experiment NAME` on the same run folders made both fail and
    lost all the work; now the second is turned away in one line while the first holds them."""
    from runs import hold
    monkeypatch.chdir(tmp_path)
    with hold(os.path.join("runs", "retrieval", "quick"), holder="eval.py --experiment retrieval"):
        assert main("eval", ["--experiment", "retrieval", "--quick", "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "in use by another eval.py --experiment retrieval" in err, err
    assert not os.path.exists(tmp_path / "out" / "retrieval.json")


def test_an_experiment_reuses_a_run_only_when_this_argv_and_code_made_it(tmp_path, monkeypatch):
    """What lets a stopped experiment go on (#24 item 5): train_once trains a model once; the same argv with the
    same code gets that run back untouched, other code or a run replaced since by train.py --force retrains."""
    from experiments import common
    out = str(tmp_path / "run")
    argv = [*TINY, "--steps", "3", "--out", out, "--force"]
    first = common.train_once(argv)
    stamp = os.stat(os.path.join(out, "checkpoint.pt")).st_mtime_ns
    assert common.train_once(argv) == first  # reused: the same rows from final.json, the run untouched
    assert os.stat(os.path.join(out, "checkpoint.pt")).st_mtime_ns == stamp
    monkeypatch.setattr(common, "code_digest", lambda: "other code")
    common.train_once(argv)
    assert os.stat(os.path.join(out, "checkpoint.pt")).st_mtime_ns != stamp  # trained again
    monkeypatch.undo()
    common.train_once(argv)
    assert main("train", [*TINY, "--steps", "4", "--out", out, "--force"]) == 0
    assert not common.trained(argv)  # --force with another command line replaced the run: not reusable


def test_a_model_trained_from_its_recorded_command_is_reused_by_the_experiment(tmp_path):
    """#52: the commands results/NAME.json lists (python train.py ARGV) record made-by.json as the experiment's
    own run does, so a model trained from one, by hand or on a cluster's node, is not trained again by the run
    that collects it. Bug caught: only train_once wrote made-by.json, so every such model was retrained."""
    from experiments import common
    out = str(tmp_path / "run")
    argv = [*TINY, "--steps", "3", "--out", out, "--force", "--quiet"]
    done = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], cwd=ROOT)
    assert done.returncode == 0
    stamp = os.stat(os.path.join(out, "checkpoint.pt")).st_mtime_ns
    assert common.trained(argv)
    common.train_once(argv)
    assert os.stat(os.path.join(out, "checkpoint.pt")).st_mtime_ns == stamp  # reused, not trained again


@pytest.mark.slow  # the fast suite stops a --jobs pool by Ctrl-C: test_nothing_lost.test_ctrl_c_while_the_workers_start
def test_sigterm_stops_an_experiment_with_jobs_promptly_and_keeps_finished_runs(tmp_path):
    """Bug caught (#24 item 5): SIGTERM to `eval.py --experiment NAME --jobs 2` trained every queued model
    before it stopped, then discarded them. Now the queue is cancelled, the workers stop within a step, and
    the message says to run the same command again (which reuses the finished runs)."""
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", "retrieval", "--quick",
                          "--jobs", "2", "--threads", "1", "--out-dir", str(tmp_path / "results")],
                         cwd=tmp_path, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        for line in p.stderr:  # the experiment says each run it starts
            lines.append(line)
            if sum("training" in seen for seen in lines) >= 3:
                break
        p.send_signal(signal.SIGTERM)
        began = time.time()
        rest = p.communicate(timeout=120)[1]
    finally:
        if p.poll() is None:  # the experiment and its workers, should the test fail
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and time.time() - began < 30, rest
    assert "Traceback" not in rest and "the same command again goes on from them" in rest.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "results" / "retrieval.json")
