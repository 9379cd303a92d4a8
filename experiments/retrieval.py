"""Paper A (arXiv 2607.18759, "Relative Positions Generalize, Absolute Positions Memorize"): why RoPE
extrapolates on fixed-offset retrieval and learned absolute positions do not.

    python eval.py --experiment retrieval      # results/retrieval.{md,json,png}

Read top to bottom: the analysis, as small functions tested on cases with known answers
(tests/test_retrieval.py); the setup (PRESETS) and the models, trained through train.run exactly as
`python train.py ...` would, with what is measured on each; the claims of the abstract, each with its threshold;
run(args), which returns the data that results/retrieval.json records.
The markdown, the figure and the README/docs table are written by experiments/retrieval_report.py.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
import time

import torch

import lengen
import tasks
from eval import evaluate, load_run
from experiments.common import ALIBI_SLOPE_HEADS, command_line, fmt, map_jobs, preset_name, spread, train_once
from experiments.stats import FIT_BAR, decide, verdict

# ---------------------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def equivariance_error(model: lengen.GPT, idx: torch.Tensor, shift: int) -> float:
    """max |logits(positions + shift) - logits(positions)| over a batch (claim 2). RoPE makes every logit a
    function of n - m alone (<R_m q, R_n k> = <q, R_(n-m) k>), so this is rounding; a learned table adds
    other vectors at the shifted positions."""
    positions = torch.arange(idx.shape[1])
    return float((model(idx, positions + shift) - model(idx, positions)).abs().max())


def argmax_histogram(weights: torch.Tensor) -> torch.Tensor:
    """How often each key position is the most attended one: attention rows (N, T) -> counts (T,)."""
    return torch.bincount(weights.argmax(-1), minlength=weights.shape[-1])


def pinned_slot(counts: torch.Tensor) -> tuple[int, float]:
    """The most frequent argmax position and the fraction of rows that attend to it (claim 3)."""
    slot = int(counts.argmax())
    return slot, float(counts[slot]) / float(counts.sum())


def positional_kernel(logits: torch.Tensor, first_query: int) -> torch.Tensor:
    """s(delta) = mean of logits[:, i, i - delta] over sequences and query rows i >= first_query, for
    delta = 0 .. T-1: (N, T, T) -> (T,). Averaging over random content leaves the part of the logit that
    depends on the offset alone; first_query = T - 1 keeps only the last row (the retrieval query)."""
    T = logits.shape[-1]
    kernel = []
    for delta in range(T):
        diagonal = logits.diagonal(offset=-delta, dim1=-2, dim2=-1)  # (N, T - delta): rows i = delta .. T-1
        kernel.append(diagonal[:, max(first_query - delta, 0):].mean())
    return torch.stack(kernel)


def rope_features(deltas: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """cos(theta_r delta) and sin(theta_r delta) for every plane r: (len,) -> (len, 2R), float64. A RoPE
    logit q . R_delta k is linear in these, with plane r weighted by its (q_r, k_r) pair."""
    phase = deltas.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None]
    return torch.cat((phase.cos(), phase.sin()), dim=1)


def fit_carrier(kernel: torch.Tensor, inv_freq: torch.Tensor, deltas: torch.Tensor | None = None,
                rcond: float | None = None) -> dict:
    """Least squares s(delta) ~ c + sum_r a_r cos(theta_r delta + phi_r) at the given offsets (default
    0 .. len-1): Paper A's carrier, a sum of the head's rotary planes. Written as
    c + sum_r alpha_r cos + beta_r sin, alpha = a cos(phi),
    beta = -a sin(phi). Planes slower than the window cannot be told apart and would trade huge, cancelling
    amplitudes: spread the offsets over the slowest wavelength, or give rcond (singular values below rcond x
    the largest are dropped, so those planes share what little they carry)."""
    s = kernel.to(torch.float64)
    deltas = torch.arange(len(s)) if deltas is None else deltas
    X = torch.cat((torch.ones(len(s), 1, dtype=torch.float64), rope_features(deltas, inv_freq)), dim=1)
    coef = torch.linalg.lstsq(X, s[:, None], rcond=rcond, driver="gelsd").solution[:, 0]
    R = len(inv_freq)
    alpha, beta = coef[1:R + 1], coef[R + 1:]
    fitted = X @ coef
    r2 = 1 - float(((s - fitted) ** 2).sum() / ((s - s.mean()) ** 2).sum().clamp(min=1e-30))
    return {"constant": float(coef[0]), "amplitude": torch.hypot(alpha, beta), "phase": torch.atan2(-beta, alpha),
            "fitted": fitted, "r2": r2}


def carrier_offsets(inv_freq: torch.Tensor, dense: int = 1024, spread_out: int = 7168) -> torch.Tensor:
    """Offsets at which to read a rotary head's kernel for fit_carrier: every offset below `dense`, then
    random ones up to four of the slowest wavelengths, so that every plane is told apart (random, not evenly
    spaced, so that no fast plane aliases)."""
    top = int(4 * 2 * math.pi / float(inv_freq.min()))
    far = torch.randint(dense, max(top, 2 * dense), (spread_out,), generator=torch.Generator().manual_seed(3))
    return torch.cat((torch.arange(dense), far))


def participation_ratio(amplitude: torch.Tensor) -> float:
    """(sum a)^2 / sum a^2: the number of planes that carry the kernel; R when all are equal, 1 for one."""
    return float(amplitude.sum() ** 2 / (amplitude ** 2).sum())


def carrier_alignment(amplitude: torch.Tensor, phase: torch.Tensor, inv_freq: torch.Tensor, k: int) -> float:
    """Amplitude-weighted mean of cos(phi_r + theta_r k): 1 when every plane peaks at delta = k
    (phi_r = -theta_r k), about 0 for random phases."""
    return float((amplitude * torch.cos(phase + inv_freq.to(phase.dtype) * k)).sum() / amplitude.sum())


def law1(n, margin: float):
    """Dilution, Law 1: one target with logit margin m over n - 1 equal distractors gets
    p(n) = 1 / (1 + (n - 1) e^-m)."""
    n = torch.as_tensor(n, dtype=torch.float64)
    return 1 / (1 + (n - 1) * math.exp(-margin))


def fit_law1_margin(lengths, target_mass) -> float:
    """m from measured p(n): Law 1 reads log((1 - p) / p) = log(n - 1) - m, so the least-squares m is the
    mean of log(n - 1) - log((1 - p) / p). Fit on training lengths only, then predict longer ones."""
    n = torch.as_tensor(lengths, dtype=torch.float64)
    p = torch.as_tensor(target_mass, dtype=torch.float64)
    return float((torch.log(n - 1) - torch.log((1 - p) / p)).mean())


def law2_accuracy(n: int, margin: float, symbols: int, samples: int = 20000, seed: int = 0) -> float:
    """Dilution, Law 2 (Monte Carlo): with one-hot values the output adds e^m for the target symbol y plus one
    for each of the n - 1 distractors, N ~ Multinomial(n - 1, 1/V); it is right when
    max_{c != y} N_c - N_y < e^m. Without loss of generality y = 0."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(symbols, (samples, n - 1), generator=generator)
    counts = torch.zeros(samples, symbols).scatter_add_(1, draws, torch.ones(samples, n - 1))
    return float(((counts[:, 1:].max(1).values - counts[:, 0]) < math.exp(margin)).double().mean())


def law3(kernel: torch.Tensor, k: int, n: int) -> float:
    """Dilution, Law 3: the measured kernel itself, p(n) = e^s(k) / sum_{delta < n} e^s(delta). No free
    parameter: side lobes at offsets never trained show up here, and are what Law 1 cannot see."""
    s = kernel[:n].to(torch.float64)
    return float(torch.exp(s[k] - torch.logsumexp(s, 0)))


def min_norm_interpolant(A: torch.Tensor, b: torch.Tensor, rcond: float | None = None) -> torch.Tensor:
    """The smallest-norm x with A x = b (A wide): lstsq's gelsd driver returns it, equal to pinv(A) b; the
    solution gradient descent from zero picks for a model linear in its parameters (Paper A, claim 6). With
    rcond, singular values below rcond x the largest are dropped (a truncated pinv), as in fit_carrier."""
    A, b = A.to(torch.float64), b.to(torch.float64)
    return torch.linalg.lstsq(A, b[:, None], rcond=rcond, driver="gelsd").solution[:, 0]


# ---------------------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------------------

# One attention-only head on 16 symbols (chance 1/16, so dilution shows by n = 240), trained on lengths
# k+2 .. 24 for each offset k, with AdamW and no weight decay; a learned table gets 1280 rows so that positions
# shifted by 1000 still exist (rows never trained stay as initialised, see train.py).
SYMBOLS, HEAD_DIM = 16, 64
RETRIEVAL_HEAD = ["--task", "retrieval", "--symbols", str(SYMBOLS), "--layers", "1", "--heads", "1", "--dim",
                  str(HEAD_DIM), "--no-mlp", "--lr", "1e-3"]
RETRIEVAL_TRANSFER = ["--task", "shift", "--symbols", str(SYMBOLS), "--layers", "2", "--heads", "4", "--dim",
                      str(HEAD_DIM), "--lr", "1e-3"]
RETRIEVAL_TABLE_ROWS = ["--max-len", "1280"]
RETRIEVAL_TRAIN_MAX = 24
# The linear-attention control learns the task far slower than a softmax head: at 1000 steps it stood at 0.69
# (0.63-0.76) where it trained, at offsets 3 and 5. Probes (`python train.py --task retrieval --symbols 16 --layers
# 1 --heads 1 --dim 64 --no-mlp --encoding rope --attention linear --offset K --train-len K+2:24 --fit-bar 0.99
# --fit-every 1000 ...`, accuracy on the held-out fit sequences): at offset 3, lr 1e-3, 0.91 and 0.92 after 8000
# steps (seeds 0, 1) and 0.92, 0.92, 0.90 after 12,000 (seeds 0-2); at offset 5 (seed 2) it stays at 0.74-0.76
# with lr 1e-3 (8000 steps), 3e-3 (16,000) and 1e-2 (8000). So the control runs at the first offset alone, as
# NoPE's and ALiBi's do, for `linear_steps`: at this size it reaches the fit bar at best by a hair.
PRESETS = {
    "quick": {"offsets": (3,), "seeds": (0,), "steps": 600, "linear_steps": 600, "controls": (), "shift_steps": 300,
              "sweep": 1, "samples": 128},  # sweep: how many of retrieval_sweep's recipes (None: all)
    "default": {"offsets": (3, 5), "seeds": (0, 1, 2), "steps": 1000, "linear_steps": 12000,
                "controls": ("nope", "alibi"), "shift_steps": 1000, "sweep": None, "samples": 256},
    "full": {"offsets": (3, 5, 8), "seeds": (0, 1, 2, 3, 4), "steps": 4000, "linear_steps": 24000,
             "controls": ("nope", "alibi"), "shift_steps": 5000, "sweep": None, "samples": 1024},
}


def retrieval_sweep(steps: int) -> list[tuple[str, list[str]]]:
    """Claim 8: one change at a time from the recipe above (offset 3, lengths 5..24). --wd decays every 2-D
    weight (q/k among them), as train.py's optimizer does."""
    return [("weight decay 0.1", ["--wd", "0.1"]),
            ("weight decay 1.0", ["--wd", "1.0"]),
            ("head dim 16", ["--dim", "16"]),
            ("rope base 100", ["--rope-base", "100"]),
            ("rope base 1e6", ["--rope-base", "1e6"]),
            ("lengths 5..48", ["--train-len", "5:48"]),
            (f"{3 * steps} steps", ["--steps", str(3 * steps)])]


def attention_logits(model: lengen.GPT, idx: torch.Tensor, positions: torch.Tensor | None = None) -> list:
    """Every layer's attention logits (B, H, T, T). The linear path returns none, but its scores q.k/sqrt(D)
    are exactly the logits a softmax GPT with the same weights computes before its softmax."""
    if model.config.attention == "linear":
        twin = lengen.GPT(dataclasses.replace(model.config, attention="softmax"))
        twin.load_state_dict(model.state_dict())
        model = twin.eval()
    with torch.no_grad():
        _, layers = model(idx, positions, return_attention=True)
    return [layer["logits"] for layer in layers]


def retrieval_kernel(model: lengen.GPT, length: int, symbols: int) -> torch.Tensor:
    """The content-averaged s(delta) of a one-layer retrieval head, delta = 0 .. length-1, exactly: its key at
    j sees token j alone, so a run of one repeated symbol c gives s(delta, c) at every delta, and the mean over
    the symbols is the mean over the task's uniform content. delta = 0 is the query token itself."""
    idx = torch.arange(symbols)[:, None].repeat(1, length)
    idx[:, -1] = symbols  # the query token
    return positional_kernel(attention_logits(model, idx)[0][:, 0], length - 1)


def probe_kernel(model: lengen.GPT, deltas: torch.Tensor, symbols: int) -> torch.Tensor:
    """The same content-averaged s(delta) of a one-layer retrieval head, at any offsets: the two tokens
    [c, query] at positions (0, delta) get the logit s(delta, c), and RoPE's equivariance makes that the
    logit at any two positions delta apart."""
    positions = torch.stack((torch.zeros_like(deltas), deltas), dim=1)  # (len, 2)
    per_symbol = []
    for c in range(symbols):
        idx = torch.tensor([c, symbols]).repeat(len(deltas), 1)
        per_symbol.append(attention_logits(model, idx, positions)[0][:, 0, 1, 0])
    return torch.stack(per_symbol).mean(0)


@torch.no_grad()
def query_attention(model: lengen.GPT, length: int, options: dict, samples: int) -> torch.Tensor:
    """The retrieval query's attention weights over fresh sequences: (samples, length)."""
    x, _, _ = tasks.make_batch("retrieval", samples, length, torch.Generator().manual_seed(99), **options)
    _, layers = model(x, return_attention=True)
    return layers[0]["weights"][:, 0, -1]


def analyse_retrieval(model: lengen.GPT, cfg: dict, lengths: list[int], samples: int) -> dict:
    """Claims 1-5 on one trained head: accuracy by length, equivariance, and, by encoding, pinning (learned)
    or the kernel, its carrier and the dilution laws (RoPE)."""
    options, hi = cfg.task_options, cfg.train_len[1]
    k, symbols = options["offset"], options["symbols"]
    idx, _, _ = tasks.make_batch("retrieval", 16, hi, torch.Generator().manual_seed(7), **options)
    out = {"accuracy": {n: evaluate(model, "retrieval", n, options, samples)["accuracy"] for n in lengths},
           "equivariance": {shift: equivariance_error(model, idx, shift) for shift in (100, 1000)}}
    if model.config.attention == "linear":
        return out
    if cfg.encoding == "learned":  # claim 3: where the query attends at lengths never trained
        out["pinning"] = {}
        for n in (n for n in lengths if n > hi):
            counts = argmax_histogram(query_attention(model, n, options, samples))
            slot, mass = pinned_slot(counts)
            out["pinning"][n] = {"slot": slot, "mass": mass, "counts": counts.tolist()}
    if cfg.encoding == "rope":  # claims 4 and 5
        kernel = retrieval_kernel(model, max(lengths), symbols)
        deltas = carrier_offsets(model.pos.inv_freq)
        carrier = fit_carrier(probe_kernel(model, deltas, symbols), model.pos.inv_freq, deltas)
        fit_lengths = sorted({max(k + 2, hi * f // 6) for f in range(2, 7)})  # training lengths only
        measured = {n: float(query_attention(model, n, options, samples)[:, n - 1 - k].mean())
                    for n in fit_lengths + [n for n in lengths if n > hi]}
        margin = fit_law1_margin(fit_lengths, [measured[n] for n in fit_lengths])
        out.update({
            "kernel": kernel.tolist(), "carrier_fit": carrier["fitted"][:len(kernel)].tolist(),
            "carrier_r2": carrier["r2"],
            "amplitude": carrier["amplitude"].tolist(), "phase": carrier["phase"].tolist(),
            "participation_ratio": participation_ratio(carrier["amplitude"]),
            "alignment": carrier_alignment(carrier["amplitude"], carrier["phase"], model.pos.inv_freq, k),
            "side_lobe": float(kernel[hi:].max() - kernel[k]),
            "target_mass": measured, "margin": margin,
            "law1": {n: float(law1(n, margin)) for n in measured},
            "law3": {n: law3(kernel, k, n) for n in measured},
            "law2": {n: law2_accuracy(n, margin, symbols) for n in lengths},
        })
    return out


def analyse_linear(model: lengen.GPT, cfg: dict, length: int) -> dict:
    """Claim 6: the linear head's kernel, scaled so that training offsets read 0 (mean of the distractors) and
    1 (the target), against the min-norm kernel over the RoPE features that is 1 at k and 0 at the other
    offsets 0 .. hi-1. So few offsets cannot tell the slow planes apart (singular values fall to 1e-16), so
    the exact interpolant has a norm of ~1e10; the verdict uses the pinv truncated at 1e-3, and the
    correlation at 1e-4 and 1e-2 shows how much it depends on that cut."""
    k, hi = cfg.task_options["offset"], cfg.train_len[1]
    kernel = retrieval_kernel(model, length, cfg.task_options["symbols"]).to(torch.float64)
    distractors = torch.cat((kernel[:k], kernel[k + 1:hi])).mean()
    learned = (kernel - distractors) / (kernel[k] - distractors)
    features = rope_features(torch.arange(length), model.pos.inv_freq)
    target = torch.zeros(hi, dtype=torch.float64)
    target[k] = 1.0
    min_norm = {rcond: features @ min_norm_interpolant(features[:hi], target, rcond) for rcond in (1e-4, 1e-3, 1e-2)}
    correlation = {rcond: float(torch.corrcoef(torch.stack((learned[hi:], kernel[hi:])))[0, 1])
                   for rcond, kernel in min_norm.items()}
    return {"learned_kernel": learned.tolist(), "min_norm_kernel": min_norm[1e-3].tolist(),
            "correlation_beyond": correlation[1e-3], "correlation_by_rcond": correlation,
            "rms_beyond": {"learned": float(learned[hi:].pow(2).mean().sqrt()),
                           "min_norm": float(min_norm[1e-3][hi:].pow(2).mean().sqrt())}}


@torch.no_grad()
def analyse_transfer(model: lengen.GPT, cfg: dict, samples: int) -> dict:
    """Claim 7 on the full-sequence shift task: accuracy by position inside and beyond the training range,
    equivariance, and the head that does the retrieval (most weight on offset k in range): its carrier
    (RoPE) or where it attends at positions beyond training (learned)."""
    options, hi = cfg.task_options, cfg.train_len[1]
    k, long = options["offset"], 10 * hi
    x, y, mask = tasks.make_batch("shift", samples, long, torch.Generator().manual_seed(5), **options)
    right = ((model(x).argmax(-1) == y) & mask).float().sum(0) / mask.sum(0).clamp(min=1)  # (T,)
    out = {"accuracy_in_range": float(right[k:hi].mean()), "accuracy_1x_2x": float(right[hi:2 * hi].mean()),
           "accuracy_2x_10x": float(right[2 * hi:].mean()), "accuracy_by_position": right.tolist(),
           "equivariance": {shift: equivariance_error(model, x[:16, :hi], shift) for shift in (100, 1000)}}
    layers = attention_logits(model, x[:32])
    on_target = torch.stack([logits.softmax(-1).diagonal(offset=-k, dim1=-2, dim2=-1)[..., :hi - k].mean((0, 2))
                             for logits in layers])  # (layer, head): mean weight on offset k, rows k .. hi-1
    layer, head = divmod(int(on_target.argmax()), on_target.shape[1])
    logits = layers[layer][:, head]
    out["retrieval_head"] = {"layer": layer, "head": head, "weight_on_target": float(on_target[layer, head])}
    if cfg.encoding == "rope":  # a layer-2 head reads mixed tokens: only a window fit, slow planes lumped
        carrier = fit_carrier(positional_kernel(logits, k), model.pos.inv_freq, rcond=1e-3)
        out.update({"participation_ratio": participation_ratio(carrier["amplitude"]),
                    "alignment": carrier_alignment(carrier["amplitude"], carrier["phase"], model.pos.inv_freq, k),
                    "carrier_r2": carrier["r2"]})
    else:
        slot, mass = pinned_slot(argmax_histogram(logits[:, 2 * hi:].reshape(-1, long)))
        out.update({"pinned_slot": slot, "pinned_mass": mass})
    return out


@torch.no_grad()
def analyse_recipe(model: lengen.GPT, cfg: dict, samples: int) -> dict:
    """Claim 8, one trained head: accuracy at 2x and 10x its longest training length, the highest side lobe
    of its kernel at offsets never trained (relative to the target peak), and its participation ratio."""
    options, hi = cfg.task_options, cfg.train_len[1]
    kernel = retrieval_kernel(model, 10 * hi, options["symbols"])
    deltas = carrier_offsets(model.pos.inv_freq)
    carrier = fit_carrier(probe_kernel(model, deltas, options["symbols"]), model.pos.inv_freq, deltas)
    return {"accuracy_2x": evaluate(model, "retrieval", 2 * hi, options, samples)["accuracy"],
            "accuracy_10x": evaluate(model, "retrieval", 10 * hi, options, samples)["accuracy"],
            "side_lobe": float(kernel[hi:].max() - kernel[options["offset"]]),
            "participation_ratio": participation_ratio(carrier["amplitude"])}


ANALYSES = {  # what the experiment measures on a trained model, by name
    "retrieval": lambda model, cfg, job: analyse_retrieval(model, cfg, job["lengths"], job["samples"]),
    "recipe": lambda model, cfg, job: analyse_recipe(model, cfg, job["samples"]),
    "linear": lambda model, cfg, job: analyse_linear(model, cfg, 10 * RETRIEVAL_TRAIN_MAX),
    "transfer": lambda model, cfg, job: analyse_transfer(model, cfg, job["samples"] // 4),
}


def fit_worker(job: dict) -> dict:
    """Train one model (runs/retrieval/PRESET/NAME) and run the analyses job["analyses"] on it, in that order;
    returns {analysis: result}. Module-level, so that a --jobs worker process can run it: every model is
    seeded by its own command line, so where it runs changes nothing."""
    out = run_dir(job["preset"], job["name"])
    print(f"[{time.time() - job['start']:5.0f} s] training {out}", file=sys.stderr, flush=True)
    train_once(model_argv(job["preset"], job["name"], job["argv"]) + ["--force", "--quiet", "--threads",
                                                                      str(job["threads"]), "--device", job["device"]])
    model, cfg = load_run(out)
    return {name: ANALYSES[name](model, cfg, job) for name in job["analyses"]}


def run_dir(preset: str, name: str) -> str:
    return os.path.join("runs", "retrieval", preset, name)


def model_argv(preset: str, name: str, argv: list[str]) -> list[str]:
    """train.py's argv for one model, with its folder: what results/retrieval.json records as its command (the
    run adds only --force, --quiet, --threads and --device, which change no number)."""
    return argv + ["--out", run_dir(preset, name), "--eval-samples", "64"]


def head_argv(encoding: str, k: int, seed: int, steps: int, *extra: str) -> list[str]:
    """train.py's flags for one retrieval head: offset k, lengths k+2..24."""
    return RETRIEVAL_HEAD + ["--encoding", encoding, "--offset", str(k), "--train-len",
                             f"{k + 2}:{RETRIEVAL_TRAIN_MAX}", "--steps", str(steps), "--seed", str(seed), *extra]


def planned_models(setup: dict) -> list[tuple]:
    """Every model, with where its results go: (part, its labels, name, train.py flags, analyses). They are
    independent: with --jobs N they train N at once."""
    k0, steps = setup["offsets"][0], setup["steps"]
    models = []
    for k in setup["offsets"]:
        for encoding in ("rope", "learned", *(setup["controls"] if k == k0 else ())):  # controls: one offset
            for seed in setup["seeds"]:
                extra = {"learned": RETRIEVAL_TABLE_ROWS,
                         "alibi": ["--alibi-slope-heads", str(ALIBI_SLOPE_HEADS)]}.get(encoding, [])
                # the sweep's baseline is this very recipe
                analyses = ["retrieval"] + (["recipe"] if encoding == "rope" and k == k0 else [])
                models.append(("runs", {"encoding": encoding, "attention": "softmax", "offset": k, "seed": seed},
                               f"{encoding}-k{k}-s{seed}", head_argv(encoding, k, seed, steps, *extra), analyses))
        for seed in setup["seeds"] if k == k0 else ():  # the linear control, like the others: one offset
            models.append(("runs", {"encoding": "rope", "attention": "linear", "offset": k, "seed": seed},
                           f"linear-k{k}-s{seed}",
                           head_argv("rope", k, seed, setup["linear_steps"], "--attention", "linear"),
                           ["retrieval", "linear"]))
    for encoding in ("rope", "learned"):
        for seed in setup["seeds"]:
            argv = RETRIEVAL_TRANSFER + ["--encoding", encoding, "--offset", str(k0), "--train-len",
                                         f"{k0 + 2}:{RETRIEVAL_TRAIN_MAX}", "--steps", str(setup["shift_steps"]),
                                         "--seed", str(seed)]
            if encoding == "learned":
                argv += RETRIEVAL_TABLE_ROWS
            models.append(("transfer", {"encoding": encoding, "seed": seed}, f"shift-{encoding}-s{seed}", argv,
                           ["transfer"]))
    for name, extra in retrieval_sweep(steps)[:setup["sweep"]]:
        for seed in setup["seeds"]:
            models.append(("sweep", name, f"sweep-{name.replace(' ', '-')}-s{seed}",
                           head_argv("rope", k0, seed, steps, *extra), ["recipe"]))
    return models


def collect(models: list[tuple], results: list[dict]) -> dict:
    """Each model's results where its part reads them: runs (the heads), transfer, and sweep by recipe (its
    baseline: the rope heads at the first offset)."""
    out = {"runs": [], "transfer": [], "sweep": {"baseline": []}}
    for (part, labels, _, _, _), result in zip(models, results, strict=True):
        if part == "runs":
            out["runs"].append({**labels, **result["retrieval"], **result.get("linear", {})})
            if "recipe" in result:
                out["sweep"]["baseline"].append(result["recipe"])
        elif part == "transfer":
            out["transfer"].append({**labels, **result["transfer"]})
        else:
            out["sweep"].setdefault(labels, []).append(result["recipe"])
    return out


# ---------------------------------------------------------------------------------------------------------
# The claims, each with its threshold. Spreads are mean [min, max] over every seed and offset.
# ---------------------------------------------------------------------------------------------------------


def pick(runs: list[dict], encoding: str, attention: str = "softmax") -> list[dict]:
    return [r for r in runs if r["encoding"] == encoding and r["attention"] == attention]


# A claim about what a trained head does beyond its training length rests on heads that learned the task:
# mean accuracy at the longest training length >= stats.FIT_BAR, or the claim is undecided (models did not fit).


def fitted(runs: list[dict], length: int) -> bool:
    return spread(r["accuracy"][length] for r in runs)["mean"] >= FIT_BAR


def claim_extrapolation(data: dict) -> dict:
    hi, runs = data["train_max"], data["runs"]
    two, ten = 2 * hi, 10 * hi
    rope, ape = pick(runs, "rope"), pick(runs, "learned")
    r2, a2 = spread(r["accuracy"][two] for r in rope), spread(r["accuracy"][two] for r in ape)
    r10, a10 = spread(r["accuracy"][ten] for r in rope), spread(r["accuracy"][ten] for r in ape)
    controls = "; ".join(f"{e} {fmt(spread(r['accuracy'][two] for r in pick(runs, e)))}" for e in data["controls"])
    in_range = f"RoPE {fmt(spread(r['accuracy'][hi] for r in rope))}, APE {fmt(spread(r['accuracy'][hi] for r in ape))}"
    return {
        "claim": "1. RoPE extrapolates on fixed-offset retrieval, learned absolute (APE) does not",
        "prediction": "RoPE ~1.00, APE ~chance (0.07) at 2x the training length",
        "measured": f"at {hi} (trained): {in_range}; at {two}: RoPE {fmt(r2)}, APE {fmt(a2)}; at {ten}: RoPE "
                    f"{fmt(r10)}, APE {fmt(a10)}"
                    + (f"; controls (k = {data['offsets'][0]}) at {two}: {controls}" if controls else ""),
        "threshold": f"both fit (mean >= {FIT_BAR} at {hi}); RoPE mean >= 0.95 and APE mean <= 0.2 at {two} "
                     "(partly: RoPE - APE > 0.5)",
        "verdict": verdict(r2["mean"] >= 0.95 and a2["mean"] <= 0.2, r2["mean"] - a2["mean"] > 0.5,
                           fitted(rope, hi) and fitted(ape, hi))}


def claim_equivariance(data: dict) -> dict:
    req = spread(max(r["equivariance"].values()) for r in pick(data["runs"], "rope"))
    aeq = spread(max(r["equivariance"].values()) for r in pick(data["runs"], "learned"))
    return {
        "claim": "2. Exact equivariance: shifting every position id leaves RoPE's logits unchanged",
        "prediction": "largest change of any logit = 0 (rounding) for RoPE, large for APE",
        "measured": f"shifts 100 and 1000, worst of the two: RoPE {fmt(req, '.1e')}, APE {fmt(aeq, '.1e')}",
        "threshold": "RoPE max < 1e-4 and APE min > 1e-2",
        "verdict": verdict(req["max"] < 1e-4 and aeq["min"] > 1e-2, req["max"] < 1e-4)}


def claim_pinning(data: dict) -> dict:
    hi = data["train_max"]
    pins = [p for r in pick(data["runs"], "learned") for p in r["pinning"].values()]
    mass = spread(p["mass"] for p in pins)
    slots = sorted({p["slot"] for p in pins})
    inside = all(s < hi for s in slots)
    return {
        "claim": "3. Pinning: the APE head attends to one fixed absolute position inside the training range",
        "prediction": "one slot takes most argmax hits at every unseen length, and it lies below the training length",
        "measured": f"mass on the most frequent slot at lengths {2 * hi}..{10 * hi}: {fmt(mass)}; slots {slots} "
                    f"(training positions 0..{hi - 1})",
        "threshold": "mass min >= 0.5 and every slot < the training length (partly: one of the two)",
        "verdict": verdict(mass["min"] >= 0.5 and inside, mass["mean"] >= 0.5 or inside,
                           fitted(pick(data["runs"], "learned"), hi))}


def claim_carrier(data: dict) -> dict:
    rope, planes = pick(data["runs"], "rope"), data["rope_planes"]
    pr, align = spread(r["participation_ratio"] for r in rope), spread(r["alignment"] for r in rope)
    fit = spread(r["carrier_r2"] for r in rope)
    return {
        "claim": "4. Carrier: the learned RoPE rule is a low-rank kernel aligned with the offset k",
        "prediction": "participation ratio << d/2 planes; every dominant plane peaks at delta = k",
        "measured": f"participation ratio {fmt(pr, '.1f')} of {planes} planes; alignment {fmt(align)}; "
                    f"fit R^2 {fmt(fit, '.3f')}",
        "threshold": f"PR max < {planes // 4} and alignment min >= 0.8 (partly: one of the two)",
        "verdict": verdict(pr["max"] < planes // 4 and align["min"] >= 0.8,
                           pr["max"] < planes // 4 or align["min"] >= 0.8, fitted(rope, data["train_max"]))}


def claim_dilution(data: dict) -> dict:
    rope, four, ten = pick(data["runs"], "rope"), 4 * data["train_max"], 10 * data["train_max"]

    def error(law, n, truth):  # |predicted - measured| over the RoPE heads
        return spread(abs(r[law][n] - r[truth][n]) for r in rope)

    l1 = {n: error("law1", n, "target_mass") for n in (four, ten)}
    l3 = {n: error("law3", n, "target_mass") for n in (four, ten)}
    l2 = {n: error("law2", n, "accuracy") for n in (four, ten)}
    law3_ok = all(e["mean"] <= 0.1 for e in l3.values())
    law2_ok = all(e["mean"] <= 0.1 for e in l2.values())
    return {
        "claim": "5. Dilution: accuracy decays gracefully as softmax mass spreads over distractors",
        "prediction": "target mass follows Law 1 (m fitted on training lengths) / Law 3 (measured kernel); "
                      "accuracy follows Law 2",
        "measured": "absolute error at {0} / {1}: Law 1 mass {2} / {3}; Law 3 mass {4} / {5}; Law 2 accuracy {6} / {7}"
                    .format(four, ten, fmt(l1[four]), fmt(l1[ten]), fmt(l3[four]), fmt(l3[ten]),
                            fmt(l2[four]), fmt(l2[ten])),
        "threshold": "mean absolute error <= 0.1 at both lengths for Law 3 and Law 2 (partly: one of them)",
        "verdict": verdict(law3_ok and law2_ok, law3_ok or law2_ok, fitted(rope, data["train_max"]))}


def claim_linear(data: dict) -> dict:
    hi, linear = data["train_max"], pick(data["runs"], "rope", "linear")
    four, ten = 4 * hi, 10 * hi
    inr, beyond = spread(r["accuracy"][hi] for r in linear), spread(r["accuracy"][four] for r in linear)
    corr = spread(r["correlation_beyond"] for r in linear)
    other_cuts = ", ".join(f"{fmt(spread(r['correlation_by_rcond'][rcond] for r in linear))} at cut {rcond:.0e}"
                           for rcond in (1e-4, 1e-2))
    fails = beyond["mean"] <= 0.3
    return {
        "claim": "6. Linear-attention control: without softmax, training picks the min-norm interpolant, "
                 "which does not extrapolate",
        "prediction": "fits in range, fails beyond; kernel beyond range = min-norm interpolant's",
        "measured": f"accuracy at {hi}: {fmt(inr)}, at {four}: {fmt(beyond)}; correlation with the min-norm "
                    f"kernel (pinv cut 1e-3) at offsets {hi}..{ten - 1}: {fmt(corr)} ({other_cuts})",
        "threshold": f"fits (mean >= {FIT_BAR} at {hi}); <= 0.3 at {four}, correlation mean >= 0.5 (partly: "
                     "fails beyond)",
        "verdict": verdict(fails and corr["mean"] >= 0.5, fails, fitted(linear, hi))}


def claim_transfer(data: dict) -> dict:
    hi = data["train_max"]
    t_rope = [t for t in data["transfer"] if t["encoding"] == "rope"]
    t_ape = [t for t in data["transfer"] if t["encoding"] == "learned"]
    tr, ta = spread(t["accuracy_2x_10x"] for t in t_rope), spread(t["accuracy_2x_10x"] for t in t_ape)
    teq = spread(max(t["equivariance"].values()) for t in t_rope)
    talign, tpr = spread(t["alignment"] for t in t_rope), spread(t["participation_ratio"] for t in t_rope)
    tpin = spread(t["pinned_mass"] for t in t_ape)
    inr = {name: spread(t["accuracy_in_range"] for t in ts) for name, ts in (("RoPE", t_rope), ("APE", t_ape))}
    return {
        "claim": "7. Transfer to a 2-layer, 4-head transformer with MLP on the full-sequence shift task",
        "prediction": "RoPE right beyond training, APE not; equivariance; an aligned carrier; APE pinning",
        "measured": f"accuracy at positions {data['offsets'][0]}..{hi - 1} (trained): RoPE {fmt(inr['RoPE'])}, APE "
                    f"{fmt(inr['APE'])}; at {2 * hi}..{10 * hi - 1}: RoPE {fmt(tr)}, APE {fmt(ta)}; RoPE "
                    f"equivariance {fmt(teq, '.1e')}; retrieval head alignment {fmt(talign)}, PR {fmt(tpr, '.1f')}; "
                    f"APE pinned mass {fmt(tpin)}",
        "threshold": f"both fit (mean >= {FIT_BAR} in range); RoPE >= 0.9 and APE <= 0.3 beyond, equivariance "
                     "< 1e-4, alignment min >= 0.8, pinned mass >= 0.5 (partly: RoPE - APE > 0.5 beyond)",
        "verdict": verdict(tr["mean"] >= 0.9 and ta["mean"] <= 0.3 and teq["max"] < 1e-4
                           and talign["min"] >= 0.8 and tpin["mean"] >= 0.5, tr["mean"] - ta["mean"] > 0.5,
                           all(s["mean"] >= FIT_BAR for s in inr.values()))}


def sweep_summary(sweep: dict) -> dict:
    """Claim 8's recipes: every number analyse_recipe measured, as a spread over seeds."""
    return {name: {key: spread(r[key] for r in rows) for key in rows[0]} for name, rows in sweep.items()}


# Claim 8 is lengen's own: regularizing the RoPE head (weight decay) makes it hold further out. Measured per seed
# against the baseline recipe at 10x, the mean over the two weight decays (never the better one picked after),
# beside a control that is no regularizer: the two rope bases, likewise. Its size: 0.1 at 10x, fixed with the claim.
REGULARIZERS, CONTROLS_8 = ("weight decay 0.1", "weight decay 1.0"), ("rope base 100", "rope base 1e6")
CLAIM_8_SIZE = 0.1


def gain_at_10x(summary: dict, recipes: tuple[str, ...]) -> list[float]:
    """Per seed: the mean over `recipes` of accuracy at 10x, minus the baseline's on the same seed."""
    base = summary["baseline"]["accuracy_10x"]["values"]
    return [sum(summary[r]["accuracy_10x"]["values"][i] for r in recipes) / len(recipes) - b
            for i, b in enumerate(base)]


def claim_regularization(data: dict) -> dict:
    summary = data["sweep_summary"]
    clean = [name for name, s in summary.items() if s["accuracy_2x"]["min"] >= 0.95]
    if not all(r in summary for r in REGULARIZERS + CONTROLS_8):  # a preset that sweeps fewer recipes
        return {"claim": "8. Regularization makes the RoPE head extrapolate cleanly",
                "prediction": "weight decay beats the baseline recipe at 10x on every seed",
                "measured": f"recipes swept: {', '.join(summary)}", "threshold": "-",
                "verdict": "undecided (this preset sweeps too few recipes)"}
    decided = decide({"weight decay - baseline": gain_at_10x(summary, REGULARIZERS),
                      "rope base (not a regularizer) - baseline": gain_at_10x(summary, CONTROLS_8)}, CLAIM_8_SIZE)
    wd, control = decided.values()
    return {
        "claim": "8. Regularization makes the RoPE head extrapolate cleanly",
        "prediction": "weight decay beats the baseline recipe at 10x by >= 0.1 per seed, while a change that is "
                      "no regularizer (the rope base) does not",
        "measured": f"per seed at 10x, weight decay (mean of 0.1 and 1.0) - baseline: "
                    f"{', '.join(f'{g:+.2f}' for g in wd['per_unit'])}, {wd['mean']:+.3f} [{wd['low']:+.3f}, "
                    f"{wd['high']:+.3f}]: {wd['verdict']}; the control, rope base 100 and 1e6 - baseline: "
                    f"{', '.join(f'{g:+.2f}' for g in control['per_unit'])}, {control['verdict']}. >= 0.95 at 2x "
                    f"on every seed: {', '.join(clean) or 'none'} (every recipe: table below)",
        "threshold": f"weight decay - baseline reproduced at size {CLAIM_8_SIZE} (the shared rule, seeds as units, a "
                     "family of the two rows)",
        "comparisons": decided,
        "verdict": wd["verdict"]}


CLAIMS = (claim_extrapolation, claim_equivariance, claim_pinning, claim_carrier, claim_dilution, claim_linear,
          claim_transfer, claim_regularization)  # Paper A's abstract, claims 1-7, and lengen's claim 8


def claims(data: dict) -> list[dict]:
    """Each claim: prediction, measurement, threshold, verdict. Reads data["sweep_summary"] for claim 8."""
    return [claim(data) for claim in CLAIMS]


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    """Paper A, claims 1-7 of its abstract plus lengen's regularization sweep (claim 8): every model trained and
    measured, and the claims decided; the data that results/retrieval.json records."""
    preset = preset_name(args)
    setup, hi = PRESETS[preset], RETRIEVAL_TRAIN_MAX
    threads = args.threads or 1
    start = time.perf_counter()
    common = {"preset": preset, "threads": threads, "device": args.device, "samples": setup["samples"],
              "lengths": [hi, 2 * hi, 4 * hi, 6 * hi, 8 * hi, 10 * hi], "start": time.time()}
    models = planned_models(setup)
    results = map_jobs(fit_worker, [{**common, "name": name, "argv": argv, "analyses": analyses}
                                    for _, _, name, argv, analyses in models], args.jobs, threads)
    data = {"command": command_line(args),
            "scale": preset, "threads": threads, "symbols": SYMBOLS, "offsets": setup["offsets"],
            "seeds": setup["seeds"], "steps": setup["steps"], "linear_steps": setup["linear_steps"], "train_max": hi,
            "controls": setup["controls"], "alibi_slope_heads": ALIBI_SLOPE_HEADS,
            "rope_planes": HEAD_DIM // 2, **collect(models, results)}
    data["commands"] = {name: "python train.py " + shlex.join(model_argv(preset, name, argv))
                        for _, _, name, argv, _ in models}
    data["sweep_summary"] = sweep_summary(data["sweep"])
    data["claims"] = claims(data)
    data["runtime_s"] = time.perf_counter() - start
    return data
