"""lengen in one screen: train a small RoPE GPT on short sequences, then ask it for longer ones.

    python example.py          # about half a minute on a laptop CPU

Two models learn to copy 4..8 symbols (sequences of 8..16 tokens: the symbols, a separator, the copy). The
first sees positions 0, 1, ..., n-1, as a model usually does; at 32 tokens it meets rotary angles it never
trained on. The second sees randomized positions (Ruoss et al., arXiv 2305.16843): each training sequence gets
a sorted random subset of [0, 128), so every position up to 128 has been seen, and so have gaps of every size.
Both are then tested at 1x-8x the longest training length, each with the positions it trained with (the
randomized one with fresh draws from the same range). Nothing is written.
"""
import torch
import torch.nn.functional as F

import lengen
import tasks
from eval import evaluate

TASK, OPTIONS = "copy", {"symbols": 8}
SHORTEST, L, RANGE = 8, 16, 128     # train on 8..L tokens; positions drawn from [0, RANGE), RANGE = 8 L
STEPS, BATCH = 2500, 32


def train(positions: str, seed: int = 0) -> lengen.GPT:
    torch.manual_seed(seed)
    data, ids = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 2)
    config = lengen.GPTConfig(vocab_size=tasks.vocab_size(TASK, **OPTIONS), layers=2, heads=4, dim=64,
                              encoding="rope")
    model = lengen.GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(STEPS):
        length = int(torch.randint(SHORTEST, L + 1, (1,), generator=data))
        x, y, mask = tasks.make_batch(TASK, BATCH, length, data, **OPTIONS)       # (B, T) each
        pos = None if positions == "contiguous" else lengen.randomized_positions(BATCH, length, RANGE, ids)
        loss = F.cross_entropy(model(x, pos)[mask], y[mask])                    # only the answer tokens count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


if __name__ == "__main__":
    torch.set_num_threads(1)
    lengths = [L, 2 * L, 4 * L, 8 * L]
    print(f"{TASK}, trained on {SHORTEST}..{L} tokens for {STEPS} steps; accuracy per answer token, by length")
    print("positions    " + "".join(f"{n:>8}" for n in lengths))
    for positions in ("contiguous", "randomized"):
        model = train(positions)
        accuracy = [evaluate(model, TASK, n, OPTIONS, samples=128, positions=positions, max_position=RANGE)
                    ["accuracy"] for n in lengths]
        print(f"{positions:<13}" + "".join(f"{a:>8.2f}" for a in accuracy))
