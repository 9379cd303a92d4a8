"""Every command and Python block in README.md and docs/*.md runs or is checked, and every local link resolves,
so that none can go stale when the code changes.

Commands are the lines of fenced blocks without a language (or bash/sh), `\\` continuations joined and
`# comments` dropped; each must be one of the commands below, or the test fails, so a misspelt one cannot hide.
- `python train.py ...`: parsed by train.build_parser(). A small-GPT command is run for real, in a scratch
  folder, with --steps 2 --eval-samples 8 --quiet --threads 1 --device cpu appended (the last value of a flag
  wins), unless it starts from a run (--init, --resume) that no earlier command of the same page made; then its
  settings are resolved as train.run resolves them (train.DEFAULTS, train.resolve), which refuses bad
  combinations without training. An --llm command is resolved by finetune.resolve (finetune.DEFAULTS), which
  loads no model.
- `python eval.py ...`: parsed by eval.build_parser(). On a run an earlier command made, it is run (--samples
  8). --experiment NAME and --bench go through eval.main up to the experiment itself, which is replaced by a
  stub: the name must be an experiment and every check before it must pass. --llm goes through eval.main up to
  loading the model. Otherwise (an LLM run folder no command here made) it is only parsed.
- `torchrun ...`: parsed by torchrun's own parser; the script's part is checked as above, as one of several
  processes (WORLD_SIZE set), so --fsdp is allowed and a small GPT under torchrun is not.
- `pip install ...`: every -r file exists, and a pinned version satisfies the requirements file's range.
- `python -m pytest ...`: the options are known, the paths exist, every marker in -m is registered.
- `bash .ci/run`: the script exists and bash reads it (bash -n).
Inline `python train.py ...` / `python eval.py ...` spans in the prose are parsed (and resolved), except
those that elide part of the command with `...`.

Python blocks (```python) run in a fresh namespace inside a scratch folder; those that import transformers skip
without it, and those that train (call .backward()) are slow. The README's experiment sections may quote only
numbers that their results/NAME.md holds; each experiment's docs page (DOC_RESULTS) only signed numbers and
intervals that its results/NAME.md or .json holds, except in its "How this design was chosen" section (HISTORY).
"""
import configparser
import contextlib
import importlib.util
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import types

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import eval as evaluate  # noqa: E402  (eval shadows the builtin)
import finetune  # noqa: E402
import hf  # noqa: E402
import train  # noqa: E402
from experiments import common  # noqa: E402

PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                               if f.endswith(".md"))
TINY = ["--steps", "2", "--eval-samples", "8", "--quiet", "--threads", "1", "--device", "cpu"]
SHELL = ("", "bash", "sh", "shell", "console")


def read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def fenced_blocks(text: str):
    """(language, code, line number of the first code line) of every fenced block."""
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
        yield m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2


def prose(text: str) -> str:
    """The text outside fenced blocks (fenced lines blanked, so line numbers stay)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


def command_lines(text: str):
    """(line number, words) of every command in the page's shell blocks: continuations joined, comments dropped."""
    for language, code, first in fenced_blocks(text):
        if language not in SHELL:
            continue
        pending, start = "", None
        for i, line in enumerate(code.splitlines()):
            start = first + i if start is None else start
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            words = shlex.split(pending + line, comments=True)
            if words:
                yield start, words
            pending, start = "", None


def segments(words: list[str]):
    """`a && b` -> [a], [b]."""
    part = []
    for w in words + ["&&"]:
        if w == "&&":
            if part:
                yield part
            part = []
        else:
            part.append(w)


# ---------------------------------------------------------------------------------------------------------
# The checks, one per kind of command. Each raises AssertionError (or the command's own error) on a bad one.
# ---------------------------------------------------------------------------------------------------------


class Reached(Exception):
    """Raised by a stub where the command would start the expensive part (load an LLM, join a process group)."""


@contextlib.contextmanager
def in_process(processes: int = 1):
    """Run train.main/eval.main here: restore what they change in this process (threads, SIGTERM, env)."""
    threads, handler = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK")}
    if processes > 1:
        os.environ.update(WORLD_SIZE=str(processes), RANK="0")
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, handler)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def is_run(path) -> bool:
    return bool(path) and os.path.isfile(os.path.join(path, "config.json"))


def exits_0(main, argv: list[str], program: str) -> None:
    """main(argv) must return 0; if not, the assertion quotes the last line it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, f"{program} exited {code}: " + " ".join(err.getvalue().strip().splitlines()[-1:])


def check_train(argv: list[str], processes: int = 1, run: bool = True, monkeypatch=None) -> str:
    parser = train.build_parser()
    args = parser.parse_args(argv + ["--device", "cpu"])
    for key, value in (finetune.DEFAULTS if args.llm else train.DEFAULTS).items():  # as train.run does
        if getattr(args, key) is None:
            setattr(args, key, value)
    with in_process(processes):
        if args.llm:
            if args.lora is not None and importlib.util.find_spec("peft") is None:
                return "parsed (--lora needs peft)"
            if args.resume:
                raise train.UsageError("--resume is for small-GPT runs")  # finetune.run's first check
            finetune.resolve(args, parser)
            return "resolved (--llm)"
        starts_from = args.init if not args.resume else args.out
        if run and processes == 1 and (starts_from is None or is_run(starts_from)):
            exits_0(train.main, argv + TINY, "train.py")
            return "ran"
        assert processes == 1, "a small GPT trains in one process, not under torchrun"
        if not args.resume:
            train.resolve(args, parser)
        return "resolved"


def check_eval(argv: list[str], processes: int = 1, run: bool = True, monkeypatch=None) -> str:
    args = evaluate.build_parser().parse_args(argv)
    reached = []
    if args.experiment or args.bench:  # the runner's checks run; the study is a stub that stops where it would train
        name = args.experiment or "bench"
        real = importlib.import_module(f"experiments.{name}") if name in evaluate.experiment_names() else None

        def stop(a):
            reached.append(a)
            raise Reached
        study = types.SimpleNamespace(run=stop, PRESETS=getattr(real, "PRESETS", {}),
                                      **{part: stop for part in ("cells", "dry_run") if hasattr(real, part)})
        monkeypatch.setattr(common, "importlib", types.SimpleNamespace(import_module=lambda name: study))
        extra = ["--device", "cpu"]
    elif args.llm:
        def stop(*a, **k):
            raise Reached
        monkeypatch.setattr(hf, "load_for_eval", stop)
        monkeypatch.setattr(evaluate.dist, "start", stop)  # under torchrun it would join the process group
        extra = ["--device", "cpu"]
    elif run and is_run(args.run):
        extra = ["--samples", "8", "--device", "cpu", "--threads", "1"]
    else:
        return "parsed (no run to evaluate here)"
    with in_process(processes):
        try:
            exits_0(evaluate.main, argv + extra, "eval.py")
        except Reached:
            if not reached:
                return "checked up to loading the model"
    assert reached or not (args.experiment or args.bench), "the experiment was not reached"
    return "ran"


def check_torchrun(words: list[str], monkeypatch=None, run: bool = True) -> str:
    from torch.distributed.run import get_args_parser
    try:
        launch = get_args_parser().parse_args(words)
    except SystemExit:
        raise AssertionError("torchrun's own options do not parse") from None
    script = os.path.basename(launch.training_script)
    assert script in ("train.py", "eval.py"), f"torchrun starts {script}"
    check = check_train if script == "train.py" else check_eval
    return check(launch.training_script_args, processes=2, run=run, monkeypatch=monkeypatch)


def requirement_ranges() -> dict:
    ranges = {}
    for name in ("requirements.txt", "requirements-llm.txt"):
        for line in read(name).splitlines():
            m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*([<>=!~][^#;]*)", line)
            if m:
                ranges[m.group(1).lower()] = m.group(2).strip()
    return ranges


def check_pip(words: list[str], **_) -> str:
    assert words[:2] == ["pip", "install"], "pip commands here are `pip install ...`"
    rest, ranges = iter(words[2:]), requirement_ranges()
    for w in rest:
        if w == "-r":
            path = next(rest)
            assert os.path.isfile(os.path.join(ROOT, path)), f"-r {path}: no such file"
        elif w.startswith("-"):
            assert w in ("-q", "-U", "--upgrade", "--no-deps"), f"pip option {w} is not one the test knows"
        elif "==" in w:
            from packaging.specifiers import SpecifierSet
            name, version = w.split("==")
            if name.lower() in ranges:
                assert version in SpecifierSet(ranges[name.lower()]), \
                    f"{w} is outside the requirements' {name}{ranges[name.lower()]}"
    return "checked"


def registered_markers() -> set:
    ini = configparser.ConfigParser()
    ini.read(os.path.join(ROOT, "pytest.ini"))
    return {line.split(":")[0].strip() for line in ini["pytest"]["markers"].splitlines() if line.strip()}


def check_pytest(words: list[str], **_) -> str:
    rest = iter(words)
    for w in rest:
        if w in ("-m", "-k"):
            expression = next(rest)
            if w == "-m":
                names = set(re.findall(r"[\w-]+", expression)) - {"and", "or", "not"}
                assert names <= registered_markers(), f"-m '{expression}': unregistered {names - registered_markers()}"
        elif w.startswith("-"):
            assert w in ("-q", "-x", "-v", "-s", "--co"), f"pytest option {w} is not one the test knows"
        else:
            assert os.path.exists(os.path.join(ROOT, w.split("::")[0])), f"{w}: no such test path"
    return "checked"


def check_bash(words: list[str], **_) -> str:
    assert len(words) == 2 and os.path.isfile(os.path.join(ROOT, words[1])), f"{words}: no such script"
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, words[1])]).returncode == 0, "bash cannot read it"
    return "checked"


def check_command(words: list[str], monkeypatch, run: bool = True) -> str:
    """Check one command (no &&); returns what was done."""
    if words[:2] == ["python", "train.py"]:
        return check_train(words[2:], run=run, monkeypatch=monkeypatch)
    if words[:2] == ["python", "eval.py"]:
        return check_eval(words[2:], run=run, monkeypatch=monkeypatch)
    if words[:3] == ["python", "-m", "pytest"]:
        return check_pytest(words[3:])
    if words[0] == "torchrun":
        return check_torchrun(words[1:], monkeypatch=monkeypatch, run=run)
    if words[0] == "pip":
        return check_pip(words)
    if words[0] == "bash":
        return check_bash(words)
    raise AssertionError(f"not a command this test knows how to check: {' '.join(words)}")


def check_page_commands(page: str, text: str, monkeypatch) -> list[str]:
    """Run or check every command of one page in order, in the current folder; the failures, one line each."""
    failures = []
    for line, words in command_lines(text):
        for part in segments(words):
            with monkeypatch.context() as patch:
                try:
                    check_command(part, patch)
                except (Exception, SystemExit) as e:
                    failures.append(f"{page}:{line}: {' '.join(part)}\n    {type(e).__name__}: {e}")
    return failures


def inline_commands(text: str):
    """(line, words) of inline `python train.py ...` / `python eval.py ...` spans in the prose."""
    body = prose(text)
    for m in re.finditer(r"`(python (?:train|eval)\.py[^`]*)`", body):
        yield body.count("\n", 0, m.start()) + 1, shlex.split(m.group(1))


# ---------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_command_runs_or_checks(page, tmp_path, monkeypatch):
    """Bug caught: a flag renamed in train.py (--original-max-len -> --original-len) while the README kept the
    old one; a flag combination the code refuses (--fsdp with --lora) shown as the way to run."""
    monkeypatch.chdir(tmp_path)
    failures = check_page_commands(page, read(page), monkeypatch)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("page", PAGES)
def test_inline_commands_parse(page, monkeypatch):
    failures = []
    for line, words in inline_commands(read(page)):
        if "--help" in words or "..." in words:  # help, or a command elided on purpose
            continue
        with monkeypatch.context() as patch:
            try:
                check_command(words, patch, run=False)
            except (Exception, SystemExit) as e:
                failures.append(f"{page}:{line}: {' '.join(words)}\n    {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures)


def python_blocks() -> list:
    blocks = []
    for page in PAGES:
        for language, code, line in fenced_blocks(read(page)):
            if language == "python":
                marks = [pytest.mark.slow] if ".backward()" in code else []
                blocks.append(pytest.param(code, id=f"{page}:{line}", marks=marks))
    return blocks


@pytest.mark.parametrize("code", python_blocks())
def test_python_block_runs(code, request, tmp_path, monkeypatch):
    if re.search(r"^\s*(from|import) transformers", code, re.M):
        pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a block is small: more threads only contend for the cores
    try:
        exec(compile(code, request.node.callspec.id, "exec"), {"__name__": "__snippet__"})
    finally:
        torch.set_num_threads(threads)


def test_every_python_block_compiles():
    """The slow blocks too, in the fast suite: at least their syntax."""
    for param in python_blocks():
        compile(param.values[0], param.id, "exec")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set:
    return {slug(m.group(1).replace("`", "")) for m in re.finditer(r"^#+ (.*)$", prose(read(page)), re.M)}


def broken_links(page: str, text: str) -> list[str]:
    broken = []
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose(text)):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.isfile(os.path.join(ROOT, file)):
            broken.append(f"{page}: {target}: no such file")
        elif anchor and (not file.endswith(".md") or anchor not in anchors(file)):
            broken.append(f"{page}: {target}: no such heading")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_local_links_resolve(page):
    assert not broken_links(page, read(page)), "\n".join(broken_links(page, read(page)))


REPO_PATH = re.compile(r"^(?:(?:results|docs|tests|experiments)/[\w.-]+\.(?:md|png|json|py)|[\w-]+\.(?:py|txt|ini)|"
                       r"\.ci/run)$")


@pytest.mark.parametrize("page", PAGES)
def test_files_named_in_code_spans_exist(page):
    named = {m.group(1) for m in re.finditer(r"`([^`\s]+)`", prose(read(page)))
             if REPO_PATH.match(m.group(1)) and "NAME" not in m.group(1)}  # results/NAME.md is a pattern
    missing = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{page} names files that do not exist: {missing}"


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:e[-+]?\d+)?")


def unquoted_numbers(text: str) -> list[str]:
    """Numbers in each README section that links results/NAME.md and that no such linked file holds."""
    missing = []
    for section in re.split(r"^#{2,3} ", text.replace("−", "-"), flags=re.M):
        sources = set(re.findall(r"\]\((results/\w+\.md)\)", section))
        if not sources:
            continue
        held = " ".join(read(s).replace("−", "-") for s in sources)
        for number in set(NUMBER.findall(section)):
            if not re.search(r"(?<![\d.])" + re.escape(number) + r"(?!\d)", held):
                missing.append(f"{number} (section '{section.splitlines()[0]}', {', '.join(sorted(sources))})")
    return sorted(missing)


def test_readme_quotes_results_exactly():
    """Every number in an experiment's README section is copied from its results file, not rounded anew."""
    missing = unquoted_numbers(read("README.md"))
    assert not missing, "numbers not in the linked results file:\n" + "\n".join(missing)


# The docs page that explains each experiment, and the experiment it quotes.
DOC_RESULTS = {"docs/randomized-yarn.md": ("ryarn", "ryarn-probe", "ryarn-pretrained-length"),
               "docs/distance.md": ("distance",), "docs/llm.md": ("llm", "llm-qa1", "llm-probe", "passkey-grid"),
               "docs/every-encoding.md": ("encodings",),
               "docs/why-rope-extrapolates.md": ("retrieval",)}
# Sections with this heading tell how the design was chosen: they quote earlier designs' results from older
# commits, which the current results no longer hold, so their numbers are not checked.
HISTORY = "How this design was chosen"
SIGNED = r"[-+]\d+(?:\.\d+)?(?:e[-+]?\d+)?"
# A signed number (+0.046, -0.28), with the interval that follows it when there is one ("+0.046 [+0.018,
# +0.074]", checked as one quote), or an interval alone.
QUOTE = re.compile(rf"(?<![\w.]){SIGNED}(?:\s*\[{SIGNED},\s*{SIGNED}\])?|\[{SIGNED},\s*{SIGNED}\]")


def checked_prose(text: str) -> str:
    """A docs page's prose without its fenced blocks, its rendered blocks (test_rendered.py checks those) and its
    history sections (HISTORY); what is left out is blanked, so line numbers stay."""
    text = re.sub(r"<!-- rendered by .*?<!-- end rendered -->", lambda m: "\n" * m.group(0).count("\n"),
                  prose(text), flags=re.S)
    lines, skip_below = text.split("\n"), None
    for i, line in enumerate(lines):
        heading = re.match(r"(#+) (.*)", line)
        if heading and (skip_below is None or len(heading.group(1)) <= skip_below):
            skip_below = len(heading.group(1)) if heading.group(2).strip() == HISTORY else None
        if skip_below is not None:
            lines[i] = ""
    return "\n".join(lines)


def unquoted_signed(text: str, names: tuple[str, ...]) -> list[str]:
    """Signed numbers and intervals in a docs page's checked prose that no results/NAME.md or results/NAME.json
    of `names` holds as written (sign, digits and, for an interval, both ends with its estimate)."""
    flat = lambda s: re.sub(r"\s+", " ", s.replace("\u2212", "-"))  # noqa: E731  (the minus sign U+2212)
    held = flat(" ".join(read(f"results/{name}.{ext}") for name in names for ext in ("md", "json")))
    body, missing = checked_prose(text.replace("\u2212", "-")), []
    for m in QUOTE.finditer(body):
        quote = flat(m.group(0))
        if not re.search(r"(?<![\d.])" + re.escape(quote) + r"(?!\d)", held):
            missing.append(f"line {body.count(chr(10), 0, m.start()) + 1}: {quote}")
    return missing


@pytest.mark.parametrize("page", sorted(DOC_RESULTS))
def test_docs_quote_their_results_exactly(page):
    """Every signed number and interval in an experiment's docs page (outside code, rendered blocks and the
    history of its design) is copied from that experiment's results, not remembered from an earlier run.
    Bug caught: docs/distance.md kept "ALiBi - RoPE reproduced (C +0.209 [+0.023, +0.396])" after the rule
    changed and results/distance.md said +0.209 [-0.011, +0.430], undecided."""
    names = DOC_RESULTS[page]
    missing = unquoted_signed(read(page), names)
    assert not missing, f"{page}: numbers not in results/{'|'.join(names)}.md or .json:\n" + "\n".join(missing)


def test_readme_stays_a_short_tutorial():
    lines = read("README.md").splitlines()
    assert len(lines) <= 320, f"README.md has {len(lines)} lines: move explanations to docs/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 110]
    assert not long, f"README.md lines longer than 110 characters: {long}"


# ---------------------------------------------------------------------------------------------------------
# The checks themselves can fail
# ---------------------------------------------------------------------------------------------------------


BAD = """
```
python train.py --task retrieval --stpes 2
python train.py --task copy --curriculum 32:64
python train.py --llm smollm2 --method ft --factor 4
torchrun --nproc_per_node 2 train.py --llm DIR --fsdp --grad-accum 0
torchrun --nproc_per_node 2 train.py --task copy
python eval.py --experiment nonsense
python eval.py --bench --jobs 2
python eval.py --llm smollm2 --scaling pi --factor 2
pip install -r requirements-gpu.txt
pip install torch==2.0.0
python -m pytest -q -m "not slwo"
bash .ci/missing
pyhton train.py
```
"""


def test_every_kind_of_check_can_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    failures = check_page_commands("BAD", BAD, monkeypatch)
    assert len(failures) == len(list(command_lines(BAD))), "\n".join(failures)
    assert broken_links("README.md", "[x](results/missing.md) [y](README.md#no-such-heading)")
    assert unquoted_numbers("### X\n[r](results/retrieval.md)\n| ryarn | 0.6789 |\n")
    quoted, ablation = "ryarn - yarn is +0.046 [+0.018, +0.074]; -0.143 and [-0.117, -0.010].\n", \
        ("ryarn-pretrained-length",)
    assert not unquoted_signed(quoted, ablation)
    assert unquoted_signed(quoted.replace("+0.074]", "+0.075]"), ablation)  # one end of an interval
    assert unquoted_signed(quoted.replace("-0.143", "+0.143"), ablation)  # the sign
    assert unquoted_signed(quoted.replace("+0.046 [", "+0.055 ["), ablation)  # an estimate with another's interval
    assert not unquoted_signed(f"## {HISTORY}\n\nan earlier design: -0.924\n", ablation)
    assert unquoted_signed(f"## {HISTORY}\n\n-0.924\n\n## Next\n\n-0.924\n", ablation)
    with pytest.raises(ZeroDivisionError):
        exec("1 / 0", {})
