"""The encodings experiment (its study, experiments/encodings.py, and its report, experiments/encodings_report.py):
its quick run, the verdicts it derives, and the NoPE shortcut it takes."""
import importlib.util
import json
import os

import pytest
import torch

import eval
import runs
import train
from experiments import common, stats
from experiments import encodings as exp
from experiments import encodings_report as report

QUICK = exp.PRESETS["quick"]


def test_quick_experiment_writes_its_results(tmp_path, monkeypatch):
    """Bugs caught: a variant or task missing from the tables, accuracies not one per seed and length, NoPE
    shown twice, verdicts that do not follow from the numbers written beside them."""
    monkeypatch.chdir(tmp_path)  # runs/ and results/ land in the temporary directory
    assert eval.main(["--experiment", "encodings", "--quick", "--threads", "1"]) == 0
    data = json.loads((tmp_path / "results" / "quick" / "encodings.json").read_text())
    labels = [exp.label(e, p) for e, p in exp.variants(QUICK)]
    assert len(labels) == 2 * len(exp.ENCODINGS) - 1 and "nope + rand" not in labels and "fire + rand" in labels
    assert list(data["accuracy"]) == list(QUICK["tasks"])
    for by_variant in data["accuracy"].values():
        assert list(by_variant) == labels
        for per_seed in by_variant.values():
            assert len(per_seed) == len(QUICK["seeds"]) and all(len(acc) == len(exp.MULTIPLES) for acc in per_seed)
            assert all(0 <= a <= 1 for acc in per_seed for a in acc)
    claims, caption = exp.claims(data["accuracy"], data["steps_to_fit"], QUICK["tasks"])
    assert data["claims"] == json.loads(json.dumps(claims)) and data["caption"] == caption
    for t in QUICK["tasks"]:  # issue 51: every model trained its task's budget; the json holds its fit.json's end
        budget = QUICK["budget"][t]
        for e, p in exp.variants(QUICK):
            row = exp.label(e, p)
            for i, seed in enumerate(QUICK["seeds"]):
                fit = runs.read_fit(str(tmp_path / "runs" / "encodings" / "quick" / t / f"{e}-{p}-s{seed}"))
                assert data["steps_to_fit"][t][row][i] == fit["steps_to_fit"] in (None, budget)
                assert (data["steps"][t][row][i], data["fit_at_end"][t][row][i]) == tuple(fit["checks"][-1])
                assert fit["checks"][-1][0] == budget and fit["far"]["at"] == data["curve_at"] == 8 * QUICK["L"]
                assert data["curves"][t][row][i] == {"steps": [s for s, _ in fit["checks"]],
                                                     "in_range": [a for _, a in fit["checks"]],
                                                     "out_of_range": [a for _, a in fit["far"]["checks"]]}
    assert len(data["commands"]) == data["models"] and all(" --fit-bar 0.9 " in c for c in data["commands"])
    assert data["models"] == len(labels) * len(QUICK["tasks"]) * len(QUICK["seeds"])
    markdown = (tmp_path / "results" / "quick" / "encodings.md").read_text()
    assert "python eval.py --experiment encodings --quick --threads 1" in markdown
    assert all(claim in markdown for claim in exp.PAPER)
    assert data["alibi_slope_heads"] == 8 and "ALiBi takes the paper's 8-head slopes" in markdown
    assert report.markdown(data) == markdown  # the report reads everything from the data (nothing from args)
    assert "## Over training (mean over seeds: accuracy at L at the end; at 96 tokens" in markdown
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "results" / "quick" / "encodings.png").stat().st_size > 0


def synthetic(beyond_of, fits=lambda row, task: True):
    """A made-up grid over copy and reverse, three seeds: variant v scores beyond_of(v, seed) beyond L (1.0 at
    L) on every task, and fitted (at step 500) where fits(v, task)."""
    tasks_ = ("copy", "reverse")
    accuracy = {t: {exp.label(e, p): [[1.0] + [beyond_of(exp.label(e, p), seed)] * 3 for seed in (0, 1, 2)]
                    for e, p in exp.variants(QUICK)} for t in tasks_}
    steps = {t: {row: [500 if fits(row, t) else None] * 3 for row in accuracy[t]} for t in tasks_}
    return accuracy, steps, list(tasks_)


def test_verdicts_follow_the_numbers():
    """Bugs caught: a ranking read upside down, a gain counted when one seed loses, one failed comparison not
    failing the claim, a gain written without its sign or its interval. Made-up grids where the verdict is known."""
    grid = synthetic(lambda v, seed: {"nope": 0.9, "fire": 0.35, "t5": 0.8, "xpos": 0.3}.get(v.split(" ")[0], 0.4)
                     + (0.1 if v.endswith("+ rand") else 0.0) + 0.01 * seed)
    claims, caption = exp.claims(*grid)
    assert "One family of 12 comparison(s)" in caption
    assert claims["randomized positions help"]["verdict"] == "reproduced"
    assert claims["randomized positions help"]["measured"].startswith(
        "over every fitted (encoding, task) pair: +0.100 [+0.100, +0.100] (16 of 16 pairs), at L itself +0.000")
    assert claims["NoPE generalizes best"]["verdict"] == "reproduced"
    assert claims["FIRE generalizes best"]["verdict"] == "not reproduced"  # it loses every comparison
    assert claims["xPos beats RoPE"]["verdict"] == "reversed"  # 0.3 against 0.4 on every seed
    accuracy, steps, tasks_ = grid
    for t in tasks_:
        accuracy[t]["fire"] = [[1.0] + [0.5 + 0.01 * seed] * 3 for seed in (0, 1, 2)]  # beats rope, not t5
    claims = exp.claims(accuracy, steps, tasks_)[0]
    assert claims["FIRE generalizes best"]["comparisons"]["rope"] == "reproduced"
    assert claims["FIRE generalizes best"]["verdict"] == "partly reproduced"
    mixed = synthetic(lambda v, seed: 0.5 + (0.1 if v == "rope + rand" else 0.2 * (seed - 0.5) if "+ rand" in v
                                             else 0.0))
    assert exp.claims(*mixed)[0]["randomized positions help"]["verdict"].startswith("undecided, estimate +")
    two_seeds = synthetic(lambda v, seed: 0.5 + (0.2 if v.endswith("+ rand") else 0.0))
    for t in two_seeds[2]:
        for row in two_seeds[0][t]:
            two_seeds[0][t][row], two_seeds[1][t][row] = two_seeds[0][t][row][:2], two_seeds[1][t][row][:2]
    assert exp.claims(*two_seeds)[0]["randomized positions help"]["verdict"].startswith("undecided (2 unit(s)")


def test_the_fit_gate_decides_what_a_claim_can_say():
    """The issue's two grids. Randomized models that did not fit: undecided (models did not fit), though they
    lose beyond L. The same models fitted and losing by a hair on every seed: reversed. Bugs
    caught: the gate ignored (then "not reproduced" rests on models that never learned the task), or applied to the
    wrong cells (then the fitted grid is undecided too)."""
    def worse(v, seed):
        return 0.5 - (0.01 + 0.001 * seed if v.endswith("+ rand") else 0.0)

    unfit = exp.claims(*synthetic(worse, fits=lambda row, task: not row.endswith("+ rand")))[0]
    assert unfit["randomized positions help"]["verdict"] == stats.UNFIT
    assert unfit["randomized positions help"]["measured"].startswith("over every fitted (encoding, task) pair: "
                                                                    "not fitted")
    assert unfit["NoPE generalizes best"]["verdict"] != stats.UNFIT  # contiguous cells fitted: still measured
    fitted = exp.claims(*synthetic(worse))[0]
    assert fitted["randomized positions help"]["verdict"] == "reversed"  # a hair, but below 0 on every seed
    one_task = exp.claims(*synthetic(worse, fits=lambda row, task: task == "copy" or "+ rand" not in row))[0]
    assert one_task["randomized positions help"]["tasks"] == ["copy"] * 8  # one (encoding, task) pair each
    one_seed = synthetic(worse)
    for t in one_seed[2]:
        one_seed[1][t]["rope + rand"] = [500, None, 500]  # a cell counts only when every seed fitted
    assert "; rope not fitted; " in exp.claims(*one_seed)[0]["randomized positions help"]["measured"]


def test_nope_with_randomized_positions_is_the_same_run(tmp_path):
    """The experiment trains NoPE once, on the grounds that position ids drawn from their own generator
    change nothing else. Bug caught: a position sampler sharing the data generator (then the runs differ)."""
    weights = []
    for positions in exp.POSITIONS:
        out = str(tmp_path / positions)
        train.run(["--task", "copy", "--encoding", "nope", "--positions", positions, "--train-len", "6:12",
                   "--steps", "15", "--out", out, "--eval-samples", "0", "--quiet", "--threads", "1"])
        weights.append(eval.load_run(out, "cpu")[0].state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_gain_is_averaged_over_the_tasks_where_both_cells_fitted():
    """#35 (tests that catch): a comparison A - B reads only the tasks where A's cell and B's cell both fitted
    (every seed of each). Bug caught: a task kept where only A fitted, so that B's unfitted model counts."""
    acc = {"copy": {"a": [[1, 0.9, 0.9], [1, 0.7, 0.7]], "b": [[1, 0.5, 0.5], [1, 0.5, 0.5]]},
           "shift": {"a": [[1, 0.9, 0.9], [1, 0.9, 0.9]], "b": [[1, 0.0, 0.0], [1, 0.0, 0.0]]}}
    steps = {"copy": {"a": [100, 200], "b": [300, 400]}, "shift": {"a": [100, 100], "b": [None, 500]}}
    g = exp.gain(acc, steps, [("copy", "a", "b"), ("shift", "a", "b")])
    assert g["tasks"] == ["copy"] and g["of"] == 2
    assert g["per_unit"] == [0.9 - 0.5, 0.7 - 0.5]  # seed by seed, shift left out


def test_a_randomized_model_is_measured_at_its_own_positions(tmp_path, monkeypatch):
    """Ruoss et al.'s protocol: a model trained at randomized ids is evaluated at ids drawn the same way, from the
    range it trained with. Bug caught: its accuracy measured at contiguous ids (gaps it never saw, even at L)."""
    calls = []
    monkeypatch.setattr(exp, "evaluate", lambda *a, **k: calls.append(k) or {"accuracy": 0.5})
    monkeypatch.setattr(exp, "train_once", lambda argv: {**train.run(argv + ["--steps", "2"]), "cpu_s": 0.1})
    monkeypatch.setattr(exp, "read_fit", lambda out: {"steps_to_fit": None, "checks": [[2, 0.1]],
                                                      "far": {"at": 96, "checks": [[2, 0.0]]}})
    exp.train_and_measure(("reverse", "rope", "randomized", 0, QUICK, str(tmp_path), "cpu"))
    assert {(k["positions"], k["max_position"]) for k in calls} == {("randomized", 8 * QUICK["L"])}
    # beyond L, only the answers no training sequence reached: at index >= L (at L itself, every answer)
    assert [k["score_from"] for k in calls] == [0] + [QUICK["L"]] * (len(exp.MULTIPLES) - 1)


def test_probe_records_each_cells_fit_and_measures_nothing_beyond_L(tmp_path, monkeypatch):
    """--probe plans the grid from what each cell costs to fit. Bugs caught: a cell missing, a fit read from
    another run's folder, the task's settings or ALiBi's slopes not those the grid trains with, or a model
    measured beyond L (a probe that saw how cells extrapolate would let the plan choose by the results)."""
    monkeypatch.chdir(tmp_path)
    probe = dict(L=16, layers=2, budget=exp.budget(20), every=10, seeds=(0,), tasks=("latest_recall",))
    monkeypatch.setitem(exp.PRESETS, "probe", probe)
    monkeypatch.setattr(exp, "evaluate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    assert eval.main(["--experiment", "encodings", "--probe", "--threads", "1", "--out-dir", "out"]) == 0
    data = json.loads((tmp_path / "out" / "encodings-probe.json").read_text())
    labels = [exp.label(e, p) for e, p in exp.variants(QUICK)]
    assert list(data["fits"]) == ["latest_recall"] and list(data["fits"]["latest_recall"]) == labels
    for (e, p), label in zip(exp.variants(QUICK), labels):
        fit = runs.read_fit(str(tmp_path / "runs" / "encodings" / "probe" / "latest_recall" / f"{e}-{p}-s0"))
        recorded = data["fits"]["latest_recall"][label]
        assert {k: recorded[k] for k in ("steps_to_fit", "last")} == {"steps_to_fit": fit["steps_to_fit"],
                                                                      "last": fit["checks"][-1]}
        assert fit["checks"][-1][0] == 20 and recorded["cpu_s"] > 0 and recorded["checks"] == fit["checks"]
    assert all("--statements 3" in c and "--layers 2" in c for c in data["commands"])
    assert sum("--alibi-slope-heads 8" in c for c in data["commands"]) == 2  # alibi, alibi + rand
    assert data["steps_trained"] == sum(f["last"][0] for f in data["fits"]["latest_recall"].values())
    markdown = (tmp_path / "out" / "encodings-probe.md").read_text()
    assert "python eval.py --experiment encodings --probe --threads 1 --out-dir out" in markdown
    assert all(f"| {label} | " in markdown for label in labels)
    assert report.markdown(data) == markdown and report.figure(data) is None  # a probe's data, told by its "fits"
    assert not (tmp_path / "out" / "encodings.json").exists()  # a probe never replaces the grid's results
    # issue 53, item 10: run again, every model is reused; the cost per step it plans with is still its models'
    # own (each model's training time, kept in its made-by.json), not this invocation's ~0 CPU-s over their steps
    assert eval.main(["--experiment", "encodings", "--probe", "--threads", "1", "--out-dir", "out"]) == 0
    again = json.loads((tmp_path / "out" / "encodings-probe.json").read_text())
    assert again["runtime"]["cpu_s"] < data["runtime"]["cpu_s"] / 3  # nothing trained this time
    assert common.cpu_per_step(again) == common.cpu_per_step(data) > 0


def test_the_default_grid_shows_the_probe_that_planned_it(tmp_path, monkeypatch, capsys):
    """results/encodings.md says how its design was chosen from the probe's own file. Bugs caught: the probe
    read from another folder than the results', its table not rendered, a grid run without a probe on
    record failing instead of saying it was designed before the probe, or a grid planned from a probe measured
    with other settings than --probe's now (a deeper model, say) instead of one line and exit status 2."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(exp.PRESETS, "probe",
                        dict(L=16, layers=2, budget=exp.budget(20), every=10, seeds=(0,), tasks=("latest_recall",)))
    monkeypatch.setitem(exp.PRESETS, "default", {**QUICK, "tasks": ("latest_recall",), "L": 16})
    assert eval.main(["--experiment", "encodings", "--probe", "--threads", "1", "--out-dir", "out"]) == 0
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "out"]) == 0
    probe = json.loads((tmp_path / "out" / "encodings-probe.json").read_text())
    data = json.loads((tmp_path / "out" / "encodings.json").read_text())
    assert data["probe"] == {k: v for k, v in probe.items() if k != "commands"}
    markdown = (tmp_path / "out" / "encodings.md").read_text()
    assert "**How this design was chosen**" in markdown and probe["command"] in markdown
    fits = probe["fits"]["latest_recall"]
    assert all(f"| {label} | {common.probe_cell(fit)} |" in markdown for label, fit in fits.items())
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "other"]) == 0
    assert "**How this design was chosen**: no probe on record" in (tmp_path / "other" / "encodings.md").read_text()
    # issue 53, item 10: the same command again reuses every model; what their training took is still said
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "again"]) == 0
    other, again = (json.loads((tmp_path / d / "encodings.json").read_text()) for d in ("other", "again"))
    assert again["training_cpu_s"] == other["training_cpu_s"] > 0
    markdown = (tmp_path / "again" / "encodings.md").read_text()
    assert f"own training took {other['training_cpu_s'] / 60:.1f} CPU-min" in markdown
    before = (tmp_path / "out" / "encodings.json").read_bytes()
    monkeypatch.setitem(exp.PRESETS, "probe", {**exp.PRESETS["probe"], "layers": 4})
    capsys.readouterr()
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "out", "--force"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "other settings than --probe's now (layers)" in error, error
    assert (tmp_path / "out" / "encodings.json").read_bytes() == before  # nothing written is lost


def test_a_grid_with_fewer_randomized_variants_compares_only_those():
    """setup["randomized"] names the encodings trained with randomized ids as well. Bugs caught: NoPE counted as
    randomized (its label is the same either way), or a claim reaching for a variant that was not trained."""
    chosen = exp.variants({"randomized": ("rope",)})
    assert sorted(chosen) == sorted([(e, "contiguous") for e in exp.ENCODINGS] + [("rope", "randomized")])
    accuracy, steps, tasks_ = synthetic(lambda row, seed: 0.9 if row == "rope + rand" else 0.5)
    keep = {"nope", "rope", "rope + rand", *exp.KAZEMNEJAD, *exp.FIRE_FIELD, "xpos"}
    accuracy = {t: {row: v for row, v in by.items() if row in keep} for t, by in accuracy.items()}
    steps = {t: {row: v for row, v in by.items() if row in keep} for t, by in steps.items()}
    result, _ = exp.claims(accuracy, steps, tasks_)
    pooled = result["randomized positions help"]
    assert pooled["per_unit"] == pytest.approx([0.4] * 3) and pooled["of"] == len(tasks_)


def test_a_grid_without_randomized_ids_leaves_their_claim_out_of_its_family():
    """The default since issue 51 trains contiguous ids only (setup["randomized"] empty): "randomized positions
    help" is not in this preset, neither decided nor counted in the family (11 comparisons, not 12), and how the
    grid was chosen says what its cells would add, planned from the same probe. Bugs caught: the claim read as
    undecided (models did not fit), as if its models had failed; the family still adjusted for it; the cost of
    the cells left out counted at the wrong budget or seeds."""
    setup = {**exp.PRESETS["default"], "tasks": ("copy", "reverse"), "budget": exp.budget(6000)}
    assert exp.variants(setup) == [(e, "contiguous") for e in exp.ENCODINGS]
    accuracy, steps, tasks_ = synthetic(lambda v, seed: {"nope": 0.9, "xpos": 0.3}.get(v, 0.4) + 0.01 * seed)
    keep = set(exp.rows(setup))
    accuracy = {t: {row: v for row, v in by.items() if row in keep} for t, by in accuracy.items()}
    steps = {t: {row: v for row, v in by.items() if row in keep} for t, by in steps.items()}
    claims, caption = exp.claims(accuracy, steps, tasks_)
    assert claims["randomized positions help"]["verdict"] == stats.LEFT_OUT
    assert claims["randomized positions help"]["tasks"] == []
    assert "One family of 11 comparison(s)" in caption and claims["xPos beats RoPE"]["family"] == 11
    assert claims["xPos beats RoPE"]["verdict"] == "reversed" and claims["NoPE generalizes best"]["verdict"] == \
        "reproduced"
    fit = {exp.label(e, p): {"steps_to_fit": 500 if (e, p) != ("sinusoidal", "contiguous") else None,
                             "last": [12000, 0.95]} for e, p in exp.variants(exp.PRESETS["full"])}
    probe = {"fits": {"copy": fit, "reverse": fit}, "runtime": {"cpu_s": 100.0}, "steps_trained": 1000}
    assert [p for _, _, p in exp.planned(setup, probe)] == ["contiguous"] * 16  # 8 of 9 a task: sinusoidal unfit
    text = report.randomized_left_out(probe, setup)
    # the 8 randomized cells but sinusoidal + rand (its partner unfit), 2 tasks, 3 seeds, 6000 steps, 0.1 s a step
    assert "would add 14 cells, 42 models, about 420 CPU-min" in text, text
    assert "| randomized positions help | none | not in this preset |" in report.summary({"claims": claims})
    assert report.randomized_left_out(probe, exp.PRESETS["full"]) == ""
    recorded = json.loads(open(os.path.join(os.path.dirname(__file__), "..", "results", "encodings.json")).read())
    if not recorded["settings"].get("randomized", True):  # its models' ids are contiguous (the probe's table has both)
        page = report.markdown(recorded)
        assert "Position ids are contiguous." in page and "'+ rand' (Ruoss" not in page


def test_the_default_trains_only_the_cells_its_probe_saw_fit(tmp_path, monkeypatch, capsys):
    """planned(): with a probe on record, the default spends no seed on a cell whose probe model did not fit, or
    whose every partner in the claims table did not, shows it as not run, and says why. Bugs caught: the plan
    ignoring the probe (every cell trained), reading the probe's fits the wrong way round (only the unfit cells
    trained), training a cell no comparison can read, a cell not run counted as fitted, or a claim resting on
    one."""
    monkeypatch.chdir(tmp_path)
    setup = {**QUICK, "tasks": ("reverse",), "seeds": (0, 1)}
    monkeypatch.setitem(exp.PRESETS, "default", setup)
    monkeypatch.setitem(exp.PRESETS, "probe", {**setup, "budget": exp.budget(20)})  # the probe on record is --probe's now
    fitted = {"rope", "rope + rand", "learned + rand"}  # learned + rand's one comparison is with learned: unfit
    fit = {row: {"steps_to_fit": 10 if row in fitted else None,
                 "last": [10, 0.95] if row in fitted else [20, 0.4]} for row in exp.rows(setup)}
    fits = {"reverse": fit, "shift": fit}  # shift: probed, not planned
    probe = {"command": "python eval.py --experiment encodings --probe", "settings": exp.PRESETS["probe"],
             "runtime": {"wall_s": 6.0, "cpu_s": 6.0, "jobs": 1, "threads": 1}, "fits": fits, "models": len(fits),
             "steps_trained": 300, "fit_bar": stats.FIT_BAR, "task_options": exp.TASK_OPTIONS, "commands": []}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "encodings-probe.json").write_text(json.dumps(probe))
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "out"]) == 0
    assert "2 cells planned from the probe, 4 models; the probe predicts 0 CPU-min" in capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "encodings.json").read_text())
    assert data["models"] == 2 * len(setup["seeds"]) and len(data["commands"]) == data["models"]
    assert all(" --encoding rope " in c for c in data["commands"])
    for row, per_seed in data["accuracy"]["reverse"].items():
        assert len(per_seed) == (len(setup["seeds"]) if row in {"rope", "rope + rand"} else 0), row
        assert not exp.cell_fitted(data["steps_to_fit"], "reverse", row) or row in fitted
    markdown = (tmp_path / "out" / "encodings.md").read_text()
    assert "| nope | not run |" in markdown and "reverse: nope, learned, sinusoidal" in markdown
    assert "every cell they would be compared with did not fit: reverse: learned + rand." in markdown
    # the cost the probe predicted: 2 cells x 10 steps to fit x 2 seeds, at its 6 CPU-s per 300 steps
    assert "2 cells, 4 models, predicted at" in markdown
    assert "every task the probe measured at 5 seeds would be 4 cells, 0 CPU-min." in markdown
    assert exp.predicted_cpu_s(probe, [("reverse", "rope"), ("reverse", "rope + rand")], 2) == pytest.approx(0.8)
    # issue 51: every model trains its task's budget, so the plan costs 2 cells x 20 steps x 2 seeds
    assert exp.predicted_cpu_s(probe, [("reverse", "rope"), ("reverse", "rope + rand")], 2, exp.budget(20)) == \
        pytest.approx(1.6)
    assert data["claims"]["xPos beats RoPE"]["verdict"] == stats.UNFIT  # xPos was not run


def damage(probe: dict, kind: str) -> str:
    """A probe's record (test_the_default_trains_only_the_cells_its_probe_saw_fit's) as a file, damaged."""
    probe = json.loads(json.dumps(probe))
    if kind == "cut short":
        return json.dumps(probe)[:200]
    if kind == "a list":
        return "[1, 2]"
    if kind == "no settings":
        del probe["settings"]
    if kind == "NaN steps to fit":
        probe["fits"]["reverse"]["rope"]["steps_to_fit"] = float("nan")
    if kind == "another fit bar":
        probe["fit_bar"] = 0.8
    if kind == "other task options":
        probe["task_options"] = {"latest_recall": {"statements": 2}}
    if kind == "a task missing":
        del probe["fits"]["reverse"]
    return json.dumps(probe)


@pytest.mark.parametrize("kind, message", [
    ("cut short", "is not a readable probe record (cut short?)"),
    ("a list", "is damaged (not a probe's record)"),
    ("no settings", "is damaged (no 'settings')"),
    ("NaN steps to fit", "is damaged (the fit of reverse, rope)"),
    ("another fit bar", "other settings than --probe's now (fit_bar)"),
    ("other task options", "other settings than --probe's now (task_options)"),
    ("a task missing", "the probe on record has no nope model for reverse"),
])
def test_a_probe_record_that_cannot_plan_the_default_is_refused(tmp_path, monkeypatch, capsys, kind, message):
    """Issue 53, items 11 and 18-23: a probe's record is checked before the default plans from it. Bugs caught:
    a record cut short taken as no probe (the default trained every cell without a word), a damaged one a
    traceback, NaN steps to fit counted as fitted, a probe measured at another fit bar or with other task
    options accepted, and (planted: the plan's old `t not in fits or fitted(...)`) a task the probe lacks
    planned as if every cell of it fitted."""
    monkeypatch.chdir(tmp_path)
    setup = {**QUICK, "tasks": ("reverse",), "seeds": (0, 1)}
    monkeypatch.setitem(exp.PRESETS, "default", setup)
    monkeypatch.setitem(exp.PRESETS, "probe", {**setup, "budget": exp.budget(20)})
    fit = {row: {"steps_to_fit": 10, "last": [10, 0.95]} for row in exp.rows(setup)}
    probe = {"command": "python eval.py --experiment encodings --probe", "settings": exp.PRESETS["probe"],
             "runtime": {"wall_s": 6.0, "cpu_s": 6.0, "jobs": 1, "threads": 1}, "fits": {"reverse": fit},
             "models": len(fit), "steps_trained": 300, "fit_bar": stats.FIT_BAR, "task_options": exp.TASK_OPTIONS}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "encodings-probe.json").write_text(damage(probe, kind))
    monkeypatch.setattr(exp, "train_once", lambda argv: (_ for _ in ()).throw(AssertionError("trained")))
    capsys.readouterr()
    assert eval.main(["--experiment", "encodings", "--threads", "1", "--out-dir", "out"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and message in error, error
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["encodings-probe.json"]


@pytest.mark.parametrize("damage", ["missing", "garbled", "not a fit record"])
def test_a_reused_probe_model_without_a_readable_fit_record_is_trained_again(tmp_path, damage):
    """Issue 53, item 26: a probe's model whose made-by.json says it can be reused, but whose fit.json is gone
    or garbled, was refused with "was it trained with --fit-bar?" (it was), or a KeyError traceback; train_once
    now reuses a --fit-bar run only with its fit record, and trains it again otherwise."""
    from test_cli import TINY
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "20", "--fit-bar", "0.99", "--fit-every", "10", "--eval-samples", "0",
            "--out", str(out), "--force"]
    first = common.fit_of(argv)
    if damage == "missing":
        (out / "fit.json").unlink()
    else:
        (out / "fit.json").write_text('{"bar": 0.9, "che' if damage == "garbled" else "{}")
    assert common.fit_of(argv) == {**first, "cpu_s": common.fit_of(argv)["cpu_s"]}
    assert runs.read_fit(str(out))["checks"][-1] == first["last"]


@pytest.mark.parametrize("preset", ["default", "probe", "full", "quick"])
def test_every_encoding_of_a_task_trains_the_same_budget(preset):
    """Issue 51: a claim compares encodings at the same stage of training. Every cell the preset can plan (all of
    them: planned() without a probe) trains its task's whole budget (--no-fit-stop: the fit is judged at the
    end), the same number of steps for every encoding and positions, and (but the probe, which measures nothing
    beyond L) logs its curve at 8L. Read from the commands; nothing is trained. Watched failing with a planted
    early-stopped cell (FIRE's models without --no-fit-stop) and with FIRE given another budget."""
    setup, steps, labels = exp.PRESETS[preset], {}, {}
    for t, e, p in exp.planned(setup, None):
        argv = exp.model_argv(t, e, p, 0, setup, "runs", "cpu", far=preset != "probe")
        flags = train.build_parser().parse_args(argv)
        assert (flags.fit_bar, flags.fit_stop) == (stats.FIT_BAR, False), argv
        assert flags.fit_far == (None if preset == "probe" else 8 * setup["L"]), argv
        steps.setdefault(t, set()).add(flags.steps)
        labels.setdefault(t, set()).add(exp.label(e, p))
    assert steps == {t: {setup["budget"][t]} for t in setup["tasks"]}
    assert labels == {t: set(exp.rows(setup)) for t in setup["tasks"]}


def off_budget(data: dict) -> list[tuple[str, str, int]]:
    """(task, row, steps) of every model in an encodings results json of the equal-budget design that did not
    train its task's whole budget."""
    budget = data["settings"]["budget"]
    return [(t, row, s) for t, by_row in data["steps"].items() for row, per_seed in by_row.items() for s in per_seed
            if s != budget[t]]


def test_committed_results_trained_every_model_its_tasks_budget():
    """Issue 51, as results/encodings.json records it: every model the committed default trained ran its task's
    whole budget, whatever its encoding or positions. Watched failing with one FIRE seed's steps set to 1200
    in a copy of the json."""
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "encodings.json")) as f:
        data = json.load(f)
    assert sum(len(per_seed) for by_row in data["steps"].values() for per_seed in by_row.values()) == data["models"]
    assert off_budget(data) == []


def test_the_committed_probe_still_plans_the_default():
    """The default reads results/encodings-probe.json as how it was planned, and refuses it when --probe's preset
    or the task options have changed since (the committed command would then stop with exit 2)."""
    root = os.path.join(os.path.dirname(__file__), os.pardir, "results")
    record = common.probe_on_record("encodings", root, exp.PRESETS["probe"], task_options=exp.TASK_OPTIONS)
    assert record is not None and record["settings"]["budget"] == exp.PRESETS["probe"]["budget"]
