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
eval.py: spread and fmt (a statistic over seeds and how it is written); the verdict rule (verdict for a claim
made of sub-claims, unit_verdict for a gain over independent units with THRESHOLD, all_of for a claim that
needs several comparisons, and UNFIT, the verdict of a claim whose models did not learn their task); beyond
(the beyond-L mean); plot_curves with line_styles (one colour per method in every panel); write_results.
"""
