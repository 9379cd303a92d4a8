"""The ryarn experiment (Paper R on the small GPT): its quick run, its verdict rule, its replayable commands, and
the positions its training loop used."""
import importlib.util
import json
import pathlib
import shlex
import subprocess
import sys
import types

import pytest
import torch

import eval
import lengen
import train
from experiments import common, ryarn, ryarn_report, stats

QUICK = ryarn.PRESETS["quick"]


def quick(folder, *extra: str):
    """python eval.py --experiment ryarn --quick --threads 1 [extra] in `folder` (runs/ and results/ land there);
    returns results/ryarn.json."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        assert eval.main(["--experiment", "ryarn", "--quick", "--threads", "1", *extra]) == 0
    return json.loads((folder / "results" / "quick" / "ryarn.json").read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ryarn-quick")
    return folder, quick(folder)


def test_quick_experiment_writes_its_results(quick_run):
    """Bugs caught: a method, a base or a length missing from the tables; inference-time YaRN not applied
    (zero-shot and zero-shot+yarn identical); bases that are one model (the same accuracies); a pretrained
    model that learned nothing; a claim without a verdict; a learning rate chosen outside the grid."""
    tmp_path, data = quick_run
    L, bases, seeds = QUICK["L"], QUICK["bases"], QUICK["seeds"]
    assert data["lengths"] == [L, 2 * L, 4 * L, 8 * L, 16 * L]
    assert list(data["accuracy"]) == list(ryarn.MODELS)
    for method, runs in data["accuracy"].items():
        assert len(runs) == len(bases)
        assert all(len(r) == (1 if method.startswith("zero-shot") else len(seeds)) for r in runs)
        assert all(len(acc) == 5 and all(0 <= a <= 1 for a in acc) for r in runs for acc in r)
    assert data["accuracy"]["zero-shot"] != data["accuracy"]["zero-shot+yarn"]
    assert data["accuracy"]["zero-shot"][0] != data["accuracy"]["zero-shot"][1]  # independent bases
    assert data["accuracy"]["zero-shot"][0][0][0] > 0.3  # well above chance (1/8) at L, even at this size
    assert set(data["controls"]) == set(ryarn.CONTROLS)
    assert set(data["claims"]) == set(ryarn.CLAIMS)
    assert all(stats.short(c["verdict"]).split(" (")[0] in stats.LABELS for c in data["claims"].values())
    primary = [c for c in data["claims"].values() if c["primary"]]
    assert len(primary) == len(ryarn.PRIMARY) and all(set(c["by_rate"]) == {f"{lr:g}" for lr in QUICK["lrs"]}
                                                      for c in primary)
    assert {r["family"] for c in primary for r in c["by_rate"].values()} == {len(ryarn.PRIMARY) * len(QUICK["lrs"])}
    assert {c["family"] for c in primary} == {len(ryarn.PRIMARY)}  # the pooled estimates: a family of their own
    for c in primary:  # each base's pooled gain is its mean over the rates where it was measured
        at = [r["per_unit"] for r in c["by_rate"].values()]
        if all(len(g) == len(bases) for g in at) and at:
            assert c["per_unit"] == pytest.approx([sum(g[b] for g in at) / len(at) for b in range(len(bases))])
    assert {c["family"] for c in data["claims"].values() if not c["primary"]} == {len(ryarn.CLAIMS) - len(primary)}
    for method in ryarn.GRID_METHODS:  # every grid method at every rate on every base
        assert set(data["by_rate"][method]) == {f"{lr:g}" for lr in QUICK["lrs"]}
        assert all(len(per_base) == len(bases) for per_base in data["by_rate"][method].values())
    assert set(data["learning_rates"]["chosen"].values()) <= set(QUICK["lrs"])
    markdown = (tmp_path / "results" / "quick" / "ryarn.md").read_text()
    assert "python eval.py --experiment ryarn --quick --threads 1" in markdown and "Runtime" in markdown
    assert markdown.index("## The rule") < markdown.index("## Primary claims") < markdown.index("## Exploratory")
    assert markdown.index("## Exploratory") < markdown.index("test accuracy by length")
    docs = (pathlib.Path(__file__).parents[1] / "docs" / "randomized-yarn.md").read_text()
    assert "docs/randomized-yarn.md#how-this-design-was-chosen" in markdown and \
        "\n## How this design was chosen\n" in docs  # the design history is the docs page's, the results point to it
    if importlib.util.find_spec("matplotlib"):  # figures are optional: without matplotlib the run says so
        assert (tmp_path / "results" / "quick" / "ryarn.png").stat().st_size > 0


def test_claims_are_measured_per_base(quick_run):
    """Bugs caught: a gain taken over all runs pooled instead of per base; the zero-shot side not paired with
    every seed; a claim's interval from another claim; a primary claim compared across two rates instead of
    at one; the grid's rate not standing for its base."""
    data = quick_run[1]

    def want(accuracy, better, worse, measure, fitted):
        return [sum(measure(b) - measure(w) for b in bs for w in ws) / (len(bs) * len(ws))  # one seed here
                for base, (bs, ws) in enumerate(zip(accuracy[better], accuracy[worse]))
                if fitted[better][base] and fitted[worse][base]]
    fitted = ryarn.fitted_models(data, data["fit_bar"])
    for name, (_, better, worse, measure) in ryarn.CLAIMS.items():
        result = data["claims"][name]
        if result["primary"]:
            for lr, r in result["by_rate"].items():
                accuracy, validation = ryarn.at_rate(data, lr)
                at = ryarn.fitted_models({**data, "accuracy": accuracy}, data["fit_bar"], validation)
                assert r["per_unit"] == pytest.approx(want(accuracy, better, worse, measure, at))
                assert accuracy["ryarn"] == data["by_rate"]["ryarn"][lr]
        elif result["verdict"] != "undecided (models did not fit)":
            gains = want(data["accuracy"], better, worse, measure, fitted)
            assert result["per_unit"] == pytest.approx(gains)
            assert result["mean"] == pytest.approx(sum(gains) / len(gains))
    lr = f"{data['learning_rates']['chosen']['ryarn']:g}"
    assert data["accuracy"]["ryarn"] == data["by_rate"]["ryarn"][lr]  # the chosen rate's runs, on every base
    beyond_grid = data["learning_rates"]["grid"]["ryarn"][lr]["beyond"]
    assert common.spread([common.beyond(a[0]) for a in data["accuracy"]["ryarn"]])["mean"] == \
        pytest.approx(beyond_grid)


def test_verdict_rule_on_made_up_gains():
    """Bugs caught: a gain that holds on average while one base goes the other way called reproduced; z
    intervals (1.96 standard errors) for 3 bases, far too narrow; a failed reproduction from an interval that
    still allows the claim; a consistent loss not called reversed."""
    v = stats.unit_verdict([0.12, 0.10, -0.01], 0.05)  # positive on two bases, negative on the third
    assert v["mean"] >= 0.05 and v["verdict"] == "undecided, estimate +0.070"
    assert stats.unit_verdict([0.12, 0.10, 0.11], 0.05)["verdict"] == "reproduced"
    assert stats.unit_verdict([-0.10, -0.09, -0.11], 0.05)["verdict"] == "reversed"
    assert stats.unit_verdict([0.01, 0.00, 0.02], 0.05)["verdict"].startswith("no effect shown")
    assert stats.unit_verdict([0.04, -0.03, 0.08], 0.05)["verdict"].startswith("undecided")  # it straddles +0.05
    values = [0.10, 0.04, 0.07]
    mean, low, high = eval.t_interval(values)
    sd = common.spread(values)["sd"]
    assert high - mean == pytest.approx(4.303 * sd / 3 ** 0.5, rel=1e-3)  # t with 2 degrees of freedom
    assert high - mean > 2 * 1.96 * sd / 3 ** 0.5                         # more than twice the z half-width
    assert eval.t_critical(0.05, 30) == pytest.approx(2.042, abs=0.001)


def test_bases_that_did_not_fit_leave_every_claim_undecided():
    """Bug caught: a verdict (above all "not reproduced") resting on pretrained models that never learned the
    task at L, or on a fine-tune that lost it."""
    run = [[0.95, 0.1, 0.1, 0.1, 0.1]]
    acc = {m: [run] * 3 for m in ryarn.MODELS}

    def data(base_validation, validation=0.95, ryarn_validation=0.95):
        v = {m: [[ryarn_validation if m == "ryarn" else validation]] * 3 for m in ryarn.FINE_TUNES}
        return {"accuracy": acc, "base_validation": base_validation, "validation": v,
                "by_rate": {m: {"0.001": [run] * 3} for m in ryarn.GRID_METHODS},
                "by_rate_validation": {m: {"0.001": v[m]} for m in ryarn.GRID_METHODS}}
    unfit = ryarn.claims(data([0.95, 0.5, 0.5]), 0.9)
    assert {c["verdict"] for c in unfit.values() if not c["primary"]} == {"undecided (1 unit(s): 3 needed)"}
    assert {c["verdict"] for c in unfit.values() if c["primary"]} == {"undecided (1 unit(s): 3 needed)"}
    fitted = ryarn.claims(data([0.95] * 3), 0.9)
    assert {stats.short(c["verdict"]) for c in fitted.values() if not c["primary"]} == {"no effect shown"}
    assert ryarn.claims(data([0.5] * 3), 0.9)["ryarn > ft beyond L"]["verdict"] == stats.UNFIT
    lost = ryarn.claims(data([0.95] * 3, ryarn_validation=0.5), 0.9)  # the fine-tune under the bar at L
    assert lost["ryarn > ft beyond L"]["verdict"] == stats.UNFIT
    assert lost["ryarn > yarn beyond L"]["by_rate"]["0.001"]["verdict"] == stats.UNFIT


def test_every_model_replays_from_its_command(quick_run, tmp_path):
    """Bug caught: a recorded command that is not the one the experiment ran (a flag or the learning rate left
    out), so that retraining a model alone gives other weights."""
    folder, data = quick_run
    replayed = f"ryarn-b1-s{QUICK['seeds'][0]}-lr{QUICK['lrs'][-1]:g}"
    assert {"base-0", "base-1", replayed, f"ryarn-nocurr-b1-s{QUICK['seeds'][0]}"} <= set(data["commands"])
    cmd = data["commands"][replayed]
    argv = shlex.split(cmd)
    assert argv[:2] == ["python", "train.py"]
    out = argv[argv.index("--out") + 1]
    before = torch.load(folder / out / "checkpoint.pt", weights_only=False)["model"]
    argv[argv.index("--out") + 1] = str(tmp_path / "replay")
    root = str(pathlib.Path(train.__file__).parent)
    subprocess.run([sys.executable, f"{root}/train.py", *argv[2:]], cwd=folder, check=True)
    after = torch.load(tmp_path / "replay" / "checkpoint.pt", weights_only=False)["model"]
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_test_and_validation_sequences_come_from_unused_seeds(quick_run):
    """Bug caught: test sequences drawn from a stream a model trained on (train.py draws batches from seed + 1
    and positions from seed + 2)."""
    used = set()
    for cmd in quick_run[1]["commands"].values():
        argv = shlex.split(cmd)
        seed = int(argv[argv.index("--seed") + 1])
        used |= {seed, seed + 1, seed + 2}
    assert ryarn.TEST_SEED not in used and ryarn.VALIDATION_SEED not in used
    assert ryarn.TEST_SEED != ryarn.VALIDATION_SEED


def test_figure_draws_each_method_alike_in_every_panel(quick_run):
    """Bug caught: a method's colour taken from matplotlib's colour cycle, so that it changes from panel to
    panel with the methods beside it (ft green in one panel, orange in the next), or two methods of one panel
    drawn alike."""
    plt = eval.pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed")
    fig = ryarn_report.figure(quick_run[1])(plt)
    styles, panels = {}, []
    for ax in fig.axes:
        lines = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in ax.get_lines()
                 if not line.get_label().startswith("_")}
        assert len(set(lines.values())) == len(lines), lines
        for label, style in lines.items():
            assert styles.setdefault(label, style) == style, label
        panels.append(lines)
    plt.close(fig)
    assert sum("ft" in lines for lines in panels) >= 2  # the task's panel and the controls'


@pytest.mark.slow  # worker processes: a fresh Python and torch each
def test_jobs_2_writes_what_jobs_1_writes(quick_run, tmp_path):
    """Bug caught: a result that depends on where its run trained: two runs sharing a seed or a global
    random state (a worker's second run continuing the first one's stream), a fine-tune started before its
    pretrained model was written, or results assembled in the order the workers finish. Everything but the
    command and its runtime must be equal, to the last bit."""
    two = quick(tmp_path, "--jobs", "2")
    assert two["command"].endswith("--jobs 2") and two["runtime"]["jobs"] == 2

    def results(data):
        return {k: v for k, v in data.items() if k not in ("command", "runtime")}
    assert results(two) == results(quick_run[1])


def fed_positions(method, tmp_path, top=2):
    """The positions the training loop fed the model under the experiment's own command line for `method`."""
    args = types.SimpleNamespace(threads=1, device="cpu")
    base = str(tmp_path / "pretrain")
    train.run(ryarn.train_argv(ryarn.TASK, base, QUICK["L"], QUICK["layers"], 5, 0, args))
    fed = []
    train.run(ryarn.fine_tune_argv(ryarn.TASK, str(tmp_path / method), base, method, QUICK["finetune"], 0, 1e-3,
                                   QUICK, args, top),
              on_step=lambda step, x, positions: fed.append((step, x, positions)))
    assert [step for step, _, _ in fed] == list(range(QUICK["finetune"]))
    return fed


def test_ryarn_feeds_paper_r_stages(tmp_path):
    """Bugs caught: positions unsorted, repeated or beyond the range; a curriculum that does not follow Paper
    R's stages (1, 1.25, 1.5, 2, 2 x L in five equal parts), so the early steps see far positions too soon or
    the last stages never reach 2L."""
    L, steps = QUICK["L"], QUICK["finetune"]
    fed = fed_positions("ryarn", tmp_path)
    stage_top = [L, 1.25 * L, 1.5 * L, 2 * L, 2 * L]
    for step, x, positions in fed:
        assert positions.shape == x.shape
        assert torch.all(positions[:, 1:] > positions[:, :-1]) and positions.min() >= 0  # sorted, distinct
        assert positions.max() < stage_top[min(5 * step // steps, 4)]
    last = [int(p.max()) for step, _, p in fed if 5 * step // steps >= 3]
    assert max(last) >= 1.5 * L  # the last two fifths hold the top of the range, and use it


def test_no_curriculum_draws_from_the_whole_range_at_once(tmp_path):
    """Bug caught: the -nocurr ablation still widening (it would then be the curriculum it is compared with)."""
    L = QUICK["L"]
    fed = fed_positions("ryarn-nocurr", tmp_path)
    assert all(p.max() < 2 * L for _, _, p in fed)
    assert max(int(p.max()) for step, _, p in fed if step < QUICK["finetune"] // 5) >= 1.5 * L


def test_method_flags_match_paper_r():
    """Bugs caught: rpe quietly using YaRN, yarn quietly randomizing, a sweep range that is not applied."""
    L, s = 32, 16
    assert "--scaling" not in ryarn.method_flags("rpe", L, s) and "--positions" not in ryarn.method_flags("yarn", L, s)
    assert ryarn.method_flags("ryarn", L, s, top=8)[-1] == f"{L}:{8 * L}:paper-r"
    assert lengen.LengthCurriculum(L, 2 * L, 10, "paper-r")(0) == L


def test_claims_on_models_that_did_not_fit_are_undecided_and_several_comparisons_need_each():
    """The shared rule's fourth outcome and its combination (stats.verdict, unit_verdict, all_of). Bugs caught:
    a claim on unfitted models given the numbers' verdict, one failed comparison of several not failing the
    claim, an open comparison read as a failure, nothing measured read as undecided on fitted models."""
    assert stats.verdict(True, True, fitted=False) == stats.UNFIT == "undecided (models did not fit)"
    assert stats.unit_verdict([0.12, 0.10, 0.02], 0.05, fitted=False)["verdict"] == stats.UNFIT
    assert stats.unit_verdict([], 0.05)["verdict"] == stats.UNFIT
    assert stats.unit_verdict([0.30], 0.05)["verdict"].startswith("undecided")  # one unit: no interval
    assert stats.all_of(["reproduced", "reproduced"]) == "reproduced"
    assert stats.all_of(["reproduced", "reversed"]) == "partly reproduced"
    assert stats.all_of(["reproduced", "no effect shown, estimate +0.010"]) == "partly reproduced"
    assert stats.all_of(["reproduced", "positive, below the claimed size"]) == "partly reproduced"
    assert stats.all_of(["undecided", "not reproduced", stats.UNFIT]) == "not reproduced"
    assert stats.all_of(["reproduced", "undecided, estimate +0.1"]) == "undecided"
    assert stats.all_of(["reproduced", "positive, claimed size not excluded"]) == "undecided"
    assert stats.all_of(["reproduced", stats.UNFIT]) == "undecided"
    assert stats.all_of([stats.UNFIT, stats.UNFIT]) == stats.UNFIT
    assert stats.all_of([]) == "undecided"


def test_each_rate_is_chosen_on_validation_sequences_never_on_the_test_set():
    """#35 (tests that catch): choose() reads each fine-tune's validation accuracy at L (VALIDATION_SEED), the
    mean over bases and seeds, ties to the smaller rate; the test set (here best at the other rate) chooses
    nothing. Bug caught: a rate chosen on test accuracy beyond L, or on one base."""
    setup = {"lrs": (1e-4, 1e-3), "bases": (0, 1), "seeds": (10,)}
    validation = {1e-4: (0.95, 0.85), 1e-3: (0.90, 0.89)}  # means 0.90 and 0.895: 1e-4 best, base 0 alone agrees
    grid = {(m, lr, b, 10): [{"validation": validation[lr][b] if m != "yarn" else 0.9,
                              "test": [0.9] + [0.1 if lr == 1e-4 else 0.8] * 4}]
            for m in ryarn.GRID_METHODS for lr in setup["lrs"] for b in setup["bases"]}
    grid |= {("ft", lr, 1, 10): [{"validation": v, "test": [0.5] * 5}] for lr, v in ((1e-4, 0.80), (1e-3, 0.99))}
    chosen = ryarn.choose(grid, setup)
    assert chosen["ryarn"] == chosen["rpe"] == 1e-4      # validation's choice, though beyond L prefers 1e-3
    assert chosen["ft"] == 1e-3                           # the mean over bases (base 0 alone says 1e-4)
    assert chosen["yarn"] == 1e-4                         # a tie goes to the smaller rate
    assert chosen["ryarn-nocurr"] == chosen["ryarn"] and chosen["rpe-nocurr"] == chosen["rpe"]
