"""The layout the imports keep: each experiment is a study (experiments/NAME.py) that writes nothing and a report
(experiments/NAME_report.py) that writes it; the study never imports its report or any writer; nothing the
library or the tasks import reaches the experiments. Read from the source, without running it."""
import ast
import os
import sys

import pytest

import eval as lengen_eval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = lengen_eval.experiment_names() + ["bench"]
WRITERS = {"write_results", "pyplot", "save_figure", "plot_curves", "line_styles", "seed_curve", "render_blocks"}


def imports(path: str) -> set[str]:
    """Every module and name a file imports, anywhere in it, as 'module' and 'module.name', and every string
    literal handed to import_module or __import__."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)}
            found |= {"<dynamic>" for a in node.args if not isinstance(a, ast.Constant)}
    return found


def test_every_experiment_is_a_study_and_its_report():
    assert set(lengen_eval.experiment_names()) == {"distance", "encodings", "gpu", "llm", "retrieval", "ryarn"}
    for name in STUDIES:
        assert os.path.isfile(os.path.join(ROOT, "experiments", f"{name}.py"))
        assert os.path.isfile(os.path.join(ROOT, "experiments", f"{name}_report.py"))


@pytest.mark.parametrize("name", STUDIES)
def test_a_study_imports_no_report_and_no_writer(name):
    """Bug caught: a study that writes its own markdown or figure again, or imports its report (a circle)."""
    found = imports(f"experiments/{name}.py")
    assert not {m for m in found if m.endswith("_report") or "_report." in m}, found
    assert "<dynamic>" not in found, "a study imports nothing by a computed name"
    assert not {m for m in found if m.split(".")[-1] in WRITERS or m.startswith("matplotlib")}, found


@pytest.mark.parametrize("name", STUDIES)
def test_a_report_reads_its_study_and_is_read_by_nothing_below_the_runner(name):
    found = imports(f"experiments/{name}_report.py")
    assert f"experiments.{name}" in found or name == "gpu", found  # gpu's report needs nothing of its study
    readers = [f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py")
               and f != "common.py" and any(m.startswith(f"experiments.{name}_report")
                                            for m in imports(f"experiments/{f}"))]
    assert readers == [], readers


def test_the_library_never_reaches_the_experiments():
    """lengen, tasks, text_tasks, runs, folder_lock, dist, hf, finetune and train import no experiment; eval.py
    imports one module of them, experiments.common, late, inside the command that asks for an experiment."""
    for path in ("lengen.py", "tasks.py", "text_tasks.py", "runs.py", "folder_lock.py", "dist.py", "hf.py",
                 "finetune.py", "train.py"):
        assert not {m for m in imports(path) if m.startswith("experiments")}, path
    assert {m for m in imports("eval.py") if m.startswith("experiments")} == {"experiments.common"}
    with open(os.path.join(ROOT, "eval.py"), encoding="utf-8") as f:
        top = [n for n in ast.parse(f.read()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top if "experiments" in ast.dump(n)], "experiments are imported only when asked for"


def test_the_folder_lock_takes_the_standard_library_alone():
    """folder_lock.py is copied into other projects as it is. Bug caught: it reaching for runs.UsageError (or
    torch), so that a copy fails on import."""
    found = {m.split(".")[0] for m in imports("folder_lock.py")}
    assert found <= set(sys.stdlib_module_names) | {"__future__"}, found - set(sys.stdlib_module_names)
