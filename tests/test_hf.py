"""The Hugging Face bridge on a tiny random Llama (skipped when transformers is not installed)."""
import pytest
import torch

import lengen as L

transformers = pytest.importorskip("transformers")


def tiny_llama(rope_parameters, max_position_embeddings=256):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, rope_parameters=rope_parameters)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_importing_the_core_does_not_import_transformers():
    """Bug caught: a top-level `import hf` (or transformers) in lengen, tasks, train or eval, which would make
    the small-GPT path need the LLM requirements. hf.load_llm itself must import it, or this test proves nothing."""
    import subprocess
    import sys
    code = "import sys, lengen, tasks, train, eval; print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    code = ("import os, sys, tempfile, hf\nfolder = tempfile.mkdtemp()\n"
            "open(os.path.join(folder, 'config.json'), 'w').write('{}')\n"  # a folder that looks like a model
            "open(os.path.join(folder, 'tokenizer.json'), 'w').write('{}')\n"
            "try:\n    hf.load_llm(folder)\nexcept hf.UsageError:\n    print('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def test_patched_default_model_equals_hf_yarn():
    base, factor, original = 10000.0, 4.0, 64
    ours = tiny_llama({"rope_type": "default", "rope_theta": base}, max_position_embeddings=original)
    theirs = tiny_llama({"rope_type": "yarn", "rope_theta": base, "factor": factor,
                         "original_max_position_embeddings": original},
                        max_position_embeddings=int(factor * original))
    theirs.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    pos = L.randomized_positions(2, 24, int(factor * original), torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = ours(ids, position_ids=pos).logits
        patched = L.patch_hf_rope(ours, *L.yarn_frequencies(16, base, factor, original))
        mine, reference = ours(ids, position_ids=pos).logits, theirs(ids, position_ids=pos).logits
    assert patched >= 1
    assert torch.allclose(mine, reference, atol=1e-5)
    assert not torch.allclose(before, reference, atol=1e-3)  # the patch is what made them equal


def test_patch_with_plain_rope_changes_nothing():
    model = tiny_llama({"rope_type": "default", "rope_theta": 10000.0})
    ids = torch.randint(0, 64, (1, 32))
    with torch.no_grad():
        before = model(ids).logits
        L.patch_hf_rope(model, *L.rope_frequencies(16, 10000.0))
        assert torch.allclose(model(ids, position_ids=torch.arange(32)[None]).logits, before, atol=1e-6)


def test_patch_refuses_wrong_size_and_models_without_rope():
    model = tiny_llama({"rope_type": "default", "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="head dim"):
        L.patch_hf_rope(model, *L.rope_frequencies(32, 10000.0))
    with pytest.raises(ValueError, match="no rotary module"):
        L.patch_hf_rope(torch.nn.Linear(2, 2), *L.rope_frequencies(16, 10000.0))


def test_requirements_allow_only_the_transformers_the_tests_run_on():
    """Bug caught: requirements-llm.txt allowing a transformers major version the tests never run on (4.x keeps
    rope settings in rope_scaling, and every config here is built with v5's rope_parameters)."""
    import os
    from packaging.version import Version
    requirements = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements-llm.txt")
    line = next(line for line in open(requirements) if line.startswith("transformers"))
    floor = Version(line.split(">=")[1].split()[0])  # "transformers>=5.0  # ..." -> 5.0
    installed = Version(transformers.__version__)
    assert floor >= Version("5.0") and installed >= floor
