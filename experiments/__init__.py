"""The paper experiments, one file each, run by name: python eval.py --experiment NAME (bench: --bench).

    retrieval.py  Paper A: why RoPE extrapolates on fixed-offset retrieval and learned absolute positions do not
    distance.py   Paper D: distance generalization on delay copy and selective copy (NoPE, RoPE, ALiBi)
    encodings.py  every encoding on every algorithmic task, with and without randomized positions (Ruoss et al.,
                  Kazemnejad et al., FIRE, xPos)
    ryarn.py      Paper R: Randomized YaRN on the small GPT
    llm.py        Paper R on a real LLM (SmolLM2-135M-Instruct)
    bench.py      speed and memory
    gpu.py        the first minutes on a GPU: the CUDA tests, then fine-tuning and long-context speed

Each has one SCALES dict (quick, default, full) and one run(args), and reads top to bottom: the building
blocks with their formulas, the runs, the claims with their thresholds, the writers. What they share is in
common.py (statistics, the verdict rule, FIT_BAR, figures, the results writer, the job pool); what they measure
a run with is eval.py's (evaluate, evaluate_table, load_run); how they train one is train.py's (train.run).
"""
