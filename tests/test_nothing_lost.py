"""Nothing lost, round three (#35 items 1-7): run folders on another filesystem or behind a symlink, folders that
hold someone else's files, one lock per folder however it is named, results written whole or not at all, a
run's own files never overwritten by eval.py, a diverged LLM fine-tune saving nothing, NaN scores refused,
and a peak FLOP rate that must be a number > 0; round four (#53, at the end): swaps cut short by a kill or a
failed rename, diverged first steps, --json and --plot onto what is not a plain file. Each test was watched failing
with its fix taken out."""
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid

import pytest
import torch

import folder_lock
import runs
import train
from test_cli import ROOT, TINY, in_process, set_steps, weights

RUN = [*TINY, "--steps", "3", "--eval-samples", "0"]


@pytest.fixture
def other_disk(tmp_path):
    """A folder on another filesystem than tmp_path (/dev/shm, a RAM disk), removed afterwards."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    folder = os.path.join("/dev/shm", f"lengen-test-{uuid.uuid4().hex}")
    os.makedirs(folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_force_onto_a_run_on_another_filesystem_replaces_it_whole(tmp_path, other_disk):
    """Bug caught (item 1): the new run was built beside the symlink, on this disk; every rename onto the other
    disk failed (EXDEV) after the old run's files were deleted, and both runs were lost."""
    far = os.path.join(other_disk, "run")
    assert train.main([*RUN, "--out", far]) == 0
    os.symlink(far, tmp_path / "far")
    assert train.main([*RUN, "--seed", "1", "--force", "--out", str(tmp_path / "far")]) == 0
    assert json.load(open(os.path.join(far, "config.json")))["seed"] == 1
    assert sorted(os.listdir(far)) == ["checkpoint.pt", "config.json", "log.jsonl", "made-by.json"]
    empty = os.path.join(other_disk, "mount")  # a new run into an empty folder on another disk
    os.makedirs(empty)
    os.symlink(empty, tmp_path / "mount")
    assert train.main([*RUN, "--out", str(tmp_path / "mount")]) == 0
    assert os.path.isfile(os.path.join(empty, "checkpoint.pt"))


def test_a_folder_with_files_a_run_writes_but_no_run_is_refused(tmp_path, capsys):
    """Bug caught (item 2): --out DIR with a model/ folder (and no config.json) lost model/ to the new run."""
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "weights.bin").write_text("precious")
    for force in ([], ["--force"]):
        assert train.main([*RUN, "--out", str(mine), *force]) == 2
        assert "holds model but no run" in capsys.readouterr().err
    assert (mine / "model" / "weights.bin").read_text() == "precious" and sorted(os.listdir(mine)) == ["model"]


def test_one_folder_has_one_lock_whatever_its_name(tmp_path):
    """Bug caught (item 3): the lock was named from the path given, so a run through a symlink and a --force
    run through its target both went ahead in the same folder."""
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "link")
    with runs.hold(str(tmp_path / "target")):
        with pytest.raises(runs.UsageError, match="in use by another train.py"):
            with runs.hold(str(tmp_path / "link")):
                pass


WRITE_UNDER_A_SIZE_LIMIT = """
import resource, signal, sys
sys.path.insert(0, {root!r})
from experiments import common
from runs import UsageError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    common.write_results("x", "new markdown, far too long " * 400, {{"new": 1}}, out_dir={out!r})
except UsageError as e:  # one line (item 15)
    print("refused:", e)
"""


def test_results_are_written_whole_or_not_at_all(tmp_path):
    """Bug caught (item 4): write_results wrote NAME.md and NAME.json in place; a file-size limit (or a full
    disk, or a kill) mid-write left a truncated file, the previous one already gone."""
    from experiments import common
    common.write_results("x", "old markdown\n", {"old": 1}, out_dir=str(tmp_path))
    before = {f: (tmp_path / f).read_bytes() for f in ("x.md", "x.json")}
    script = WRITE_UNDER_A_SIZE_LIMIT.format(root=ROOT, out=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "refused:" in result.stdout, result.stdout + result.stderr
    assert (tmp_path / "x.md").read_bytes() == before["x.md"]  # the old markdown, whole
    assert json.loads((tmp_path / "x.json").read_text()) == {"new": 1}  # the json is small: it went through
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_results_file_cut_short_is_said_to_be_cut_short(tmp_path, monkeypatch, capsys):
    """Bug caught (item 23): a truncated NAME.json was reported as holding the results of `None`."""
    import eval as lengen_eval
    monkeypatch.chdir(tmp_path)
    os.makedirs("out")
    (tmp_path / "out" / "ryarn.json").write_text('{"command": "python eval.py --exp')
    assert lengen_eval.main(["--experiment", "ryarn", "--out-dir", "out", "--threads", "1"]) == 2
    assert "not readable JSON, or cut short" in capsys.readouterr().err


@pytest.mark.parametrize("name", [pytest.param("config.json", marks=pytest.mark.slow), "checkpoint.pt",
                                  pytest.param("log.jsonl", marks=pytest.mark.slow)])  # one check for every run file
def test_eval_never_writes_over_a_runs_own_files(tmp_path, name):
    """Bug caught (item 6): eval.py RUN --json RUN/config.json overwrote the run's config: exit 0, run lost."""
    run = str(tmp_path / "run")
    assert train.main([*RUN, "--out", run]) == 0
    before = open(os.path.join(run, name), "rb").read()
    for flag in ("--json", "--plot"):
        result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), run, "--samples", "4", flag,
                                 os.path.join(run, name)], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and "a file of the run" in result.stderr, result.stderr
    assert open(os.path.join(run, name), "rb").read() == before


@pytest.mark.parametrize("given", ["nan", "inf", "0", "-5", "many"])
def test_a_peak_flop_rate_must_be_a_number_above_zero(monkeypatch, given):
    """Bug caught (item 7): LENGEN_PEAK_TFLOPS=nan|inf|0|-5 accepted, so MFU would read nan, 0 or negative."""
    from experiments import gpu
    monkeypatch.setenv("LENGEN_PEAK_TFLOPS", given)
    with pytest.raises(runs.UsageError, match="a number > 0"):
        gpu.bf16_peak("NVIDIA H200")
    monkeypatch.setenv("LENGEN_PEAK_TFLOPS", "989")
    assert gpu.bf16_peak("anything") == (989e12, "LENGEN_PEAK_TFLOPS")


def test_a_diverged_llm_fine_tune_saves_nothing_and_nan_scores_are_refused(tmp_path, capsys):
    """Bugs caught (item 5): --lr 1e30 gave a NaN loss from step 3 and saved NaN weights with exit 0; and
    scoring NaN logits reported top-1 1.00 and mean rank 1.0 (every comparison with NaN is false)."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import hf
    from test_llm_fine_tune import save_sharp_llm
    llm = save_sharp_llm(str(tmp_path / "llm"))
    capsys.readouterr()  # what saving the model printed
    previous = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM a Ctrl-C; this process gets its own back
    try:
        assert train.main(["--llm", llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--steps", "6",
                           "--lr", "1e30", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")]) == 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training diverged" in err, err
    assert not os.path.exists(tmp_path / "run")
    model, tokenizer = hf.load_llm(llm, "cpu")
    with torch.no_grad():
        for weight in model.parameters():
            weight.fill_(float("nan"))
    with pytest.raises(runs.UsageError, match="not finite"):
        hf.score_prompt(model, tokenizer, "The pass key is 12345. What is the pass key?", "12345",
                        ("12345", "54321"), "cpu")


def test_a_new_run_into_an_empty_folder_is_built_inside_it_and_left_whole(tmp_path):
    """A folder that exists already takes the run built inside it (.lengen.new, then swapped in): a whole run,
    whose weights load, and nothing of the build left."""
    run = str(tmp_path / "run")
    os.makedirs(run)
    assert train.main([*RUN, "--out", run]) == 0
    assert weights(run) and not os.path.exists(os.path.join(run, ".lengen.new"))


def fail_or_sleep(item):
    """A --jobs worker for the tests below: 'fail' raises at once; (path, seconds) sleeps, then writes path."""
    if item == "fail":
        raise ValueError("planted failure")
    path, seconds = item
    for _ in range(10 * seconds):  # as a training loop: back in Python many times a second
        time.sleep(0.1)
    open(path, "w").close()


def test_a_failing_run_stops_the_pool_at_once(tmp_path):
    """Bug caught (item 9): after one model failed, the pool went on training (33 s more at --quick) what was
    already running and queued. Now the workers are stopped: the sleeping item never finishes."""
    from experiments import common
    done = str(tmp_path / "finished")
    with pytest.raises(ValueError, match="planted failure"):
        common.map_jobs(fail_or_sleep, ["fail", (done, 3), (done + "2", 3)], jobs=2)
    time.sleep(4)  # long enough for a worker that was left running to finish its item
    assert not os.path.exists(done) and not os.path.exists(done + "2")


def sleep_then_return(item):
    """A --jobs worker: sleeps `seconds`, then returns `value`."""
    value, seconds = item
    time.sleep(seconds)
    return value


def test_the_pool_returns_results_in_the_order_of_its_items():
    """#35 (tests that catch): with --jobs 2, results come back in the items' order, not the order the workers
    finish in (here the first item finishes last). Bug caught: map_jobs returning its completion list."""
    from experiments import common
    assert common.map_jobs(sleep_then_return, [("first", 1.5), ("second", 0), ("third", 0)], jobs=2) == \
        ["first", "second", "third"]


def test_a_dangling_symlink_as_out_is_one_line_and_creates_nothing(tmp_path, capsys):
    """Bug caught (item 17): --out a symlink to a missing folder made that folder's parent (for the lock) before
    refusing."""
    os.symlink(tmp_path / "gone" / "run", tmp_path / "link")
    assert train.main([*RUN, "--out", str(tmp_path / "link")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a symlink to nothing" in err
    assert sorted(os.listdir(tmp_path)) == ["link"]


def stopped_run(tmp_path, done: int, steps: int) -> str:
    """A tiny run saved every 10 steps, trained `done` of its `steps`, as a run killed part-way leaves it."""
    run = str(tmp_path / "run")
    assert train.main([*TINY, "--steps", str(done), "--save-every", "10", "--eval-samples", "0", "--out", run]) == 0
    set_steps(run, steps)
    return run


@pytest.mark.parametrize("damage", ["garbled", "missing"])
def test_resume_keeps_the_log_lines_that_parse(tmp_path, damage):
    """Bug caught (item 16): --resume with a log.jsonl garbled after a power cut (NUL bytes, a hand-added line,
    a line that is not a step's) or deleted was a traceback. The lines that parse and whose step is within the
    checkpoint's are kept; the run goes on from its checkpoint."""
    run = stopped_run(tmp_path, 20, 30)
    log = os.path.join(run, "log.jsonl")
    if damage == "missing":
        os.remove(log)
    else:
        with open(log, "ab") as f:
            f.write(b'\x00\x00\x00\n[1]\n{"step": "7"}\n{"loss": 1}\n{"step": 99, "loss": 1}\n{"step": 25')
    assert train.main(["--resume", "--out", run, "--quiet"]) == 0
    steps = [json.loads(line)["step"] for line in open(log)]
    assert steps == ([] if damage == "missing" else [10, 20]) + [30]


def test_resume_keeps_a_last_log_line_that_lost_only_its_newline(tmp_path):
    """#53 (tests that catch): a power cut can take a log line's newline and leave the line whole (the checkpoint
    at its step saved); --resume keeps that line and ends it, so the next step's line starts a line of its own.
    Bug planted to watch it fail: the kept lines written back as read (the two lines ran into one, which no
    longer parses)."""
    run = stopped_run(tmp_path, 20, 30)
    log = os.path.join(run, "log.jsonl")
    text = open(log).read()
    assert text.endswith("}\n")
    with open(log, "w") as f:
        f.write(text[:-1])
    assert train.main(["--resume", "--out", run, "--quiet"]) == 0
    assert [json.loads(line)["step"] for line in open(log)] == [10, 20, 30]


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_keeps_the_last(tmp_path):
    """Bug caught (item 15): a full disk or a file-size limit while saving a checkpoint was a 35-line traceback
    (the previous checkpoint was safe). Now one line, exit 2, and the previous checkpoint byte for byte."""
    import resource
    run = stopped_run(tmp_path, 20, 40)
    checkpoint = os.path.join(run, "checkpoint.pt")
    before, size = open(checkpoint, "rb").read(), os.path.getsize(checkpoint)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--resume", "--out", run, "--quiet"],
                            capture_output=True, text=True, timeout=300,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size - 1, size - 1)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "File too large (what was there before stands)" in result.stderr
    assert open(checkpoint, "rb").read() == before


def test_a_run_named_beyond_the_terminals_encoding_prints(tmp_path):
    """Bug caught (item 20): under PYTHONIOENCODING=ascii a run named é trained, then failed printing its name
    (a traceback, exit 1); eval.py the same. Now the name prints as an escape."""
    run = str(tmp_path / "é-run")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    loud = [a for a in RUN if a != "--quiet"] + ["--eval-samples", "4"]  # the final table names the run
    for script, args in (("train.py", [*loud, "--out", run]), ("eval.py", [run, "--samples", "4", "--threads", "1"])):
        result = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                                env=env, timeout=300)
        assert result.returncode == 0 and "\\xe9-run" in result.stdout, result.stderr


def workers_in(folder: str, parent: int) -> list[int]:
    """The --jobs worker processes (multiprocessing's spawn_main) running in `folder`, other than `parent`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != parent and os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(folder) \
                    and b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(int(pid))
        except OSError:  # gone meanwhile
            pass
    return found


def two_workers_or_skip():
    """--jobs 2 runs one worker at a time on a machine short of cores or free memory (common.usable_jobs): then
    no two workers appear to test."""
    from experiments import common
    if common.usable_jobs(2, 2) < 2:
        pytest.skip("this machine runs one --jobs worker at a time")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through Linux's /proc")
def test_workers_of_an_experiment_killed_outright_stop(tmp_path):
    """Bug caught (item 8): kill -9 of an experiment (or the OOM killer, or a closed terminal) left its --jobs
    workers alive, each holding a run's lock and ~450 MB, forever. They now notice and stop."""
    two_workers_or_skip()
    experiment = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", "ryarn", "--quick",
                                   "--jobs", "2", "--threads", "1", "--out-dir", "out"], cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300  # a loaded machine: the experiment imports torch before it starts them
    while len(workers_in(tmp_path, experiment.pid)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    workers = workers_in(tmp_path, experiment.pid)
    assert len(workers) == 2
    time.sleep(1)  # still importing, or into their first runs: either way they must stop
    experiment.kill()
    experiment.wait()
    deadline = time.time() + 300  # it ends as soon as they are gone; under load a worker still imports torch
    while workers_in(tmp_path, experiment.pid) and time.time() < deadline:
        time.sleep(0.2)
    left = workers_in(tmp_path, experiment.pid)
    for pid in left:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through Linux's /proc")
def test_ctrl_c_while_the_workers_start_is_one_line(tmp_path):
    """Bug caught (#53 item 21): Ctrl-C in the first seconds of --jobs 2 printed a worker's traceback: a worker
    still importing torch took SIGINT as a KeyboardInterrupt. The workers get it first here, while they import
    (a terminal sends it to the parent as well, which raced to stop them before they printed), then the group."""
    two_workers_or_skip()
    experiment = subprocess.Popen([sys.executable, os.path.join(ROOT, "eval.py"), "--experiment", "retrieval",
                                   "--quick", "--jobs", "2", "--threads", "1", "--out-dir", "out"], cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
    try:
        deadline = time.time() + 120
        while len(workers_in(tmp_path, experiment.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # past the interpreter's first steps, into the imports (torch's take a second or more)
        for pid in workers_in(tmp_path, experiment.pid):
            os.kill(pid, signal.SIGINT)
        time.sleep(1)
        os.killpg(experiment.pid, signal.SIGINT)
        err = experiment.communicate(timeout=60)[1]
    finally:
        if experiment.poll() is None:  # the experiment and its workers, should the test fail
            os.killpg(experiment.pid, signal.SIGKILL)
    assert experiment.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("eval.py: interrupted"), err


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path, script):
    """Bug caught (#53 item 21): Ctrl-C in a command's first second, while it imported torch, printed the import's
    traceback (and the status of a death by SIGINT, not 130)."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc to see when torch starts loading")
    command = subprocess.Popen([sys.executable, os.path.join(ROOT, script), "--help"], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60  # a fixed wait sent it before Python had started, on a loaded machine
    while command.poll() is None and time.time() < deadline:
        with open(f"/proc/{command.pid}/maps") as maps:
            if "libtorch" in maps.read():  # torch's import has begun, and it takes a second or more
                break
        time.sleep(0.002)
    command.send_signal(signal.SIGINT)
    err = command.communicate(timeout=60)[1]
    assert command.returncode == 130 and err == f"{script}: interrupted\n", err


def test_memory_is_the_containers_and_an_allocation_that_fails_is_one_line(tmp_path, monkeypatch, capsys):
    """Bug caught (item 13): the size checks read the machine's memory, not a container's cgroup limit, and a
    size between their lower bound and what a forward really takes ended in a 34-52-line allocation traceback."""
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")  # a 1 GiB container on a larger machine
    unlimited = tmp_path / "v1"
    unlimited.write_text("max\n")
    assert runs.physical_memory((str(unlimited), str(limit))) == 2 ** 30
    assert runs.physical_memory((str(unlimited),)) == runs.physical_memory(())
    import eval as lengen_eval
    run = str(tmp_path / "run")
    assert train.main([*RUN, "--out", run]) == 0

    def allocation_fails(*args, **kwargs):
        torch.empty(2 ** 62, dtype=torch.uint8)  # what a forward too large for this machine meets
    monkeypatch.setattr(lengen_eval, "evaluate_table", allocation_fails)
    assert lengen_eval.main([run, "--samples", "4", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of memory (4.29e+09 GiB asked at once)" in err, err


# A process that holds a folder through runs.hold once `go` exists, until `release` exists; it prints "held", or
# its one-line refusal and exits 2, as train.py would.
HOLDER = """
import os, sys, time
sys.path.insert(0, {root!r})
import runs
folder, go, release = sys.argv[1:]
while not os.path.exists(go):
    time.sleep(0.005)
try:
    with runs.hold(folder):
        print("held", flush=True)
        while not os.path.exists(release):
            time.sleep(0.01)
except runs.UsageError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


def holders(tmp_path, folder, n):
    script = HOLDER.format(root=ROOT)
    return [subprocess.Popen([sys.executable, "-c", script, folder, str(tmp_path / "go"), str(tmp_path / "release")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]


def test_processes_racing_for_one_folder_one_holds_it_the_others_are_refused(tmp_path):
    """#52: the lock is made by a hard link, which fails where the lock exists, on shared filesystems too where
    flock may not hold. Four processes let go at once: one holds the folder, three are refused in one line naming
    its holder. Bug caught: a lock made by a create that is not exclusive (every process held the folder)."""
    folder = str(tmp_path / "run")
    os.mkdir(folder)  # there already: which racer makes it is a race of its own (a folder made for a racer
    procs = holders(tmp_path, folder, 4)  # that another then holds stays, as hold() says)
    time.sleep(1.0)  # every interpreter started and waiting
    (tmp_path / "go").touch()
    deadline = time.time() + 120
    while sum(p.poll() is not None for p in procs) < 3 and time.time() < deadline:
        time.sleep(0.05)
    (tmp_path / "release").touch()
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    held = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] == 2]
    assert len(held) == 1 and held[0][1] == "held\n", results
    assert len(refused) == 3, results
    for _, _, err in refused:
        assert len(err.splitlines()) == 1 and "in use by another train.py (pid" in err, err
    assert os.listdir(folder) == []  # the holder's lock went with it, and every racer's claim with its racer


QUIET_RANK = """
import sys
sys.path.insert(0, {root!r})
import runs
def refuse(argv):
    open({marker!r}, "w").close()
    raise runs.UsageError("refused alike by every rank")
sys.exit(runs.cli_main("train.py", refuse, [], alike=True))
"""


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_rank_quiet_about_an_error_every_rank_finds_waits_for_the_launcher_to_end_it(rank, tmp_path):
    """Under torchrun, rank 0 alone says an error every rank finds; the launcher ends every process once one has
    failed. Rank 1 must not exit first: rank 0 could be ended before it said the error (a torchrun test saw no
    line at all on a loaded machine). Rank 1 stays until ended (the launcher's SIGTERM), then exits 2 saying
    nothing; rank 0 says its line and exits at once. Bug caught: a quiet rank exiting at once."""
    marker = tmp_path / "refused"
    proc = subprocess.Popen([sys.executable, "-c", QUIET_RANK.format(root=ROOT, marker=str(marker))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RANK": rank, "WORLD_SIZE": "2"})
    if rank == "1":
        deadline = time.time() + 120  # importing runs (torch) takes seconds on a loaded machine
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # refused, and still there
        proc.send_signal(signal.SIGTERM)
    code, (out, err) = proc.wait(timeout=60), proc.communicate()
    assert code == 2 and out == "", (code, err)
    assert err == ("" if rank == "1" else "train.py: error: refused alike by every rank\n"), err


def test_a_lock_names_its_holder_from_the_instant_it_exists(tmp_path):
    """A rival that looks while the lock is being made reads who holds it, never an empty file. Checked at each
    file operation take_lock makes (an audit hook): from the moment the lock is there, it names this process.
    Bug caught (CI, once in many runs): the lock made empty by an exclusive create and its holder's name written
    after, so a rival reading in between was refused with no pid."""
    folder = tmp_path / "run"
    folder.mkdir()
    lock, seen, watching = str(folder / folder_lock.LOCK_NAME), [], [False]

    def look(event, args):
        if watching[0] and event in ("open", "os.link", "os.remove") and os.path.lexists(lock):
            watching[0] = False  # reading the lock raises an "open" of its own
            seen.append((event, folder_lock.lock_owner(lock)))
            watching[0] = True

    sys.addaudithook(look)  # an audit hook stays for the process; it looks only while `watching`
    watching[0] = True
    try:
        folder_lock.take_lock(str(folder), "train.py")
    finally:
        watching[0] = False
    assert seen, "no file operation after the lock was made"
    assert all(owner is not None and owner["pid"] == os.getpid() for _, owner in seen), seen
    assert sorted(os.listdir(folder)) == [folder_lock.LOCK_NAME]  # this process's own claim file went


@pytest.mark.parametrize("link", ["none on this filesystem", "made, then answered exists (NFS)"])
def test_a_lock_is_taken_where_hard_links_fail_or_lie(tmp_path, monkeypatch, link):
    """Where the filesystem has no hard links (vfat, some FUSE mounts) the lock is an exclusive create instead;
    where NFS answers a link it made with "exists", the claim's second link shows it is ours. Either way this
    process holds the folder, the lock names it, and no claim is left. Bugs caught: every run refused where
    os.link is not permitted; a process refusing itself, named in its own lock."""
    real_link = os.link

    def fake_link(src, dst):
        if link.startswith("none"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_link(src, dst)
        raise FileExistsError(errno.EEXIST, "File exists")
    monkeypatch.setattr(folder_lock.os, "link", fake_link)
    folder = tmp_path / "run"
    folder.mkdir()
    me = folder_lock.take_lock(str(folder), "train.py")
    assert folder_lock.lock_owner(str(folder / folder_lock.LOCK_NAME)) == json.loads(me)
    assert os.listdir(folder) == [folder_lock.LOCK_NAME]


STOPPED_WORKER = """
import os, sys, time
sys.path.insert(0, {root!r})
import runs
from experiments import common
common.worker_setup(1, os.getppid())
with runs.hold({folder!r}):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_worker_told_to_stop_leaves_no_run_folder_locked(tmp_path):
    """An experiment's Ctrl-C ends its --jobs workers at once (SIGTERM, os._exit): their `hold` blocks never
    finish. A worker releases the locks it holds first, so the next run, from this host or another, finds the
    folder free. Bug caught: every folder a worker held left locked (from another host, for LOCK_STALE_S)."""
    folder = tmp_path / "run"
    folder.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", STOPPED_WORKER.format(root=ROOT, folder=str(folder))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert worker.stdout.readline() == "held\n"
    assert os.listdir(folder) == [folder_lock.LOCK_NAME]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 130, worker.stderr.read()
    assert os.listdir(folder) == []


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    """#52: a process killed outright (kill -9, a node lost) cannot remove its lock file. On the same host the lock
    names a process that is gone: the next train.py says so in one line and trains. Bug caught: a stale lock
    refused like a live one (the folder blocked for good)."""
    folder = str(tmp_path / "run")
    (tmp_path / "go").touch()
    proc, = holders(tmp_path, folder, 1)
    assert proc.stdout.readline() == "held\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert os.path.exists(os.path.join(folder, folder_lock.LOCK_NAME))  # what a killed holder leaves
    assert train.main([*RUN, "--out", folder]) == 0
    err = capsys.readouterr().err
    assert f"taking over a stale lock (its process {proc.pid} on" in err and "is gone" in err, err
    assert os.path.isfile(os.path.join(folder, "checkpoint.pt"))
    assert not os.path.exists(os.path.join(folder, folder_lock.LOCK_NAME))


def test_a_lock_from_another_host_is_stale_only_once_its_holder_stops_touching_it(tmp_path, capsys):
    """#52: another node's process cannot be looked up, so its lock counts as held while its holder touches it
    (every LOCK_BEAT_S), and as stale once untouched for LOCK_STALE_S. Bugs caught: a lock from another host
    judged by a pid of this host (taken over while held); one never judged stale."""
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / folder_lock.LOCK_NAME
    lock.write_text(json.dumps({"host": "another-node.invalid", "pid": os.getpid() + 10 ** 7, "holder": "train.py"}))
    assert train.main([*RUN, "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "in use by another train.py (pid" in err and "another-node" in err, err
    assert os.listdir(folder) == [folder_lock.LOCK_NAME]  # nothing written
    old = time.time() - folder_lock.LOCK_STALE_S - 60
    os.utime(lock, (old, old))
    assert train.main([*RUN, "--out", str(folder)]) == 0
    assert "taking over a stale lock (untouched for" in capsys.readouterr().err
    assert not lock.exists() and (folder / "checkpoint.pt").exists()


def test_a_folder_whose_tidying_fails_is_still_released(tmp_path, monkeypatch):
    """A swap cut short that cannot be finished (here an I/O error) fails the way in and again the way out; the
    folder is released all the same. Bug caught: the lock left to this process, alive (a --jobs worker, an
    experiment in one process), so every later run on the folder was refused."""
    def fails(out):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(runs, "finish_swap", fails)
    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(runs.UsageError, match="cannot finish a --force swap"):
        with runs.hold(str(folder)):
            pass
    assert os.listdir(folder) == [] and str(folder / folder_lock.LOCK_NAME) not in folder_lock.HELD


def test_a_stale_lock_being_taken_over_by_another_that_has_just_finished(tmp_path, monkeypatch):
    """Two processes find a lock stale at once; the second finds the first's .break file, which is gone as it
    looks (the first has just taken over). It tries again and is told who holds the folder, or holds it. Bug
    caught: "cannot write to ...: No such file or directory" (os.stat of the .break that went)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / folder_lock.LOCK_NAME
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout), "holder": "train.py"}))
    real_open, raced = os.open, []

    def open_racing(path, flags, mode=0o777, **kwargs):
        if str(path).endswith(".break") and not raced:  # the other's .break: there, then gone as we look
            raced.append(path)
            raise FileExistsError(errno.EEXIST, "File exists")
        return real_open(path, flags, mode, **kwargs)
    monkeypatch.setattr(folder_lock.os, "open", open_racing)
    me = folder_lock.take_lock(str(folder), "train.py")
    assert raced and folder_lock.lock_owner(str(lock)) == json.loads(me)
    assert os.listdir(folder) == [folder_lock.LOCK_NAME]
    folder_lock.release(str(lock))


COPIED_LOCK = """
import os, sys
import folder_lock as fl
out = sys.argv[1]
lock = os.path.join(out, fl.LOCK_NAME)
fl.take_lock(out, "my-trainer")
try:
    with fl.beating(lock):
        try:  # a second taker (here this same process, alive) is refused
            fl.take_lock(out, "my-trainer")
        except fl.Busy as e:
            print(e)
finally:
    fl.release(lock)
fl.take_lock(out, "my-trainer")
print(sorted(os.listdir(out)))
"""


def test_the_folder_lock_copied_alone_holds_a_folder(tmp_path):
    """folder_lock.py copied into another project works as its docstring shows, on the standard library alone
    (python -S: no site packages, so no torch). Bugs caught: a copy that fails on import (it reaching for runs or
    torch); a second taker not refused, or refused without its holder's name; a lock left after release."""
    shutil.copy(os.path.join(ROOT, "folder_lock.py"), tmp_path / "folder_lock.py")
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, "-S", "-c", COPIED_LOCK, str(tmp_path / "run")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    busy, listing = done.stdout.splitlines()
    assert busy.startswith(f"{tmp_path / 'run'} is in use by another my-trainer (pid "), busy
    assert listing == f"[{folder_lock.LOCK_NAME!r}]", listing  # one lock, taken again after release; no claims


def test_a_held_lock_is_touched_so_another_host_sees_it_alive(tmp_path, monkeypatch):
    """Bug caught: a heartbeat that never renews the lock's time, so a run longer than LOCK_STALE_S would be taken
    over by another node while it trains."""
    monkeypatch.setattr(folder_lock, "LOCK_BEAT_S", 0.05)
    folder = str(tmp_path / "run")
    with runs.hold(folder):
        lock = os.path.join(folder, folder_lock.LOCK_NAME)
        os.utime(lock, (0, 0))
        time.sleep(0.5)
        assert time.time() - os.stat(lock).st_mtime < 5

# ---------------------------------------------------------------------------------------------------------
# Round four (#53): swaps cut short, diverged first steps, files that are not plain files
# ---------------------------------------------------------------------------------------------------------


def run_files(folder) -> dict:
    """A folder's run files (runs.RUN_FILES present in it), name -> bytes."""
    return {name: open(os.path.join(folder, name), "rb").read() for name in runs.RUN_FILES
            if os.path.isfile(os.path.join(folder, name))}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An old run, and a new one (another seed, and a fit.json the old one lacks) as swap_in finds it: whole in
    the old run's .lengen.new."""
    base = tmp_path_factory.mktemp("two")
    old, new = str(base / "old"), str(base / "new")
    assert train.main([*RUN, "--out", old]) == 0
    assert train.main([*RUN, "--seed", "1", "--fit-bar", "0.99", "--fit-every", "1", "--out", new]) == 0
    shutil.copytree(new, os.path.join(old, ".lengen.new"))
    return old, run_files(old), run_files(new)


class Killed(BaseException):
    """A SIGKILL, in this process: nothing after it runs (no except clause of lengen's catches it)."""


def renames_fail_at(monkeypatch, call: int, error: BaseException) -> None:
    """os.rename raises `error` at its call number `call` (from 0) from now on."""
    rename, count = os.rename, [0]

    def failing(*args):
        count[0] += 1
        if count[0] == call + 1:
            raise error
        rename(*args)
    monkeypatch.setattr(os, "rename", failing)


def test_a_swap_killed_at_any_rename_is_finished_by_the_next_command(two_runs, tmp_path, monkeypatch, capsys):
    """Bug caught (item 1): a kill inside swap_in left the old run in out/.lengen.old, and the next train.py on
    the folder (even a plain one, refused) deleted it with the new run's remaining files: neither run left. eval.py
    said "not a run directory". Now the next command (train.py or eval.py) finishes the swap, in one line."""
    import eval as lengen_eval
    template, old, new = two_runs
    for call in range(20):
        run = str(tmp_path / f"run{call}")
        shutil.copytree(template, run)
        renames_fail_at(monkeypatch, call, Killed())
        try:
            runs.swap_in(os.path.join(run, ".lengen.new"), run)
            finished = True
        except Killed:
            finished = False
        monkeypatch.undo()
        capsys.readouterr()
        if call % 2:  # a plain train.py, refused: the folder holds a run
            assert train.main([*RUN, "--out", run]) == 2
        else:
            assert lengen_eval.main([run, "--lengths", "16", "--samples", "4", "--threads", "1"]) == 0
        err = capsys.readouterr().err
        assert run_files(run) == new, f"killed at rename {call}: {sorted(run_files(run))}"
        assert sorted(f for f in os.listdir(run) if f.startswith(".")) == [], call
        assert finished or "swap of runs here was cut short" in err, err
        if finished:
            break
    assert finished and call > 5  # every rename of the swap was a point of the kill


def test_a_swap_whose_rename_fails_part_way_puts_the_old_run_back_whole(two_runs, tmp_path, monkeypatch):
    """#53 (tests that catch): a rename that fails within swap_in (here EIO, at each rename in turn) is one line,
    and leaves the old run exactly as it was and the new one whole where it was built."""
    import errno
    template, old, new = two_runs
    for call in range(20):
        run = str(tmp_path / f"run{call}")
        shutil.copytree(template, run)
        renames_fail_at(monkeypatch, call, OSError(errno.EIO, os.strerror(errno.EIO)))
        try:
            runs.swap_in(os.path.join(run, ".lengen.new"), run)
            break
        except runs.UsageError as e:
            assert "the run there is unchanged" in str(e)
        finally:
            monkeypatch.undo()
        assert run_files(run) == old and run_files(os.path.join(run, ".lengen.new")) == new, call
        assert sorted(f for f in os.listdir(run) if f.startswith(".")) == [".lengen.new"], call
    assert call > 5 and run_files(run) == new


def test_a_whole_new_run_killed_before_its_swap_began_goes_in(two_runs, tmp_path, capsys):
    """Bug caught (#53, round four's follow-up): a train.py --force killed after its new run's first checkpoint
    but before swap_in began left the whole new run in out/.lengen.new, and the next command on the folder deleted
    it. Now it is put in place, as the command asked and as a swap cut short one rename later is, and said to be;
    a build that never became whole (no checkpoint) is still cleared."""
    import eval as lengen_eval
    template, old, new = two_runs
    for command in ("train", "eval"):
        run = str(tmp_path / command)
        shutil.copytree(template, run)
        capsys.readouterr()
        if command == "train":  # a plain train.py, refused: the folder holds a run
            assert train.main([*RUN, "--out", run]) == 2
        else:
            assert lengen_eval.main([run, "--lengths", "16", "--samples", "4", "--threads", "1"]) == 0
        err = capsys.readouterr().err
        assert run_files(run) == new and not [f for f in os.listdir(run) if f.startswith(".")], command
        assert f"continue it with python train.py --resume --out {run}" in err, err
    beside = tmp_path / ".fresh.new"  # built beside --out, which did not exist yet
    shutil.copytree(os.path.join(template, ".lengen.new"), beside)
    assert train.main([*RUN, "--out", str(tmp_path / "fresh")]) == 2
    assert run_files(tmp_path / "fresh") == new and not beside.exists()
    half = str(tmp_path / "half")  # killed before its first checkpoint: nothing whole to keep
    shutil.copytree(template, half)
    os.remove(os.path.join(half, ".lengen.new", "checkpoint.pt"))
    assert train.main([*RUN, "--out", half]) == 2
    assert run_files(half) == old and not [f for f in os.listdir(half) if f.startswith(".")]


def test_a_forced_run_that_diverges_in_its_first_step_leaves_the_old_run(tmp_path, monkeypatch, capsys):
    """Bug caught (item 5): --force with settings whose first step turns the weights to NaN while its loss was
    finite (here a backward that overflows: every gradient NaN) swapped in that checkpoint, then stopped at step
    2's loss: the old run gone, a NaN model in its place. Weights that are not finite are never saved."""
    run = str(tmp_path / "run")
    assert train.main([*RUN, "--out", run]) == 0
    before = run_files(run)

    def overflowed(parameters, max_norm):
        for p in parameters:
            p.grad.fill_(float("nan"))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", overflowed)
    assert train.main([*RUN, "--seed", "1", "--force", "--out", run]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the weights are not finite" in err, err
    assert run_files(run) == before and sorted(os.listdir(tmp_path)) == ["run"]


def fine_tune(tmp_path, capsys, *args, on_step=None) -> int:
    """train.py --llm on a tiny random Llama (test_llm_fine_tune.save_sharp_llm), in this process."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from test_llm_fine_tune import save_sharp_llm
    llm = str(tmp_path / "llm")
    if not os.path.isdir(llm):
        save_sharp_llm(llm)
    capsys.readouterr()  # what saving the model printed
    previous = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM a Ctrl-C; this process gets its own back
    try:
        return runs.cli_main("train.py", lambda argv: train.run(argv, on_step),
                             ["--llm", llm, "--task", "passkey", "--method", "ft", "--train-len", "128", "--threads",
                              "1", "--quiet", *args])
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_llm_fine_tune_whose_out_folder_appears_while_it_trains_goes_in(tmp_path, capsys):
    """Bug caught (item 8): the fine-tune was built beside --out (no folder yet); --out appeared while it trained,
    and the swap looked for the run inside it (build_folder asked again): 'cannot put the new run', and the
    fine-tune, beside, was deleted on the way out."""
    out = str(tmp_path / "run")

    def appear(step, ids, positions):
        os.makedirs(out, exist_ok=True)
    assert fine_tune(tmp_path, capsys, "--steps", "2", "--out", out, on_step=appear) == 0, capsys.readouterr().err
    assert os.path.isfile(os.path.join(out, "config.json")) and os.path.isdir(os.path.join(out, "model"))
    assert sorted(os.listdir(tmp_path)) == ["llm", "run"]


def test_an_llm_fine_tune_that_ends_with_weights_not_finite_saves_nothing(tmp_path, monkeypatch, capsys):
    """Bug caught (item 5, the LLM's): a last step whose backward overflowed (every gradient NaN, the loss
    finite) saved a NaN model and swapped it in over the run --force replaced, exit 0."""
    out = str(tmp_path / "run")
    assert fine_tune(tmp_path, capsys, "--steps", "1", "--out", out) == 0
    before = open(os.path.join(out, "config.json"), "rb").read()

    def overflowed(parameters, max_norm):
        for p in parameters:
            p.grad.fill_(float("nan"))
        return torch.tensor(float("nan"))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", overflowed)
    assert fine_tune(tmp_path, capsys, "--steps", "1", "--seed", "1", "--force", "--out", out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the weights are not finite" in err, err
    assert open(os.path.join(out, "config.json"), "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["llm", "run"]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_hugging_face_model_folder_is_not_a_run(tmp_path, capsys, force):
    """Bug caught (item 9): a folder with a config.json counted as a run, whatever the config: --force replaced a
    Hugging Face model's config.json (and without --force it was 'already holds a run: --resume to continue it')."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"weights")
    before = run_files(model)
    assert train.main([*RUN, "--out", str(model), *force]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a config.json that is not a lengen run's" in err, err
    assert run_files(model) == before and sorted(os.listdir(model)) == ["config.json", "model.safetensors"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("small") / "run")
    assert train.main([*RUN, "--out", run]) == 0
    return run


def special_file(folder, kind: str, name: str) -> str:
    """folder/name, not a plain file: a symlink to one, a FIFO, a device node (as /dev/null's, where this process
    may make one), or a file with a second hard link."""
    path, target = os.path.join(folder, name), os.path.join(folder, "target")
    with open(target, "w") as f:
        f.write("the user's")
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "hardlink":
        os.link(target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("this process may not make a device node")
    return path


@pytest.mark.parametrize("flag, kind, message", [("--json", "symlink", "a symlink, not a plain file"),
                                                 ("--json", "fifo", "a FIFO, not a plain file"),
                                                 ("--plot", "fifo", "a FIFO, not a plain file"),
                                                 ("--json", "device", "a device, a socket or some other special"),
                                                 ("--plot", "hardlink", "a file with 2 hard links")])
def test_json_and_plot_refuse_what_is_not_a_plain_file_without_opening_it(small_run, tmp_path, capfd, flag, kind,
                                                                          message):
    """Bugs caught (items 3, 16): --json or --plot onto a symlink replaced the link (its target untouched), onto a
    device node replaced the node (as root, --json /dev/null would replace the machine's /dev/null), onto a hard
    link parted it; onto a FIFO nobody reads, eval.py waited for ever before computing anything (the check opened
    it: here in a process of its own, which the timeout ends). Each is refused in one line, before anything is
    computed, and left as it was."""
    path = special_file(str(tmp_path), kind, "out" + (".png" if flag == "--plot" else ".json"))
    before = os.lstat(path)
    args = [small_run, "--lengths", "16", "--samples", "4", "--threads", "1", flag, path]
    if kind == "fifo":
        result = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), *args], capture_output=True,
                                text=True, timeout=300)  # as long as a loaded machine takes to import torch
        code, out, err = result.returncode, result.stdout, result.stderr
    else:
        code, err = in_process("eval", args, capfd)
        out = ""
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert out == "" and "accuracy" not in err  # nothing computed
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode, after.st_nlink) == (before.st_ino, before.st_mode, before.st_nlink)
    assert open(os.path.join(tmp_path, "target")).read() == "the user's"


def test_json_keeps_the_permissions_of_the_file_it_replaces(small_run, tmp_path):
    """Bug caught (item 3): --json over a private file (0600) left a new file of the default mode (0644 under
    the usual umask), readable by all."""
    import eval as lengen_eval
    path = tmp_path / "private.json"
    path.write_text("{}")
    os.chmod(path, 0o600)
    assert lengen_eval.main([small_run, "--lengths", "16", "--samples", "4", "--threads", "1", "--json",
                             str(path)]) == 0
    assert json.loads(path.read_text())["rows"] and os.stat(path).st_mode & 0o777 == 0o600


def test_json_never_writes_over_a_models_files(tmp_path, capsys):
    """Bug caught (item 2): eval.py --json wrote over a Hugging Face folder's model.safetensors or tokenizer.json
    (an LLM run's model/ is one): only a run's own files, beside a config.json, were refused."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import eval as lengen_eval
    from test_llm_fine_tune import save_sharp_llm
    llm = save_sharp_llm(str(tmp_path / "llm"))
    os.makedirs(tmp_path / "loose")
    shutil.copy(os.path.join(llm, "tokenizer.json"), tmp_path / "loose")  # a model's file, outside its folder
    before = {name: open(os.path.join(llm, name), "rb").read() for name in os.listdir(llm)}
    capsys.readouterr()
    for target, message in ((os.path.join(llm, "model.safetensors"), "holds a model"),
                            (os.path.join(llm, "tokenizer.json"), "holds a model"),
                            (os.path.join(llm, "scores.json"), "holds a model"),
                            (str(tmp_path / "loose" / "tokenizer.json"), "that is a model's file")):
        previous = signal.getsignal(signal.SIGTERM)
        try:
            code = lengen_eval.main(["--llm", llm, "--task", "passkey", "--lengths", "128", "--samples", "1",
                                     "--threads", "1", "--json", target])
        finally:
            signal.signal(signal.SIGTERM, previous)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, (target, err)
    assert {name: open(os.path.join(llm, name), "rb").read() for name in os.listdir(llm)} == before


def test_a_forced_rerun_without_a_fit_bar_leaves_no_fit_record(tmp_path):
    """#53 (tests that catch): --force replaces every file of the old run, fit.json among them: a rerun without
    --fit-bar must not be read as fitted (or unfitted) by the old run's record. Bug planted to watch it fail:
    fit.json left out of runs.RUN_FILES (the old record stayed beside the new run)."""
    run = str(tmp_path / "run")
    assert train.main([*RUN, "--fit-bar", "0.99", "--fit-every", "1", "--out", run]) == 0
    assert runs.read_fit(run)["bar"] == 0.99
    assert train.main([*RUN, "--seed", "1", "--force", "--out", run]) == 0
    assert sorted(os.listdir(run)) == ["checkpoint.pt", "config.json", "log.jsonl", "made-by.json"]
    with pytest.raises(runs.UsageError, match="no readable fit.json"):
        runs.read_fit(run)
