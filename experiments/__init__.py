"""The paper experiments, a study and its report each, run by name: python eval.py --experiment NAME (bench: --bench).

    retrieval.py  Paper A: why RoPE extrapolates on fixed-offset retrieval and learned absolute positions do not
    distance.py   Paper D: distance generalization on delay copy and selective copy (NoPE, RoPE, ALiBi)
    encodings.py  every encoding on every algorithmic task, with and without randomized positions (Ruoss et al.,
                  Kazemnejad et al., FIRE, xPos)
    ryarn.py      Paper R: Randomized YaRN on the small GPT
    llm.py        Paper R on a real LLM (SmolLM2-135M-Instruct)
    bench.py      speed and memory
    gpu.py        the first minutes on a GPU: the CUDA tests, then fine-tuning and long-context speed

Each experiment is two files. experiments/NAME.py is its study, read top to bottom: its PRESETS (quick,
default, full; probe where it has one), the recipes of the models it trains, what it measures and the claims it
decides; run(args) returns the data and writes nothing. experiments/NAME_report.py writes it: results/NAME.md,
the figure, the tables README.md and docs/ render, and decide_again for --render. common.py runs them (eval.py
--experiment NAME lands in its run_experiment) and holds what they share; stats.py holds the verdict rule;
what they measure a run with is eval.py's (evaluate, evaluate_table, load_run); how they train one is
train.py's (train.run).
"""
