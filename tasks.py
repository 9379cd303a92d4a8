"""
Synthetic tasks for the small GPT: each one makes a batch of token sequences from a torch.Generator.

Every task is a plain function

    fn(batch, length, generator, **options) -> (x, y, mask)

with x and y LongTensors of shape (batch, length) and mask a BoolTensor of the same shape. The model reads
x and is trained to predict y[b, t] at position t; loss and accuracy are taken only where mask is True, and
y is 0 wherever mask is False. `length` is always the number of tokens the model sees. All randomness comes
from `generator`, so a generator seeded the same way gives the same batch. Batches are made on the CPU.

The tasks, in reading order:
- retrieval, shift: fixed-offset retrieval (Paper A), with one query at the end or a target at every position.
- copy, reverse, duplicate, associative_recall: algorithmic tasks in the style of Ruoss et al. (2305.16843),
  where randomized positions are known to help length generalization; algorithmic_mix, rows of copy, reverse
  and shift mixed (the pretraining of the ryarn experiment's bases).
- latest_recall: facts stated and restated among filler, the answer found by content and order (the kind of
  question BABILong and MRCR ask, on which Paper R, 2606.23687, measures Randomized YaRN).
- multi_hop: chains of facts to follow hop by hop, each hop at a fixed distance whatever the length (the
  kind of question that Paper R says inference-time scaling alone does not answer).
- delay_copy, selective_copy, mixed_copy: the R/C/S token stream of Paper D (2609.11913), where a model
  must reproduce tokens it saw d steps earlier.

A registry (TASKS) maps each name to its function, its vocabulary size and a one-line doc; make_batch(name,
...) is what train.py and eval.py call.

The long-context text tasks for an LLM (passkey, BABILong-style fact chaining, MRCR-style multi-round
coreference) are in text_tasks.py.
"""

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

# -----------------------------------------------------------------------------
# fixed-offset retrieval (Paper A)


def retrieval(batch, length, generator, symbols=16, offset=3):
    """
    Random symbols, then a query token; the answer is the symbol `offset` places before the query.

    Tokens: symbols 0..symbols-1, query = symbols. Only the last position is predicted.
    Example, symbols=16, offset=3, length=8 (query at index 7, answer at index 7-3=4):
        x    = [ 7,  2, 11,  5, 13, 14,  9, 16]
        y    = [ 0,  0,  0,  0,  0,  0,  0, 13]
        mask = [ F,  F,  F,  F,  F,  F,  F,  T]
    """
    if not 1 <= offset < length:
        raise ValueError(f"retrieval needs 1 <= offset < length, got offset={offset}, length={length}")
    x = torch.randint(symbols, (batch, length), generator=generator)
    x[:, -1] = symbols  # the query token
    y = torch.zeros_like(x)
    y[:, -1] = x[:, length - 1 - offset]
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return x, y, mask


def shift(batch, length, generator, symbols=16, offset=3):
    """
    Full-sequence retrieval: at every position t >= offset, predict the symbol offset places back.

    Tokens: symbols 0..symbols-1. Paper A's claim 7 uses this to carry the one-query result over to a
    multi-layer model that gets a training signal at every position.
    Example, symbols=16, offset=3, length=6:
        x    = [ 7,  2, 11,  5, 13, 14]
        y    = [ 0,  0,  0,  7,  2, 11]
        mask = [ F,  F,  F,  T,  T,  T]
    """
    if not 1 <= offset < length:
        raise ValueError(f"shift needs 1 <= offset < length, got offset={offset}, length={length}")
    x = torch.randint(symbols, (batch, length), generator=generator)
    y = torch.zeros_like(x)
    y[:, offset:] = x[:, :-offset]
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, offset:] = True
    return x, y, mask


# -----------------------------------------------------------------------------
# algorithmic tasks (Ruoss et al.), decoder-only


def _answer_task(batch, length, generator, symbols, name, answer_of, answer_factor):
    """
    Shared layout of copy, reverse and duplicate. One sequence of length+1 tokens per row,

        [PAD]*p, n symbols, SEP, the answer (answer_factor * n tokens)

    with x = sequence[:-1] and y = sequence[1:] (next-token prediction, teacher forcing). The last answer
    token appears only in y: the model never reads past what it must predict, so no end token is needed.
    n is the largest that fits; the p = length - (answer_factor + 1) * n leading slots are padding.
    """
    n = length // (answer_factor + 1)
    if n < 1:
        raise ValueError(f"{name} needs length >= {answer_factor + 1} to hold one symbol, got length={length}")
    sep, pad = symbols, symbols + 1
    pads = length - (answer_factor + 1) * n
    source = torch.randint(symbols, (batch, n), generator=generator)
    sequence = torch.cat([
        torch.full((batch, pads), pad),
        source,
        torch.full((batch, 1), sep),
        answer_of(source),
    ], dim=1)  # (B, length + 1)
    x = sequence[:, :-1]
    # y[t] = sequence[t + 1] is an answer token exactly when t + 1 > pads + n (past the separator)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, pads + n:] = True
    y = torch.where(mask, sequence[:, 1:], 0)
    return x, y, mask


def copy(batch, length, generator, symbols=8):
    """
    Read n symbols and a separator, then write the same n symbols.

    Tokens: symbols 0..symbols-1, SEP = symbols, PAD = symbols+1. n = length // 2.
    Example, symbols=8, length=7 (n=3; the sequence is [9, 5,1,6, 8, 5,1,6], x and y are it shifted by one):
        x    = [ 9,  5,  1,  6,  8,  5,  1]
        y    = [ 0,  0,  0,  0,  5,  1,  6]
        mask = [ F,  F,  F,  F,  T,  T,  T]
    """
    return _answer_task(batch, length, generator, symbols, "copy", lambda s: s, 1)


def reverse(batch, length, generator, symbols=8):
    """
    Read n symbols and a separator, then write them in reverse order.

    Tokens: symbols 0..symbols-1, SEP = symbols, PAD = symbols+1. n = length // 2.
    Example, symbols=8, length=7 (n=3; the sequence is [9, 5,1,6, 8, 6,1,5]):
        x    = [ 9,  5,  1,  6,  8,  6,  1]
        y    = [ 0,  0,  0,  0,  6,  1,  5]
        mask = [ F,  F,  F,  F,  T,  T,  T]
    """
    return _answer_task(batch, length, generator, symbols, "reverse", lambda s: s.flip(1), 1)


def duplicate(batch, length, generator, symbols=8):
    """
    Read n symbols and a separator, then write them twice.

    Tokens: symbols 0..symbols-1, SEP = symbols, PAD = symbols+1. n = length // 3.
    Example, symbols=8, length=7 (n=2; the sequence is [9, 5,1, 8, 5,1,5,1]):
        x    = [ 9,  5,  1,  8,  5,  1,  5]
        y    = [ 0,  0,  0,  5,  1,  5,  1]
        mask = [ F,  F,  F,  T,  T,  T,  T]
    """
    return _answer_task(batch, length, generator, symbols, "duplicate", lambda s: torch.cat([s, s], 1), 2)


def algorithmic_mix(batch, length, generator, symbols=23, offset=3):
    """
    A mixture of three rows, each drawn with probability 1/3: copy, reverse (layout as above: PAD..., n symbols,
    SEP, the answer) and shift (predict the symbol `offset` back at every position t >= offset).

    A pretraining task for the ryarn experiment: the bases learn to read and write sequences by position at a
    long context, over the same token ids as its targets (symbols 23: SEP = 23, PAD = 24, 25 ids, as many as
    latest_recall with 8 keys, values and fillers, or multi_hop with 16 keys and 8 fillers) but never their
    task: no row asks a question, and the targets' QUERY (id 24 there, PAD here) is never followed by an answer.
    Tokens: symbols 0..symbols-1, SEP = symbols, PAD = symbols+1.
    Example, symbols=8, offset=3, length=7, rows copy, reverse, shift (the first two as in copy's and
    reverse's examples):
        x    = [[ 9,  5,  1,  6,  8,  5,  1], [ 9,  5,  1,  6,  8,  6,  1], [ 7,  2,  1,  5,  3,  4,  0]]
        y    = [[ 0,  0,  0,  0,  5,  1,  6], [ 0,  0,  0,  0,  6,  1,  5], [ 0,  0,  0,  7,  2,  1,  5]]
        mask = [[ F,  F,  F,  F,  T,  T,  T], [ F,  F,  F,  F,  T,  T,  T], [ F,  F,  F,  T,  T,  T,  T]]
    """
    kind = torch.randint(3, (batch, 1), generator=generator)  # 0 copy, 1 reverse, 2 shift
    made = [copy(batch, length, generator, symbols), reverse(batch, length, generator, symbols),
            shift(batch, length, generator, symbols, offset)]
    return tuple(torch.where(kind == 0, c, torch.where(kind == 1, r, s)) for c, r, s in zip(*made))


def associative_recall(batch, length, generator, keys=16, values=16):
    """
    Key-value pairs k v k v ..., then one of the row's keys as a query; the answer is its value.

    Tokens: keys 0..keys-1, values keys..keys+values-1, PAD = keys+values. Keys are distinct within a row,
    so the answer is unique. n = min((length-1) // 2, keys) pairs; unused leading slots are padding.
    Example, keys=4, values=4, length=8 (n=3 pairs 2->5, 0->7, 3->4; the query is key 0):
        x    = [ 8,  2,  5,  0,  7,  3,  4,  0]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  7]
        mask = [ F,  F,  F,  F,  F,  F,  F,  T]
    """
    n = min((length - 1) // 2, keys)
    if n < 1:
        raise ValueError(f"associative_recall needs length >= 3 for one pair and a query, got length={length}")
    pads = length - 1 - 2 * n
    # n distinct keys per row: the first n entries of a random permutation of all keys
    row_keys = torch.rand(batch, keys, generator=generator).argsort(dim=1)[:, :n]  # (B, n)
    row_values = torch.randint(keys, keys + values, (batch, n), generator=generator)  # (B, n)
    which = torch.randint(n, (batch, 1), generator=generator)  # index of the queried pair
    pairs = torch.stack([row_keys, row_values], dim=2).view(batch, 2 * n)  # k v k v ...
    x = torch.cat([
        torch.full((batch, pads), keys + values),
        pairs,
        row_keys.gather(1, which),
    ], dim=1)
    y = torch.zeros_like(x)
    y[:, -1:] = row_values.gather(1, which)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return x, y, mask


def latest_recall(batch, length, generator, keys=8, values=8, statements=4, fillers=8):
    """
    Facts "key = value" stated and restated among filler, then a key as a query: answer with its latest value.

    The answer is found by content and order, as in BABILong or MRCR, not at a fixed position: the queried key
    is stated at least twice, with different values, and the facts sit at random places in the filler. So
    where a fact is tells nothing; only which statement of the key comes last does.
    Tokens: fillers 0..F-1, keys F..F+K-1, values F+K..F+K+V-1, QUERY = F+K+V. The first length-2 tokens are
    filler with `statements` two-token facts (key, value) in random non-overlapping cells; then QUERY and the key.
    Example, keys=2, values=4, statements=3, fillers=2, length=12 (keys 2, 3; values 4..7; QUERY 8; the facts are
    3=6, 2=5, 3=4, at cells 1, 2, 4; the query is key 3, stated last with value 4):
        x    = [ 0,  1,  3,  6,  2,  5,  1,  1,  3,  4,  8,  3]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  4]
        mask = [ F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  T]
    """
    cells = (length - 2) // 2
    if statements < 2 or cells < statements or values < 2:
        raise ValueError(f"latest_recall needs statements >= 2, values >= 2 and length >= 2 * statements + 2, "
                         f"got statements={statements}, values={values}, length={length}")
    key0, value0, query = fillers, fillers + keys, fillers + keys + values
    x = torch.randint(fillers, (batch, length), generator=generator)
    y = torch.zeros_like(x)
    for row in range(batch):
        where = torch.randperm(cells, generator=generator)[:statements].sort().values  # the cells facts go in
        fact_keys = torch.randint(keys, (statements,), generator=generator)
        fact_values = torch.randint(values, (statements,), generator=generator)
        asked = int(torch.randint(keys, (1,), generator=generator))
        first, last = torch.randperm(statements, generator=generator)[:2].sort().values.tolist()
        fact_keys[first] = fact_keys[last] = asked  # stated, then restated with another value
        fact_values[last] = (fact_values[first] + 1 + torch.randint(values - 1, (1,), generator=generator)) % values
        x[row, 2 * where] = key0 + fact_keys
        x[row, 2 * where + 1] = value0 + fact_values
        latest = int(torch.nonzero(fact_keys == asked).max())
        x[row, -2:] = torch.tensor([query, key0 + asked])
        y[row, -1] = value0 + fact_values[latest]
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return x, y, mask


def multi_hop(batch, length, generator, keys=16, hops=3, chains=2, gap=0, fillers=8):
    """
    Chains of facts "a -> b", "b -> c", "c -> d" somewhere in filler, then a chain's first key as a query:
    answer with its last key, following every hop (the shape of BABILong's three-supporting-facts questions and
    RULER's variable tracking).

    A chain's facts stand one after another, `gap` filler tokens apart, so every hop is read at the same
    distance at every length: only where the chain sits, and so how far the query is from it, grows with the
    sequence. (latest_recall is the other kind: its facts spread out as the filler grows.) `chains` chains
    of distinct keys sit at random non-overlapping places; the other chains are the distractors.
    Tokens: fillers 0..F-1, keys F..F+K-1, QUERY = F+K. The first length-2 tokens are filler and chains, each
    chain 2 * hops + (hops - 1) * gap tokens; then QUERY and the queried chain's first key.
    Example, keys=8, hops=2, chains=2, gap=1, fillers=2, length=16 (keys 2..9, QUERY 10; the chains are
    9 -> 3 -> 4 at index 2 and 7 -> 8 -> 2 at index 9; the query is key 9, whose chain ends at 4):
        x    = [ 0,  0,  9,  3,  1,  3,  4,  0,  0,  7,  8,  0,  8,  2, 10,  9]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  4]
        mask = [ F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  T]
    """
    span = 2 * hops + (hops - 1) * gap  # the tokens of one chain
    free = length - 2 - chains * span
    if hops < 1 or chains < 1 or gap < 0 or free < 0 or keys < chains * (hops + 1):
        raise ValueError(f"multi_hop needs hops, chains >= 1, gap >= 0, keys >= chains * (hops + 1) and length >= "
                         f"chains * (2 hops + (hops - 1) gap) + 2, got keys={keys}, hops={hops}, chains={chains}, "
                         f"gap={gap}, length={length}")
    key0, query = fillers, fillers + keys
    x = torch.randint(fillers, (batch, length), generator=generator)
    y = torch.zeros_like(x)
    fact = torch.arange(hops) * (2 + gap)  # where each fact of a chain starts, from the chain's start
    for row in range(batch):
        chain_keys = (key0 + torch.randperm(keys, generator=generator)[:chains * (hops + 1)]).view(chains, hops + 1)
        # chains * span tokens in free + chains * span places, in order: the fillers before chain i are the
        # i-th of `chains` sorted draws from 0..free (every arrangement of chains and filler equally likely)
        before = torch.randint(free + 1, (chains,), generator=generator).sort().values
        for i, start in enumerate((before + torch.arange(chains) * span).tolist()):
            x[row, start + fact] = chain_keys[i, :-1]
            x[row, start + fact + 1] = chain_keys[i, 1:]
        asked = int(torch.randint(chains, (1,), generator=generator))
        x[row, -2:] = torch.tensor([query, int(chain_keys[asked, 0])])
        y[row, -1] = chain_keys[asked, -1]
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -1] = True
    return x, y, mask


# -----------------------------------------------------------------------------
# delay copy and selective copy (Paper D): a stream of episodes, cropped to a window
#
# One episode, with m source tokens and a delay d:
#
#     source (m data tokens), CTRL, d filler data tokens, CTRL, reproduced tokens
#
# d counts the filler tokens strictly between the two control tokens (the C-to-C distance minus 1), so in
# delay copy every source token is reproduced exactly m + d + 2 positions after it appears. CTRL is C for
# delay copy, where all m source tokens are reproduced in order, and S for selective copy, where only the
# even-valued source tokens are reproduced, in order (none, if no source token is even). Fillers (Paper D's
# R tokens) are random data tokens and are never predicted. Between episodes come Binomial(9, 6/9) more
# fillers, Paper D's segment length. Paper D masks the first 18 positions of a window because an episode cut
# by the window's start cannot be solved; here the mask is exact instead: a reproduced token is a target
# only when its source token lies inside x.


def _episode_stream(n, generator, symbols, m, kinds):
    """
    A stream of episodes (see above), valid in its first n tokens, and for every position the stream index
    of the source token it reproduces (-1 where the token is not a reproduction). kinds is a list of
    (control token, delays, selective); each episode picks one kind uniformly, then d uniformly from its delays.
    """
    longest = 2 * m + 2 + max(max(delays) for _, delays, _ in kinds)
    shortest = m + 2 + min(min(delays) for _, delays, _ in kinds)  # selective episodes may reproduce nothing
    count = n // shortest + 1  # each episode (with its gap) advances at least `shortest`, so this covers n
    # every slot starts as a random data token: episodes overwrite their control and reproduced slots, and
    # what is left (sources, delay fillers, gaps) is already uniformly random
    tokens = torch.randint(symbols, (n + longest,), generator=generator).tolist()
    source_of = [-1] * len(tokens)
    gaps = (torch.rand(count, 9, generator=generator) < 6 / 9).sum(1).tolist()  # Binomial(9, 6/9)
    kind_of = torch.randint(len(kinds), (count,), generator=generator).tolist()
    pick = [torch.randint(len(delays), (count,), generator=generator).tolist() for _, delays, _ in kinds]
    start = 0
    for e in range(count):
        start += gaps[e]
        if start >= n:
            break
        control, delays, selective = kinds[kind_of[e]]
        d = delays[pick[kind_of[e]][e]]
        tokens[start + m] = control
        tokens[start + m + 1 + d] = control
        out = start + m + 2 + d  # where the reproduction begins
        for i in range(start, start + m):
            if not selective or tokens[i] % 2 == 0:
                tokens[out] = tokens[i]
                source_of[out] = i
                out += 1
        start = out
    return tokens, source_of


def _episode_batch(batch, length, generator, symbols, m, kinds, name):
    """
    Crop a random window of length+1 tokens from a fresh stream for every row: x = stream[s:s+length],
    y = stream[s+1:s+length+1]. A window with no target (it can happen when length is close to one episode)
    is drawn again with a fresh stream, so every row has at least one target and an evaluation at one
    fixed d always measures something.
    """
    if m < 1 or any(len(delays) == 0 or min(delays) < 0 for _, delays, _ in kinds):
        raise ValueError(f"{name} needs m >= 1 and non-empty, non-negative delays")
    longest = 2 * m + 2 + max(max(delays) for _, delays, _ in kinds)
    if length + 1 < longest:
        raise ValueError(f"{name} with m={m} and delays up to {longest - 2 * m - 2} needs length >= "
                         f"{longest - 1} to hold one whole episode, got length={length}")
    cycle = 9 + longest  # the longest gap plus the longest episode: s < cycle reaches every phase of the stream
    x = torch.zeros(batch, length, dtype=torch.long)
    y = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for b in range(batch):
        while True:
            tokens, source_of = _episode_stream(cycle + length, generator, symbols, m, kinds)
            s = int(torch.randint(cycle, (1,), generator=generator))
            # y[t] is stream[s + 1 + t]; it is a target when its source is at or after the window start
            targets = [t for t in range(length) if source_of[s + 1 + t] >= s]
            if targets:
                break
        x[b] = torch.tensor(tokens[s:s + length])
        for t in targets:
            y[b, t] = tokens[s + 1 + t]
            mask[b, t] = True
    return x, y, mask


DELAYS = tuple(range(8, 15))  # d in [8, 14], the default training range


def delay_copy(batch, length, generator, symbols=16, m=4, delays=DELAYS):
    """
    Paper D's C task: m source tokens, C, d fillers, C, then the m source tokens again. d is drawn per
    episode uniformly from `delays` and counts the fillers between the two C's; evaluate at one d with
    delays=(d,). Needs length >= 2m + 1 + max(delays).

    Tokens: data 0..symbols-1, C = symbols, S = symbols+1 (unused here; shared so that one model can be
    trained on delay_copy and selective_copy alike). Targets are the reproduced tokens.
    Example, symbols=16, m=4, delays=(3,), length=15: 2 fillers, source 5 10 2 7, C, fillers 9 1 14, C,
    the reproduction, then a gap filler 0 (seen only in y, and not a target):
        x    = [12,  3,  5, 10,  2,  7, 16,  9,  1, 14, 16,  5, 10,  2,  7]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  5, 10,  2,  7,  0]
        mask = [ F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  T,  T,  T,  T,  F]
    """
    return _episode_batch(batch, length, generator, symbols, m, [(symbols, tuple(delays), False)], "delay_copy")


def selective_copy(batch, length, generator, symbols=16, m=4, delays=DELAYS):
    """
    Paper D's S task: m source tokens, S, d fillers, S, then only the even-valued source tokens, in order.
    d counts the fillers between the two S's, as in delay_copy. Needs length >= 2m + 1 + max(delays).

    Tokens: data 0..symbols-1, C = symbols (unused here), S = symbols+1.
    Example, symbols=16, m=4, delays=(3,), length=15: source 5 10 2 7, so 10 and 2 are reproduced, then
    gap fillers 11 4 0:
        x    = [12,  3,  5, 10,  2,  7, 17,  9,  1, 14, 17, 10,  2, 11,  4]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  0,  0,  0, 10,  2,  0,  0,  0]
        mask = [ F,  F,  F,  F,  F,  F,  F,  F,  F,  F,  T,  T,  F,  F,  F]
    """
    return _episode_batch(batch, length, generator, symbols, m, [(symbols + 1, tuple(delays), True)],
                          "selective_copy")


SELECTIVE_DELAYS = tuple(range(15, 22))  # d in [15, 21], just past DELAYS, as in Paper D's C [15,25] / S [25,35]


def mixed_copy(batch, length, generator, symbols=16, m=4, delays=DELAYS, selective_delays=SELECTIVE_DELAYS):
    """
    Paper D's transfer experiment: each episode is a delay_copy episode with d from `delays` or a
    selective_copy episode with d from `selective_delays`, with probability 1/2 each. Does training S at
    longer delays help (or hurt) C there? Evaluate each with delay_copy / selective_copy at one d.

    Tokens: data 0..symbols-1, C = symbols, S = symbols+1.
    Example, symbols=16, m=4, delays=(3,), selective_delays=(5,), length=27: a C episode, a gap of 2, then
    an S episode whose evens are 6 and 4:
        x    = [ 5, 10,  2,  7, 16,  9,  1, 14, 16,  5, 10,  2,  7, 12,  3,  6,  4,  9, 11, 17,  4, 13,  1,
                 8, 15, 17,  6]
        y    = [ 0,  0,  0,  0,  0,  0,  0,  0,  5, 10,  2,  7,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,
                 0,  0,  6,  4]
        mask = True at 8, 9, 10, 11 and 25, 26
    """
    kinds = [(symbols, tuple(delays), False), (symbols + 1, tuple(selective_delays), True)]
    return _episode_batch(batch, length, generator, symbols, m, kinds, "mixed_copy")


# -----------------------------------------------------------------------------
# registry


@dataclass
class Task:
    make: Callable  # fn(batch, length, generator, **options) -> (x, y, mask)
    vocab_size: Callable[..., int]  # from the task's full options to the number of token ids
    doc: str


TASKS: dict[str, Task] = {
    "retrieval": Task(retrieval, lambda symbols, **_: symbols + 1,
                      "fixed-offset retrieval: predict the symbol `offset` places before the final query"),
    "shift": Task(shift, lambda symbols, **_: symbols,
                  "predict the symbol `offset` places back at every position"),
    "copy": Task(copy, lambda symbols, **_: symbols + 2, "read n symbols, write them again"),
    "reverse": Task(reverse, lambda symbols, **_: symbols + 2, "read n symbols, write them reversed"),
    "duplicate": Task(duplicate, lambda symbols, **_: symbols + 2, "read n symbols, write them twice"),
    "algorithmic_mix": Task(algorithmic_mix, lambda symbols, **_: symbols + 2,
                            "rows of copy, reverse and shift, mixed: the ryarn experiment's pretraining"),
    "associative_recall": Task(associative_recall, lambda keys, values, **_: keys + values + 1,
                               "key-value pairs, then a key: predict its value"),
    "latest_recall": Task(latest_recall, lambda keys, values, fillers, **_: fillers + keys + values + 1,
                          "facts key=value stated and restated among filler; a key: predict its latest value"),
    "multi_hop": Task(multi_hop, lambda keys, fillers, **_: fillers + keys + 1,
                      "chains of facts a->b->c->d in filler, a chain's first key: follow it to its last key"),
    "delay_copy": Task(delay_copy, lambda symbols, **_: symbols + 2,
                       "Paper D's C task: reproduce m tokens after a delay of d fillers"),
    "selective_copy": Task(selective_copy, lambda symbols, **_: symbols + 2,
                           "Paper D's S task: reproduce the even tokens among m after a delay of d fillers"),
    "mixed_copy": Task(mixed_copy, lambda symbols, **_: symbols + 2,
                       "Paper D's transfer setting: C episodes and S episodes at their own delays"),
}


def _task(name):
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; choose from {', '.join(TASKS)}")
    return TASKS[name]


def task_options(name):
    """The task's options and their defaults, read from its signature (after batch, length, generator)."""
    parameters = list(inspect.signature(_task(name).make).parameters.values())[3:]
    return {p.name: p.default for p in parameters}


def _full_options(name, options):
    defaults = task_options(name)
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ValueError(f"task '{name}' has no option {', '.join(unknown)}; its options are {', '.join(defaults)}")
    return {**defaults, **options}


def vocab_size(name, **options):
    """Number of token ids the task uses with these options (defaults fill the rest): every token is below it."""
    return _task(name).vocab_size(**_full_options(name, options))


def make_batch(name, batch, length, generator, **options):
    """Make one batch (x, y, mask) of the named task; see each task's docstring."""
    return _task(name).make(batch, length, generator, **_full_options(name, options))
