"""Results that render themselves: every claims table in README.md and docs/*.md, and every results/NAME.md, is
what the experiment's own code renders from the committed results/NAME.json; no committed verdict contradicts
its own numbers."""
import importlib
import json
import os

import pytest

from experiments import common, stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ryarn's earlier results are an ablation now, results/ryarn-pretrained-length.{md,json,png}, which the current
# code does not render; llm's qa1 design is a record the current code still renders (RECORDS, below).
EXPERIMENTS = ("retrieval", "distance", "ryarn", "llm", "encodings")


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page", [os.path.relpath(p, ROOT) for p in common.pages()])
def test_every_rendered_table_is_what_its_experiment_renders(page):
    """Bug caught: a number or verdict typed into README.md or docs/ that its results json does not render
    (the README's ryarn table said "reproduced" where its json, decided again, says undecided)."""
    text = read(page)
    assert common.render_blocks(text) == text, f"{page}: run python eval.py --experiment NAME --render"


def test_the_readme_renders_every_experiments_table():
    blocks = {m.group(2) for m in common.BLOCK.finditer(read("README.md"))}
    assert blocks == set(EXPERIMENTS)


def test_a_typed_number_in_a_rendered_table_is_caught():
    text = read("README.md")
    block = next(common.BLOCK.finditer(text)).group(4)
    edited = text.replace(block, block.replace("reproduced", "not reproduced", 1))
    assert edited != text and common.render_blocks(edited) != edited


# Earlier designs' records kept under their own name, each rendered by its experiment's current code below a
# note that says what it was: results/NAME.md, its experiment.
RECORDS = {"llm-qa1": "llm"}


@pytest.mark.parametrize("name", EXPERIMENTS + tuple(RECORDS))
def test_each_results_file_is_what_its_json_renders(name):
    """results/NAME.md is the markdown the experiment writes from results/NAME.json (decided by the current
    rule: python eval.py --experiment NAME --render): its verdicts cannot drift from its numbers. A record of
    an earlier design (RECORDS) is the same below its note."""
    report = importlib.import_module(f"experiments.{RECORDS.get(name, name)}_report")
    with open(os.path.join(ROOT, "results", f"{name}.json"), encoding="utf-8") as f:
        data = report.decide_again(json.load(f, object_hook=common.int_keys))
    markdown, page = report.markdown(data), read(f"results/{name}.md")
    if name in RECORDS:
        note, page = page.split("\n\n", 1)
        assert note.startswith("> **") and "[docs/" in note
    assert page.startswith(markdown.rstrip("\n"))
    assert json.loads(json.dumps(data)) == json.loads(read(f"results/{name}.json"))


def reproduced_without_support(x, path=""):
    """Every "reproduced" in a results json whose own interval includes 0, or that rests on fewer than 3 units."""
    if isinstance(x, dict):
        if x.get("verdict") == "reproduced" and isinstance(x.get("per_unit"), list):
            if len(x["per_unit"]) < stats.MIN_UNITS or not x.get("low", 0) > 0:
                yield path
        for k, v in x.items():
            yield from reproduced_without_support(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from reproduced_without_support(v, f"{path}[{i}]")


def test_no_committed_reproduced_rests_on_an_interval_that_includes_zero():
    found = [f"{name}{p}" for name in EXPERIMENTS
             for p in reproduced_without_support(json.loads(read(f"results/{name}.json")))]
    assert not found, found
    planted = {"claims": {"x": {"verdict": "reproduced", "per_unit": [0.1, 0.2, -0.05], "low": -0.01}}}
    assert list(reproduced_without_support(planted)) == ["/claims/x"]


def page_of_two_blocks() -> str:
    """A page with prose around two rendered blocks of two experiments, each holding an old table."""
    block = ("<!-- rendered by experiments/{0}_report.py summary() from results/{0}.json -->\n"
             "| old {0} table |\n<!-- end rendered -->")
    return (f"# Page\n\nProse before.\n\n{block.format('distance')}\n\nProse between.\n\n{block.format('llm')}\n\n"
            "After.\n")


def test_render_only_one_experiment_refreshes_exactly_its_block(monkeypatch):
    """#53 (tests that catch): --render of one experiment (render_blocks(only=NAME)) makes its own block anew and
    leaves every other byte of the page as it was. Bug planted to watch it fail: the `only` test inverted (the
    other experiment's block rendered), or dropped (every block rendered)."""
    monkeypatch.setattr(common, "rendered", lambda name, function: f"| new {name} {function} table |\n")
    text = page_of_two_blocks()
    assert common.render_blocks(text, only="distance") == text.replace("| old distance table |",
                                                                       "| new distance summary table |")
    assert common.render_blocks(text, only="llm") == text.replace("| old llm table |", "| new llm summary table |")
    assert common.render_blocks(text, only="encodings") == text


@pytest.mark.parametrize("lost", [0, 1])
def test_a_block_that_lost_its_end_line_is_refused_and_the_prose_kept(monkeypatch, lost):
    """Bug caught (#53 item 6): with the first block's end line gone, the block ran on to the second block's end,
    and --render replaced the prose between them (and the second block's first line) with the first's table;
    with the last block's gone, that block was silently left unrendered. Now refused, the page unchanged."""
    monkeypatch.setattr(common, "rendered", lambda name, function: f"| new {name} table |\n")
    text = page_of_two_blocks()
    parts = text.split("<!-- end rendered -->")
    damaged = "<!-- end rendered -->".join(parts[:lost + 1]) + "".join(parts[lost + 1:lost + 2]) + \
        "".join("<!-- end rendered -->" + p for p in parts[lost + 2:])
    assert damaged.count("<!-- end rendered -->") == 1
    for only in (None, "distance", "llm"):
        with pytest.raises(common.UsageError, match="lost its end line"):
            common.render_blocks(damaged, only=only)

def test_render_of_damaged_results_is_one_line(tmp_path, monkeypatch, capsys):
    """Issue 53, items 18-23: --render on results that are JSON with a command but not what the report reads
    (damaged, edited by hand) was the report's KeyError traceback; now one line, exit status 2."""
    import eval
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "encodings.json").write_text(json.dumps({"command": "python eval.py --experiment encodings"}))
    capsys.readouterr()
    assert eval.main(["--experiment", "encodings", "--render", "--out-dir", "out"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "out/encodings.json is damaged or not this experiment's results" in error


def test_pages_are_rendered_one_command_at_a_time(tmp_path, monkeypatch):
    """Issue 53, item 20: two --render commands of different experiments at once each read README.md, and the
    later write dropped the other's tables. render_pages holds a flock on the repository's folder while it
    reads and writes the pages: another render waits. Checked from inside the render: a second, non-blocking
    flock is refused. Bug caught: no lock (the planted `fcntl.flock` line removed)."""
    import fcntl
    page = tmp_path / "README.md"
    page.write_text("before\n")
    held = []

    def render_blocks(text, only=None):
        fd = os.open(common.ROOT, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return text + f"rendered {only}\n"
    monkeypatch.setattr(common, "pages", lambda: [str(page)])
    monkeypatch.setattr(common, "render_blocks", render_blocks)
    common.render_pages("encodings")
    assert held == [True] and page.read_text() == "before\nrendered encodings\n"
