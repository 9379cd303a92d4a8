"""What train.py does inside a run, checked against independent numbers: the interval behind every published
"[low, high]", the learning-rate schedule, --init, weight decay kept off a position table, and the position ids
a run samples reaching the model.

Runs go through train.run, exactly as `python train.py ...` would; the GPT's forward is wrapped (record_forwards)
to see what each training step computed, and with which weights.
"""
import os
import types

import pytest
import torch

import eval
import lengen
import runs
import tasks
import train

TINY = ["--task", "retrieval", "--offset", "1", "--train-len", "8:16", "--layers", "1", "--heads", "1", "--dim", "32",
        "--no-mlp", "--batch", "16", "--lr", "3e-3", "--warmup", "5", "--threads", "1", "--eval-samples", "8",
        "--quiet"]


def record_forwards(monkeypatch):
    """Wrap GPT.forward: every training-mode call appends (weights before it, tokens, its logits)."""
    calls = []
    original = lengen.GPT.forward

    def forward(self, idx, positions=None, return_attention=False):
        out = original(self, idx, positions, return_attention)
        if self.training:
            weights = {k: v.detach().clone() for k, v in self.state_dict().items()}
            calls.append((weights, idx.clone(), out.detach().clone()))
        return out

    monkeypatch.setattr(lengen.GPT, "forward", forward)
    return calls


def saved_weights(run_dir):
    return torch.load(os.path.join(run_dir, "checkpoint.pt"), weights_only=False)["model"]


# --- the 95 % interval -------------------------------------------------------------------------------------

@pytest.mark.parametrize("right, n, low, high", [
    # Wilson's score interval at z = 1.96, worked by hand: for 0/n the upper bound is z^2 / (n + z^2)
    (0, 10, 0.0, 0.2775),
    (5, 10, 0.2366, 0.7634),
    (10, 10, 0.7225, 1.0),
    (1, 4, 0.0456, 0.6994),
])
def test_wilson_interval_known_values(right, n, low, high):
    """Bug caught: a wrong Wilson interval (z = 1.645, the centre's z^2/2n term dropped, a Wald interval that
    collapses to [0, 0] at 0/10) under every published accuracy."""
    mean, lo, hi = eval.interval(torch.tensor([1.0] * right + [0.0] * (n - right)))
    assert mean == right / n
    assert (lo, hi) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))
    # Independently of the closed form: Wilson's bounds are where the score test is exactly at its limit,
    # |p_hat - p| = z sqrt(p (1 - p) / n), i.e. the roots of that quadratic in p (0/n and n/n: one root is 0 or 1)
    z = 1.96
    for bound in (lo, hi):
        if 0 < bound < 1:
            assert (mean - bound) ** 2 == pytest.approx(z * z * bound * (1 - bound) / n, abs=1e-9)


def test_interval_of_fractional_scores_uses_the_sample_sd_and_a_t_quantile():
    """Bug caught: per-sequence accuracies that are not 0/1 given a Wilson interval, a standard error from the
    population sd (n instead of n - 1), or 1.96 standard errors at any n (issue 53, item 15: at 4 sequences the
    95 % quantile is t(3) = 3.182). 0.625 +- 3.182 * 0.32275 / 2, by hand, cut at 1; at 256 sequences t(255)
    = 1.969; one sequence says nothing of its spread: [0, 1]."""
    mean, lo, hi = eval.interval(torch.tensor([0.5, 1.0, 0.75, 0.25]))
    assert (mean, lo, hi) == (0.625, pytest.approx(0.1115, abs=1e-3), 1.0)
    values = torch.tensor([0.25, 0.75] * 128)
    mean, lo, hi = eval.interval(values)
    assert hi - mean == pytest.approx(1.9693 * float(values.std()) / 16, abs=1e-4)
    assert eval.interval(torch.tensor([0.5])) == (0.5, 0.0, 1.0)


# --- the learning rate -------------------------------------------------------------------------------------

def test_learning_rate_warms_up_then_decays_to_a_tenth():
    """Bug caught: a warm-up that starts at 0 (step 0 would not learn) or overshoots, a cosine that decays to 0
    or to the wrong floor, that ends before or after the last step, or that rises again after it."""
    cfg = {"lr": 2.0, "warmup": 10, "steps": 110}
    lr = [train.learning_rate(step, **cfg) for step in range(200)]
    assert lr[0] == pytest.approx(0.2) and lr[4] == pytest.approx(1.0) and lr[9] == pytest.approx(2.0)  # linear
    assert lr[10] == pytest.approx(2.0)                                 # the cosine starts at the peak ...
    assert lr[60] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))             # ... is halfway down at half its length
    assert lr[110] == pytest.approx(0.2) and set(lr[110:]) == {lr[110]}  # ... and ends at a tenth, then stays
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))
    model = lengen.GPT(lengen.GPTConfig(vocab_size=8, encoding="learned"))
    optimizer = train.make_optimizer(model, types.SimpleNamespace(**cfg, wd=0.1))
    x, y, mask = tasks.make_batch("copy", 2, 8, torch.Generator().manual_seed(0), symbols=6)
    train.take_step(types.SimpleNamespace(**cfg, encoding="learned"), 60, model, model, optimizer, x, y, mask, None)
    assert [g["lr"] for g in optimizer.param_groups] == [lr[60]] * 2  # decayed and undecayed groups alike


# --- runs through train.py ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sampler", ["randomized", "stretch", "pose"])
def test_positions_fed_by_train_reach_the_model(tmp_path, monkeypatch, sampler):
    """Bug caught: train.py sampling position ids (and showing them to on_step, and logging them) but calling
    the model without them, so that randomized, stretch or PoSE training is silently contiguous training.

    The logits of the last training step must be the model's logits at the fed ids, not at 0..T-1."""
    forwards = record_forwards(monkeypatch)
    fed = []
    run = train.run(TINY + ["--positions", sampler, "--max-position", "128", "--steps", "30",
                            "--out", str(tmp_path / sampler)], on_step=lambda step, x, positions: fed.append(positions))
    assert len(fed) == len(forwards) == 30
    weights, x, logits = forwards[-1]
    model, _ = eval.load_run(run["run"])
    model.load_state_dict(weights)  # the model as it was at that step
    with torch.no_grad():
        at_fed, contiguous = model(x, fed[-1]), model(x)
    assert torch.allclose(logits, at_fed, atol=1e-5)
    assert (at_fed - contiguous).abs().max() > 1e-2  # the fed ids are not 0..T-1 to the model


def test_init_starts_from_the_source_weights(tmp_path, monkeypatch):
    """Bug caught: --init that is accepted (and checked for shape) but never loaded, or loaded after the
    optimizer or into another copy, so training starts from a fresh random model."""
    source = train.run(TINY + ["--steps", "20", "--out", str(tmp_path / "source")])["run"]
    forwards = record_forwards(monkeypatch)
    train.run(TINY + ["--steps", "2", "--seed", "1", "--init", source, "--out", str(tmp_path / "continued")])
    at_step_0, expected = forwards[0][0], saved_weights(source)
    assert set(at_step_0) == set(expected)
    assert all(torch.equal(at_step_0[k], expected[k]) for k in expected)


def test_learned_rows_beyond_training_keep_their_init_under_weight_decay(tmp_path, monkeypatch):
    """Bug caught: the position table put in AdamW's weight-decay group. Rows for positions training never
    reaches get no gradient, so only decay would move them: towards 0, erasing the init Paper A's pinning is
    about. Trained on lengths up to 16 (ids 0..15) with strong decay through train.py."""
    forwards = record_forwards(monkeypatch)
    run = train.run(TINY + ["--encoding", "learned", "--max-len", "64", "--wd", "0.5", "--lr", "1e-2", "--steps", "20",
                            "--out", str(tmp_path / "learned")])["run"]
    initial, final = forwards[0][0], saved_weights(run)
    table_before, table_after = initial["pos.table.weight"], final["pos.table.weight"]
    assert torch.equal(table_after[16:], table_before[16:])
    assert not torch.equal(table_after[:16], table_before[:16])  # the rows in use did train


def test_one_name_per_setting():
    """GPTConfig's fields, RunConfig's fields (config.json's keys) and the command line's flags are one set of
    names (no layer that translates between them): a field renamed in one place alone fails here. dropout and
    query_block are GPTConfig's only, settings the command line does not offer; task_options, vocab_size and
    out are what the checks make of the flags."""
    import dataclasses
    fields = {f.name for f in dataclasses.fields(lengen.GPTConfig)}
    run_fields = {f.name for f in dataclasses.fields(runs.RunConfig)}
    flags = set(vars(train.build_parser().parse_args([])))
    assert fields - {"dropout", "query_block"} <= run_fields and run_fields - {"task_options", "vocab_size"} <= flags
    values = {"vocab_size": 8, "layers": 3, "heads": 2, "dim": 16, "no_mlp": True, "encoding": "alibi",
              "rope_base": 500.0, "scaling": "none", "factor": 1.0, "original_len": 12, "attention": "softmax",
              "linear_normalised": False, "max_len": 40, "dropout": 0.25, "query_block": 7,
              "alibi_slope_heads": 8}
    cfg = types.SimpleNamespace(**values)
    config = eval.model_config(cfg)
    assert {k: getattr(config, k) for k in fields} == {k: values[k] for k in fields}


# ---------------------------------------------------------------------------------------------------------
# --fit-bar: train until the model has learned its task at the training length
# ---------------------------------------------------------------------------------------------------------

FIT_RUN = ["--task", "reverse", "--encoding", "rope", "--train-len", "6:12", "--fit-every", "10", "--eval-samples",
           "0", "--quiet", "--threads", "1"]


def test_fit_check_measures_held_out_sequences_at_the_training_length(tmp_path):
    """The fit check's accuracy is the model's on FIT_SAMPLES fresh sequences at the longest training length,
    none of them met in training. Bugs caught: fit measured beyond L, on the training batch, or on sequences
    drawn from the training stream."""
    seen = []
    out = str(tmp_path / "run")
    train.run(FIT_RUN + ["--steps", "30", "--fit-bar", "1.0", "--out", out],
              on_step=lambda step, x, positions: seen.extend(map(tuple, x.tolist())))
    fit = runs.read_fit(out)
    assert [step for step, _ in fit["checks"]] == [10, 20, 30] and fit["steps_to_fit"] is None
    model, cfg = eval.load_run(out)
    x, y, mask = train.tasks.make_batch("reverse", train.FIT_SAMPLES, 12, torch.Generator().manual_seed(train.FIT_SEED))
    with torch.no_grad():
        right = ((model(x).argmax(-1) == y) & mask).sum(1) / mask.sum(1)
    assert fit["checks"][-1][1] == round(float(right.mean()), 4)  # the final model, at step 30
    assert not set(map(tuple, x.tolist())) & set(seen)


def test_training_stops_at_the_first_check_that_reaches_the_bar(tmp_path):
    """Bugs caught: training on past the fit, the step recorded off by a check, a resumed fitted run training
    on, a randomized run checked with contiguous ids (it would not reach a bar it reaches in distribution)."""
    out = str(tmp_path / "run")
    train.run(FIT_RUN + ["--steps", "200", "--fit-bar", "0.05", "--out", out])
    fit = runs.read_fit(out)
    assert fit["steps_to_fit"] == 10 and fit["checks"] == [[10, fit["checks"][0][1]]]
    assert torch.load(os.path.join(out, "checkpoint.pt"))["step"] == 10
    train.run(["--resume", "--out", out, "--quiet"])
    assert torch.load(os.path.join(out, "checkpoint.pt"))["step"] == 10
    assert runs.read_fit(out)["steps_to_fit"] == 10


@pytest.mark.parametrize("positions, widest", [(["--max-position", "50"], 50), (["--curriculum", "16:64"], 64)])
def test_fit_check_of_a_randomized_run_uses_its_own_positions(tmp_path, monkeypatch, positions, widest):
    """The fit check draws the run's own kind of ids, from its widest range: --max-position's, or where its
    curriculum ends. Bug caught: a curriculum run checked at its narrowest range (#35, a one-token change)."""
    calls = []
    evaluate = eval.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: calls.append(k) or evaluate(*a, **k))
    train.run(FIT_RUN + ["--steps", "10", "--fit-bar", "1.0", "--positions", "randomized", *positions,
                         "--out", str(tmp_path / "run")])
    assert [(k["positions"], k["max_position"]) for k in calls] == [("randomized", widest)]


def test_fit_checks_fall_every_k_steps_and_at_the_last_and_the_bar_counts_when_reached(tmp_path, monkeypatch):
    """#35 (tests that catch): a check whose accuracy equals the bar has reached it (>=, not >); a run whose
    steps are not a multiple of --fit-every is checked at its last step too. Each was a one-token change no test
    caught."""
    seen = []
    monkeypatch.setattr(train, "fit_accuracy", lambda model, cfg: seen.append(cfg.steps) or 0.25)
    out = str(tmp_path / "exact")
    train.run(FIT_RUN + ["--steps", "30", "--fit-bar", "0.25", "--out", out])
    assert runs.read_fit(out)["steps_to_fit"] == 10 and len(seen) == 1
    out = str(tmp_path / "short")
    train.run(FIT_RUN + ["--steps", "25", "--fit-bar", "0.5", "--out", out])
    assert [step for step, _ in runs.read_fit(out)["checks"]] == [10, 20, 25]


def test_no_fit_stop_trains_every_step_and_judges_the_fit_by_the_last_check(tmp_path, monkeypatch):
    """--no-fit-stop (issue 51): an equal budget for every model compared. The run trains all --steps past a
    check at the bar, fit.json keeps when it first got there, and the fit is the last check's: a model that
    dropped below the bar by the end did not fit. Bugs caught: stopping at the bar anyway, steps_to_fit kept
    from an earlier check, first_fit overwritten, the checkpoint not at the last step."""
    accuracies = iter([0.5, 0.95, 0.97, 0.8])
    monkeypatch.setattr(train, "fit_accuracy", lambda model, cfg: next(accuracies))
    out = str(tmp_path / "run")
    train.run(FIT_RUN + ["--steps", "40", "--fit-bar", "0.9", "--no-fit-stop", "--out", out])
    fit = runs.read_fit(out)
    assert fit["checks"] == [[10, 0.5], [20, 0.95], [30, 0.97], [40, 0.8]] and fit["stop"] is False
    assert fit["steps_to_fit"] is None and fit["first_fit"] == 20  # not at the bar at the end: did not fit
    assert torch.load(os.path.join(out, "checkpoint.pt"))["step"] == 40


def test_fit_far_measures_out_of_range_at_every_check(tmp_path, monkeypatch):
    """--fit-far N: every fit check also measures the model beyond training, few sequences from the fit check's
    seed: a length task at N tokens, scored only from the training length on, with the run's own positions; a
    delay task at delay N in its window, a mixed_copy model on its C episodes alone. Bugs caught: the far
    check at the training length (in range), scoring answers training reached, a mixed model measured on S,
    the curve not recorded in fit.json or recorded at other steps than the in-range checks."""
    calls = []
    evaluate = eval.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: calls.append((a[1:5], k)) or evaluate(*a, **k))
    out = str(tmp_path / "length")
    train.run(FIT_RUN + ["--steps", "20", "--fit-bar", "1.0", "--fit-far", "48", "--positions", "randomized",
                         "--out", out])
    fit = runs.read_fit(out)
    assert fit["far"]["at"] == 48 and [s for s, _ in fit["far"]["checks"]] == [s for s, _ in fit["checks"]] == [10, 20]
    far = [(a, k) for a, k in calls if a[1] == 48]
    assert len(far) == 2 and all(a[3] == train.FAR_SAMPLES and k["score_from"] == 12 and
                                 k["seed"] == train.FIT_SEED and k["positions"] == "randomized" for a, k in far)
    model, cfg = eval.load_run(out)
    again = eval.evaluate(model, "reverse", 48, cfg.task_options, train.FAR_SAMPLES, seed=train.FIT_SEED,
                          positions="randomized", max_position=cfg.max_position, score_from=12)["accuracy"]
    assert fit["far"]["checks"][-1][1] == round(again, 4)  # the final model, at step 20
    calls.clear()
    train.run(["--task", "mixed_copy", "--symbols", "8", "--m", "2", "--delays", "2:3", "--selective-delays", "4:5",
               "--train-len", "24", "--steps", "10", "--fit-bar", "1.0", "--fit-every", "10", "--fit-far", "12",
               "--eval-samples", "0", "--quiet", "--threads", "1", "--out", str(tmp_path / "delay")])
    (task, length, options, _), _ = calls[0]
    assert (task, length, options["delays"], "selective_delays" in options) == ("delay_copy", 24, (12,), False)


@pytest.mark.parametrize("flags, message", [
    (["--fit-far", "48"], "--fit-far belongs to the fit check"), (["--no-fit-stop"], "--no-fit-stop belongs"),
    (["--fit-bar", "0.9", "--fit-far", "12"], "a length beyond the training length 12"),
    (["--fit-bar", "0.9", "--fit-far", "200", "--encoding", "learned"], "beyond the learned table's 96 rows")])
def test_fit_far_and_no_fit_stop_are_refused_where_they_would_mean_nothing(tmp_path, flags, message):
    """Refused before training, rather than ignored (no bar) or failing at the first check."""
    with pytest.raises(runs.UsageError, match=message):
        train.run([w for w in FIT_RUN if w not in ("--fit-every", "10")] + ["--steps", "10", *flags, "--out",
                                                                           str(tmp_path / "run")])


def test_randomized_evaluation_reads_the_same_sequences_at_drawn_positions(monkeypatch):
    """evaluate(positions="randomized") feeds sorted draws from [0, max_position) with the very sequences a
    contiguous evaluation reads. Bugs caught: position ids drawn from the data generator (other sequences),
    ids not passed to the model, a range shorter than the sequence accepted."""
    model = lengen.GPT(lengen.GPTConfig(vocab_size=10, layers=1, heads=1, dim=16))
    fed = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda x, positions=None: fed.append((x, positions)) or forward(x, positions))
    eval.evaluate(model, "reverse", 12, {}, samples=4)
    eval.evaluate(model, "reverse", 12, {}, samples=4, positions="randomized", max_position=40)
    (x0, p0), (x1, p1) = fed
    assert torch.equal(x0, x1) and p0 is None
    assert p1.shape == (4, 12) and bool((p1.diff(dim=1) > 0).all()) and int(p1.max()) < 40 and int(p1[:, -1].max()) > 11
    with pytest.raises(runs.UsageError, match="range of at least 12"):
        eval.evaluate(model, "reverse", 12, {}, samples=4, positions="randomized", max_position=8)


def test_score_from_counts_only_the_answers_at_or_beyond_that_index(monkeypatch):
    """Beyond a training length L, shift's answers at indices below L are ones training reached. Bugs caught:
    score_from ignored (the old positions' credit kept), or applied off by one, or a row left with nothing
    to score counted as 0 instead of refused."""
    model = lengen.GPT(lengen.GPTConfig(vocab_size=16, layers=1, heads=1, dim=16))

    def right_below(x, positions=None, L=8):  # the true answer at every index below L, a wrong one from L on
        y = torch.zeros_like(x)
        y[:, 3:] = x[:, :-3]
        logits = torch.nn.functional.one_hot(torch.where(torch.arange(x.shape[1]) < L, y, (y + 1) % 16), 16)
        return logits.float()
    monkeypatch.setattr(model, "forward", right_below)
    every = eval.evaluate(model, "shift", 16, {}, samples=4)["accuracy"]
    assert every == pytest.approx(5 / 13)  # answers at 3..15, right at 3..7
    assert eval.evaluate(model, "shift", 16, {}, samples=4, score_from=8)["accuracy"] == 0
    assert eval.evaluate(model, "shift", 16, {}, samples=4, score_from=7)["accuracy"] == pytest.approx(1 / 9)
    with pytest.raises(runs.UsageError, match="no answer at index >= 16"):
        eval.evaluate(model, "shift", 16, {}, samples=4, score_from=16)
