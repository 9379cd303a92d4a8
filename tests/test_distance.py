"""python eval.py --experiment distance --quick: it runs, writes its files, a model learns its delay band, and
the numbers it reports are the ones its saved models produce."""
import argparse
import dataclasses
import importlib.util
import json
import os

import pytest

import eval as lengen_eval
import train
from experiments import common, stats
from experiments import distance as exp
from experiments import distance_report as report


@pytest.mark.slow  # ~15-20 s: the fast suite keeps under 3 minutes
def test_distance_quick_reports_what_its_models_measure(tmp_path, monkeypatch):
    """Bug caught: results that are not the models' own: a curve taken from another run, a mixed (C + S) model
    measured on S instead of on C (the task it shares with its single-task twin), a transfer delta of the wrong
    sign or over the wrong delays, a verdict that disagrees with its sub-claims. Also that the experiment runs
    and writes every section, and that at least one encoding learns delay copy inside its band."""
    monkeypatch.chdir(tmp_path)  # the experiment's runs/ go here, not into the repository
    out = tmp_path / "results"
    assert lengen_eval.main(["--experiment", "distance", "--quick", "--threads", "1", "--out-dir", str(out)]) == 0
    md = (out / "distance.md").read_text()
    for heading in ("## Verdicts", "## Size", "## (A, delay copy)", "## (A, selective copy)", "## (B) Diversity",
                    "## (C) Transfer"):
        assert heading in md
    assert "| ALiBi's slopes | the paper's rule for 8 heads | the 8-head slopes, evenly spaced over 4 heads" in md
    data = json.loads((out / "distance.json").read_text())
    assert set(data["verdicts"]) == {"size", "A, delay copy", "A, selective copy", "B", "C"}
    assert data["runtime"]["cpu_s"] > 0 and data["runtime"]["jobs"] == 1  # what the run cost, CPU time too
    # every curve covers every delay from 0 to 4x the band's top
    top = data["settings"]["top"]
    assert top >= 4 * data["settings"]["band"][1]
    assert all(run["delays"] == list(range(top + 1)) for run in data["A"]["delay_copy"].values())
    # at least one encoding learns delay copy inside its training band
    in_range = {e: max(run["in_mean"]) for e, run in data["A"]["delay_copy"].items()}
    assert max(in_range.values()) > 0.9, in_range
    # Re-measure two saved models from their run directories, as the experiment says it measures them: on C
    # (delay_copy) at every delay, with the experiment's samples; the JSON must hold exactly those numbers.
    setup = data["settings"]
    (lo, hi), (s_lo, s_hi), size = setup["band"], setup["adjacent"], f"{setup['layers']}x{setup['width']}"
    alone, mixed = data["C"]["adjacent"]["rope"]["alone"], data["C"]["adjacent"]["rope"]["mixed"]
    for name, curve in ((f"delay_copy-rope-{size}-d{lo}-{hi}-seed0", data["A"]["delay_copy"]["rope"]),
                        (f"mixed_copy-rope-{size}-d{lo}-{hi}-s{s_lo}-{s_hi}-seed0", mixed)):
        model, cfg = lengen_eval.load_run(str(tmp_path / "runs" / "distance" / "quick" / name))
        cfg = dataclasses.replace(cfg, task="delay_copy",
                                  task_options={"symbols": setup["symbols"], "m": setup["m"], "delays": (lo, hi)})
        rows, _ = lengen_eval.evaluate_table(model, cfg, delays=range(top + 1), samples=setup["samples"])
        assert curve["per_seed"][0] == [r["accuracy"] for r in rows], name
    assert alone["per_seed"] == data["A"]["delay_copy"]["rope"]["per_seed"]  # C alone is (A)'s model
    # transfer: mixed minus alone, per delay, and each region its mean over its own delays
    delta = data["C"]["adjacent"]["rope"]["delta"]
    assert delta == pytest.approx([m - a for m, a in zip(mixed["mean"], alone["mean"])])
    regions = data["C"]["adjacent"]["rope"]["regions"]
    assert regions["C range"] == pytest.approx(sum(delta[lo:hi + 1]) / (hi - lo + 1))
    assert regions["S range"] == pytest.approx(sum(delta[s_lo:s_hi + 1]) / (s_hi - s_lo + 1))
    # each question's verdict follows from its comparisons, and (A)'s are the per-seed differences at unseen delays
    for name, result in data["verdicts"].items():
        assert result["verdict"] == stats.all_of([c["verdict"] for c in result["checks"]]), name
    runs = data["A"]["delay_copy"]
    unseen = {e: [sum(a for d, a in zip(r["delays"], seed) if not lo <= d <= hi) / (top + 1 - (hi - lo + 1))
                  for seed in r["per_seed"]] for e, r in runs.items()}
    nope_alibi = data["verdicts"]["A, delay copy"]["checks"][0]
    assert nope_alibi["what"] == "nope - alibi at unseen delays"
    assert nope_alibi["per_unit"] == pytest.approx([n - a for n, a in zip(unseen["nope"], unseen["alibi"])])
    assert f"One family of {sum(len(r['checks']) for r in data['verdicts'].values())} comparison(s)" in md
    # every model's train.py command is listed, once, and is the command that trained it: the folders its
    # --out names are the folders trained, and each one's saved settings are what its flags say
    listed = [line.split()[2:] for line in md.splitlines() if line.startswith("python train.py ")]
    folders = [argv[argv.index("--out") + 1] for argv in listed]
    trained = os.listdir(tmp_path / "runs" / "distance" / "quick")
    assert sorted(folders) == sorted(os.path.join("runs", "distance", "quick", n) for n in trained)
    for argv in listed:
        saved = json.loads((tmp_path / argv[argv.index("--out") + 1] / "config.json").read_text())
        flags = train.build_parser().parse_args(argv)
        assert (saved["seed"], saved["lr"], saved["steps"], saved["encoding"]) == \
            (flags.seed, flags.lr, flags.steps, flags.encoding), argv
    if importlib.util.find_spec("matplotlib"):
        assert (out / "distance.png").stat().st_size > 0
    # issue 51: every model trained its task's whole budget, and the json holds what its fit.json says: the steps,
    # the in-range accuracy at the end, and the curves over training, in range and at delay top
    for name, curve in ((f"delay_copy-rope-{size}-d{lo}-{hi}-seed0", data["A"]["delay_copy"]["rope"]),
                        (f"mixed_copy-rope-{size}-d{lo}-{hi}-s{s_lo}-{s_hi}-seed0", mixed)):
        fit = common.read_fit(str(tmp_path / "runs" / "distance" / "quick" / name))
        assert curve["steps_trained"] == [setup["budget"]["delay_copy"]] and fit["far"]["at"] == 2 * hi
        assert curve["fit_at_end"] == [fit["checks"][-1][1]]
        assert curve["curves"] == [{"steps": [s for s, _ in fit["checks"]], "in_range": [a for _, a in fit["checks"]],
                                    "out_of_range": [a for _, a in fit["far"]["checks"]]}]
    assert "## (A) over training" in md and "Out of range over training, delay_copy: from step 50 " in md


def synthetic_ordering(in_means: dict, unseen: dict, band=(3, 5), top=8) -> dict:
    """(A)'s curves, made up: per encoding and seed, accuracy in_mean inside the band and unseen outside it; a
    seed fitted (at step 100) where in_mean reaches the bar."""
    delays = list(range(top + 1))
    return {e: {"delays": delays, "in_mean": in_means[e],
                "steps_to_fit": [100 if i >= stats.FIT_BAR else None for i in in_means[e]],
                "per_seed": [[i if band[0] <= d <= band[1] else u for d in delays]
                             for i, u in zip(in_means[e], unseen[e])]} for e in in_means}


def test_a_question_is_decided_over_the_seeds_where_its_models_fitted():
    """Paper D's ordering, made up so that it holds by 0.2 on each of 3 seeds: reproduced while every model fits
    its band; with one seed of NoPE unfit, the comparisons rest on the 2 other seeds (undecided: 3 are
    needed), with two unfit, on none (undecided (models did not fit)). Bugs caught: a fit gate that ignores
    the seeds, a difference taken across different seeds, or the order of a comparison reversed."""
    fit = [0.95, 0.97, 0.96]
    unseen = {"nope": [0.80, 0.82, 0.79], "alibi": [0.60, 0.61, 0.60], "rope": [0.40, 0.42, 0.39]}

    def decided(in_means):
        checks = exp.ordering(synthetic_ordering(in_means, unseen), (3, 5))
        result = stats.decide({c["what"]: c["per_unit"] for c in checks}, stats.THRESHOLD,
                              {c["what"]: c["fitted"] for c in checks})
        return checks, [r["verdict"] for r in result.values()]

    checks, verdicts = decided({"nope": fit, "alibi": fit, "rope": fit})
    assert checks[0]["per_unit"] == pytest.approx([0.20, 0.21, 0.19]) and verdicts == ["reproduced"] * 2
    checks, verdicts = decided({"nope": [0.5, 0.97, 0.96], "alibi": fit, "rope": fit})
    assert checks[0]["per_unit"] == pytest.approx([0.21, 0.19]) and verdicts[0].startswith("undecided (2 unit")
    assert verdicts[1] == "reproduced"
    _, verdicts = decided({"nope": [0.5, 0.5, 0.96], "alibi": fit, "rope": fit})
    assert verdicts[0] == stats.UNFIT and stats.all_of(verdicts) == "undecided"


def test_probe_records_each_models_fit_of_its_band(tmp_path, monkeypatch):
    """--probe plans Paper D's default. Bugs caught: a (task, encoding, width) missing or read from another
    model's folder, a probe model without the fit check or without ALiBi's 8-head slopes, and a probe that
    writes over results/distance.json."""
    monkeypatch.chdir(tmp_path)
    probe = {**exp.PRESETS["quick"], "budget": exp.budget(20), "every": 10, "sizes": ((1, 16), (2, 32)),
             "samples": 0}
    monkeypatch.setitem(exp.PRESETS, "probe", probe)
    assert lengen_eval.main(["--experiment", "distance", "--probe", "--threads", "1", "--out-dir", "out"]) == 0
    data = json.loads((tmp_path / "out" / "distance-probe.json").read_text())
    rows = [f"{e}, {size}" for e in exp.DISTANCE_ENCODINGS for size in ("1x16", "2x32")]
    assert list(data["fits"]) == ["delay_copy", "selective_copy"]
    assert all(list(fits) == rows for fits in data["fits"].values())
    for command in data["commands"]:
        folder = command.split(" --out ")[1].split()[0]
        task, encoding = command.split("--task ")[1].split()[0], command.split("--encoding ")[1].split()[0]
        size = command.split("--layers ")[1].split()[0] + "x" + command.split("--dim ")[1].split()[0]
        fit = common.read_fit(str(tmp_path / folder))
        recorded = data["fits"][task][f"{encoding}, {size}"]
        assert {k: recorded[k] for k in ("steps_to_fit", "last")} == {"steps_to_fit": fit["steps_to_fit"],
                                                                       "last": fit["checks"][-1]}
        assert recorded["cpu_s"] > 0  # what its training took (issue 53, item 10)
        assert command.endswith(" --fit-bar 0.9 --fit-every 10 --no-fit-stop")  # all 20 steps; nothing out of range
        assert [s for s, _ in fit["checks"]] == [10, 20] and recorded["checks"] == fit["checks"]
        assert ("--alibi-slope-heads 8" in command) == (encoding == "alibi")
    assert len(data["commands"]) == 12 and not (tmp_path / "out" / "distance.json").exists()
    assert "| alibi, 2x32 | " in (tmp_path / "out" / "distance-probe.md").read_text()


@pytest.mark.slow  # ~15 s: a small default run
def test_the_default_shows_the_probe_that_planned_it(tmp_path, monkeypatch):
    """results/distance.md says how its design was chosen: the probe on record beside it, its table and the plan.
    Bugs caught: the probe read from another folder than the results', or its table not rendered."""
    monkeypatch.chdir(tmp_path)
    small = {**exp.PRESETS["quick"], "budget": exp.budget(20), "every": 10}
    monkeypatch.setitem(exp.PRESETS, "probe", {**small, "samples": 0})
    monkeypatch.setitem(exp.PRESETS, "default", small)
    assert lengen_eval.main(["--experiment", "distance", "--probe", "--threads", "1", "--out-dir", "out"]) == 0
    assert lengen_eval.main(["--experiment", "distance", "--threads", "1", "--out-dir", "out"]) == 0
    probe = json.loads((tmp_path / "out" / "distance-probe.json").read_text())
    data = json.loads((tmp_path / "out" / "distance.json").read_text())
    assert data["probe"] == {k: v for k, v in probe.items() if k != "commands"}
    md = (tmp_path / "out" / "distance.md").read_text()
    assert "## How this design was chosen" in md and probe["command"] in md
    assert "(C) trains rope only: nope " in md  # the plan: what its parts train, and why
    assert all(f"| {row} | " + " | ".join(common.probe_cell(probe["fits"][t][row]) for t in probe["fits"]) + " |"
               in md for row in probe["fits"]["delay_copy"])
    assert lengen_eval.main(["--experiment", "distance", "--threads", "1", "--out-dir", "other", "--force"]) == 0
    assert "## How this design was chosen" not in (tmp_path / "other" / "distance.md").read_text()


def test_a_preset_that_leaves_b_and_c_out_trains_and_decides_a_alone(tmp_path, monkeypatch):
    """The default keeps (A) at the budget its slowest encoding needs and leaves (B) and (C) out (issue 51: fewer
    parts, not models trained less). Bugs caught: a left-out part still trained, decided (an empty part
    read as reproduced) or drawn, or its section missing instead of saying it is left out."""
    monkeypatch.chdir(tmp_path)
    small = {**exp.PRESETS["quick"], "diversity_encodings": (), "transfer_encodings": ()}
    monkeypatch.setitem(exp.PRESETS, "quick", small)
    assert all(key[0] != "mixed_copy" and key[3] == small["band"] for key in exp.planned_models(small))
    assert lengen_eval.main(["--experiment", "distance", "--quick", "--threads", "1", "--out-dir", "out"]) == 0
    data = json.loads((tmp_path / "out" / "distance.json").read_text())
    assert set(data["verdicts"]) == {"size", "A, delay copy", "A, selective copy"}
    assert data["B"] == {} and data["C"] == {}
    assert not any("mixed_copy" in name or "-d0-" in name for name in os.listdir("runs/distance/quick"))
    md = (tmp_path / "out" / "distance.md").read_text()
    for part in ("## (B) Diversity", "## (C) Transfer"):
        assert md.split(part)[1].split("##")[0].count(f"{report.LEFT_OUT.capitalize()}: see how") == 1
    if importlib.util.find_spec("matplotlib"):  # the core requirements draw no figure
        assert (tmp_path / "out" / "distance.png").stat().st_size > 0
    # the default's plan says why, from its probe's cost per step
    probe = json.loads(open(os.path.join(os.path.dirname(__file__), os.pardir, "results",
                                         "distance-probe.json")).read())
    plan = report.plan(probe, exp.PRESETS["default"])
    assert "(B) and (C) are not in this preset: at this budget (A) alone takes the hour" in plan
    assert "they would add 24 models" in plan  # 12 of (B) at d_max 1 and 10, 12 mixed of (C); (C)'s alone are (A)'s


def test_the_committed_probe_still_plans_the_default():
    """The default reads results/distance-probe.json as how it was planned, and refuses it when --probe's preset
    has changed since. Bug caught: a setting added to the default (far) and so, by inheritance, to the probe,
    which made the committed command refuse to run."""
    root = os.path.join(os.path.dirname(__file__), os.pardir, "results")
    record = common.probe_on_record("distance", root, exp.PRESETS["probe"])
    assert record is not None and record["settings"]["budget"] == exp.PRESETS["probe"]["budget"]


def test_full_cost_scales_the_probes_measured_step_by_flops():
    """The results say what --full would cost here: its models, and the probe's measured CPU time per step times
    the FLOP ratio of a step at --full's sizes to one at the default's (8 x 512, window 256, batch 64 against
    4 x 64, window 32, batch 32: 2 x 8 x 2 x 64 = 2048). Bugs caught: the ratio inverted or from the wrong
    setup, the cost not the probe's own, the models counted from another preset."""
    probe = {"runtime": {"cpu_s": 100.0}, "steps_trained": 10_000}  # 0.01 CPU-s a step
    text = report.full_cost(probe, exp.PRESETS["default"])
    assert f"{len(list(exp.planned_models(exp.PRESETS['full'])))} models" in text and "210 models" in text
    assert "2,048x" in text and "about 228 CPU-hours a model" in text  # 0.01 x 2048 x 40,000 / 3600
    slower = report.full_cost({**probe, "runtime": {"cpu_s": 200.0}}, exp.PRESETS["default"])
    assert "about 455 CPU-hours a model" in slower


@pytest.mark.parametrize("preset", ["default", "probe", "full", "quick"])
def test_every_encoding_of_a_task_trains_the_same_budget(preset):
    """Issue 51: Paper D's comparisons are between models at the same stage of training. Every model the preset
    trains runs its task's whole budget (--no-fit-stop: the fit is judged at the end), the same number of
    steps for every encoding, size and band of a task, and (but the probe) logs its curve out of range at
    twice its band's top. Read from the planned commands; nothing is trained. Watched failing with a planted
    early-stopped cell (RoPE's models without --no-fit-stop) and with RoPE given another budget."""
    args = argparse.Namespace(quick=preset == "quick", probe=preset == "probe", full=preset == "full", device="cpu",
                              threads=1)
    setup, steps, encodings = exp.PRESETS[preset], {}, {}
    for argv in exp.cells(args)[0]:
        flags = train.build_parser().parse_args(argv)
        assert (flags.fit_bar, flags.fit_stop) == (stats.FIT_BAR, False), argv
        # out of range at twice the top of the model's own training band (at 4x, C sits at chance throughout)
        assert flags.fit_far == (None if preset == "probe" else 2 * max(flags.delays)), argv
        steps.setdefault(flags.task, set()).add(flags.steps)
        encodings.setdefault(flags.task, set()).add(flags.encoding)
    assert steps == {task: {setup["budget"][task]} for task in steps}
    assert encodings["delay_copy"] == set(exp.DISTANCE_ENCODINGS)


def budget_trained(data: dict) -> list[tuple[str, int, int]]:
    """(which result, steps a seed trained, its task's budget) of every counted model in a distance results
    json of the equal-budget design: (A) by task, (B) by encoding and d_max, (C) alone and mixed."""
    budget = data["settings"]["budget"]
    results = [(f"A {t} {e}", t, r) for t, by in data["A"].items() for e, r in by.items()]
    results += [(f"B {e} {m}", "delay_copy", r) for e, by in data["B"].items() for m, r in by.items()]
    results += [(f"C {s} {e} {k}", "delay_copy" if k == "alone" else "mixed_copy", r[k])
                for s, by in data["C"].items() for e, r in by.items() for k in ("alone", "mixed")]
    return [(name, steps, budget[task]) for name, task, r in results for steps in r["steps_trained"]]


def test_committed_results_trained_every_model_its_tasks_budget():
    """Issue 51, as results/distance.json records it: every model the committed default counted trained its
    task's whole budget, whatever its encoding (no model stopped at the bar). Watched failing with one RoPE
    seed's steps_trained set to 1600 in a copy of the json."""
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "distance.json")) as f:
        data = json.load(f)
    trained = budget_trained(data)
    assert len(trained) >= 3 * 3 * 2  # (A) alone: 3 encodings, 2 tasks, 3 seeds
    assert [t for t in trained if t[1] != t[2]] == []
