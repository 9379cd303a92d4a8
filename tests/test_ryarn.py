"""The ryarn experiment (Paper R on the small GPT): its quick run, and the positions its training loop used."""
import importlib.util
import json

import torch

import eval
import train
from experiments import ryarn

QUICK = ryarn.SCALES["quick"]


def test_quick_experiment_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ and results/ land in the temporary directory
    assert eval.main(["--experiment", "ryarn", "--quick", "--threads", "1"]) == 0
    data = json.loads((tmp_path / "results" / "ryarn.json").read_text())
    L = QUICK["length"]
    assert data["lengths"] == [L, 2 * L, 4 * L, 8 * L]
    for task in ryarn.RYARN_TASKS:
        for method in ryarn.RYARN_LABELS:
            per_seed = data["accuracy"][task][method]
            assert len(per_seed) == len(QUICK["seeds"]) and all(len(acc) == 4 for acc in per_seed)
            assert all(0 <= a <= 1 for acc in per_seed for a in acc)
    assert set(data["verdicts"].values()) <= {"reproduced", "partly reproduced", "not reproduced"}
    markdown = (tmp_path / "results" / "ryarn.md").read_text()
    assert "python eval.py --experiment ryarn --quick --threads 1" in markdown and "Runtime" in markdown
    if importlib.util.find_spec("matplotlib"):  # figures are optional: without matplotlib the run says so
        assert (tmp_path / "results" / "ryarn.png").stat().st_size > 0


def test_ryarn_feeds_sorted_distinct_positions_beyond_L_on_a_widening_range(tmp_path):
    """What the loop fed the model under the experiment's own ryarn command line, not what a sampler can do."""
    L, s, seed, root = QUICK["length"], QUICK["factor"], 0, str(tmp_path)
    train.run(ryarn.ryarn_argv("copy", "pretrain", QUICK, seed, root, threads=1))
    fed = []
    train.run(ryarn.ryarn_argv("copy", "ryarn", QUICK, seed, root, threads=1),
              on_step=lambda step, x, positions: fed.append((step, x, positions)))
    assert [step for step, _, _ in fed] == list(range(QUICK["finetune"]))
    for _, x, positions in fed:
        assert positions.shape == x.shape
        assert torch.all(positions[:, 1:] > positions[:, :-1])  # sorted and distinct in every row
        assert positions.min() >= 0 and positions.max() < s * L
    tops = [int(positions.max()) for _, _, positions in fed]
    assert max(tops) >= L  # positions beyond the original context were used
    # the curriculum: the range is [0, L) at the first step, so only ids below L; in the last third, past 3L
    third = len(tops) // 3
    assert tops[0] < L and max(tops[-third:]) >= 3 * L
    assert sum(tops[-third:]) / third > sum(tops[:third]) / third
