"""python eval.py --experiment distance --quick: it runs, writes its files, and a model learns its delay band."""
import importlib.util
import json

import eval as lengen_eval


def test_distance_quick_writes_results_and_fits_in_range(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the experiment's runs/ go here, not into the repository
    out = tmp_path / "results"
    assert lengen_eval.main(["--experiment", "distance", "--quick", "--threads", "1", "--out-dir", str(out)]) == 0
    md = (out / "distance.md").read_text()
    for heading in ("## Verdicts", "## Size", "## (A, delay copy)", "## (A, selective copy)", "## (B) Diversity",
                    "## (C) Transfer"):
        assert heading in md
    data = json.loads((out / "distance.json").read_text())
    assert set(data["verdicts"]) == {"size", "A, delay copy", "A, selective copy", "B", "C"}
    # every curve covers every delay from 0 to 4x the band's top
    top = data["settings"]["top"]
    assert top >= 4 * data["settings"]["band"][1]
    assert all(run["delays"] == list(range(top + 1)) for run in data["A"]["delay_copy"].values())
    # at least one encoding learns delay copy inside its training band
    in_range = {e: max(run["in_mean"]) for e, run in data["A"]["delay_copy"].items()}
    assert max(in_range.values()) > 0.9, in_range
    if importlib.util.find_spec("matplotlib"):
        assert (out / "distance.png").stat().st_size > 0
