"""The ryarn experiment (Paper R on the small GPT): its quick run, and the positions its training loop used."""
import importlib.util
import json
import types

import pytest
import torch

import eval
import lengen
import train
from experiments import ryarn

QUICK = ryarn.SCALES["quick"]


def quick(folder, *extra: str):
    """python eval.py --experiment ryarn --quick --threads 1 [extra] in `folder` (runs/ and results/ land there);
    returns results/ryarn.json."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(folder)
        assert eval.main(["--experiment", "ryarn", "--quick", "--threads", "1", *extra]) == 0
    return json.loads((folder / "results" / "ryarn.json").read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ryarn-quick")
    return folder, quick(folder)


def test_quick_experiment_writes_its_results(quick_run):
    """Bugs caught: a method or a length missing from the tables; inference-time YaRN not applied (zero-shot
    and zero-shot+yarn identical); a pretrained model that learned nothing; a claim without a verdict."""
    tmp_path, data = quick_run
    L = QUICK["L"]
    assert data["lengths"] == [L, 2 * L, 4 * L, 8 * L, 16 * L]
    assert list(data["accuracy"]) == list(ryarn.METHODS)
    for per_seed in [*data["accuracy"].values(), *data["sweep"].values()]:
        assert len(per_seed) == len(QUICK["seeds"]) and all(len(acc) == 5 for acc in per_seed)
        assert all(0 <= a <= 1 for acc in per_seed for a in acc)
    assert data["accuracy"]["zero-shot"] != data["accuracy"]["zero-shot+yarn"]
    assert data["accuracy"]["zero-shot"][0][0] > 0.3  # well above chance (1/8) at L, even at this size
    assert set(data["controls"]) == set(ryarn.CONTROLS)
    assert {c["verdict"] for c in data["claims"].values()} <= {"reproduced", "partly reproduced", "not reproduced"}
    markdown = (tmp_path / "results" / "ryarn.md").read_text()
    assert "python eval.py --experiment ryarn --quick --threads 1" in markdown and "Runtime" in markdown
    if importlib.util.find_spec("matplotlib"):  # figures are optional: without matplotlib the run says so
        assert (tmp_path / "results" / "ryarn.png").stat().st_size > 0


def test_markdown_writes_the_numbers_it_measured(quick_run):
    """Bugs caught: a gain written with the wrong sign, its sd signed or left out, the range of another claim;
    an accuracy cell that is not the seed's value (one seed: the value alone, no '± 0.000'); a beyond-L mean
    over the wrong lengths."""
    tmp_path, data = quick_run
    markdown = (tmp_path / "results" / "ryarn.md").read_text()
    for result in data["claims"].values():
        for g in result["gains"]:
            assert (f"{g['better']} − {g['worse']} = {g['mean']:+.3f} ± {g['sd']:.3f} "
                    f"[{g['min']:+.3f}, {g['max']:+.3f}]") in markdown
    (acc,) = data["accuracy"]["ft"]  # quick: one seed
    assert "| ft | " + " | ".join(f"{a:.3f}" for a in acc) + f" | {sum(acc[1:]) / 4:.3f} |" in markdown


def test_figure_draws_each_method_alike_in_every_panel(quick_run):
    """Bug caught: a method's colour taken from matplotlib's colour cycle, so that it changes from panel to
    panel with the methods beside it (ft green in one panel, orange in the next), or two methods of one panel
    drawn alike."""
    plt = eval.pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed")
    fig = ryarn.figure(quick_run[1])(plt)
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
    train.run(ryarn.train_argv(ryarn.TASK, base, QUICK["L"], 5, 0, args))
    fed = []
    train.run(ryarn.finetune_argv(ryarn.TASK, str(tmp_path), base, method, QUICK, 0, args, top),
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
