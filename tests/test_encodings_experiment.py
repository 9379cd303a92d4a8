"""The encodings experiment: its quick run, the verdicts it derives, and the NoPE shortcut it takes."""
import importlib.util
import json

import torch

import eval
import train
from experiments import encodings as exp

QUICK = exp.SCALES["quick"]


def test_quick_experiment_writes_its_results(tmp_path, monkeypatch):
    """Bugs caught: a variant or task missing from the tables, accuracies not one per seed and length, NoPE
    shown twice, verdicts that do not follow from the numbers written beside them."""
    monkeypatch.chdir(tmp_path)  # runs/ and results/ land in the temporary directory
    assert eval.main(["--experiment", "encodings", "--quick", "--threads", "1"]) == 0
    data = json.loads((tmp_path / "results" / "quick" / "encodings.json").read_text())
    labels = [exp.label(e, p) for e, p in exp.variants()]
    assert len(labels) == 2 * len(exp.ENCODINGS) - 1 and "nope + rand" not in labels and "fire + rand" in labels
    assert list(data["accuracy"]) == list(QUICK["tasks"])
    for by_variant in data["accuracy"].values():
        assert list(by_variant) == labels
        for per_seed in by_variant.values():
            assert len(per_seed) == len(QUICK["seeds"]) and all(len(acc) == len(exp.MULTIPLES) for acc in per_seed)
            assert all(0 <= a <= 1 for acc in per_seed for a in acc)
    assert data["claims"] == json.loads(json.dumps(exp.claims(data["accuracy"], QUICK["tasks"])))
    assert data["models"] == len(labels) * len(QUICK["tasks"]) * len(QUICK["seeds"])
    markdown = (tmp_path / "results" / "quick" / "encodings.md").read_text()
    assert "python eval.py --experiment encodings --quick --threads 1" in markdown
    assert all(claim in markdown for claim in exp.PAPER)
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "results" / "quick" / "encodings.png").stat().st_size > 0


def synthetic(beyond_of):
    """An accuracy table in which variant v scores beyond_of(v, seed) beyond L (and 1.0 at L) on every task."""
    return {t: {exp.label(e, p): [[1.0] + [beyond_of(exp.label(e, p), seed)] * 3 for seed in (0, 1)]
                for e, p in exp.variants()} for t in ("copy", "reverse")}


def test_verdicts_follow_the_numbers():
    """Bugs caught: a ranking read upside down, a gain counted when one seed loses, the winner's place off
    by one, a gain written without its sign or its range. Four made-up tables where the right verdict is known."""
    table = synthetic(lambda v, seed: {"nope": 0.9, "fire": 0.35, "t5": 0.8, "xpos": 0.3}.get(v.split(" ")[0], 0.4)
                      + (0.1 if v.endswith("+ rand") else 0.0))
    claims = exp.claims(table, ["copy", "reverse"])
    assert claims["randomized positions help"]["verdict"] == "reproduced"
    assert claims["randomized positions help"]["measured"].startswith("learned +0.100 [+0.100, +0.100]; ")
    assert claims["NoPE generalizes best"]["verdict"] == "reproduced"
    assert claims["FIRE generalizes best"]["place"] == 6  # last of six
    assert claims["FIRE generalizes best"]["verdict"] == "not reproduced"
    table["copy"]["fire"] = table["reverse"]["fire"] = [[1.0, 0.45, 0.45, 0.45]] * 2
    claims = exp.claims(table, ["copy", "reverse"])  # now third of six: behind nope 0.9 and t5 0.8
    assert claims["FIRE generalizes best"]["place"] == 3
    assert claims["FIRE generalizes best"]["verdict"] == "partly reproduced"
    assert claims["xPos beats RoPE"]["verdict"] == "not reproduced"  # 0.3 against 0.4
    mixed = synthetic(lambda v, seed: 0.5 + (0.1 if v == "rope + rand" else 0.2 * (seed - 0.5) if "+ rand" in v
                                              else 0.0))
    claims = exp.claims(mixed, ["copy", "reverse"])
    assert claims["randomized positions help"]["holds_for"] == ["rope"]  # the others lose in seed 0
    assert claims["randomized positions help"]["verdict"] == "partly reproduced"


def test_nope_with_randomized_positions_is_the_same_run(tmp_path):
    """The experiment trains NoPE once, on the grounds that position ids drawn from their own generator
    change nothing else. Bug caught: a position sampler sharing the data generator (then the runs differ)."""
    weights = []
    for positions in exp.POSITIONS:
        out = str(tmp_path / positions)
        train.run(["--task", "copy", "--encoding", "nope", "--positions", positions, "--train-len", "6:12",
                   "--steps", "15", "--out", out, "--eval-samples", "0", "--quiet", "--threads", "1"])
        weights.append(train.load_run(out, "cpu")[0].state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
