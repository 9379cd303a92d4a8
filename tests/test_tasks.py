"""Tests for tasks.py: labels checked against slow, independent checks written differently from the tasks."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tasks  # noqa: E402

BATCH = 64

# a small length that every task accepts with its default options
SMALL_LENGTH = {
    "retrieval": 12, "shift": 12, "copy": 11, "reverse": 11, "duplicate": 11, "associative_recall": 12,
    "latest_recall": 12, "multi_hop": 14, "algorithmic_mix": 11,
    "delay_copy": 30, "selective_copy": 30, "mixed_copy": 40,
}


def batch_of(name, length, seed=0, **options):
    x, y, mask = tasks.make_batch(name, BATCH, length, torch.Generator().manual_seed(seed), **options)
    return x.tolist(), y.tolist(), mask.tolist()


def test_every_task_has_a_small_length():
    assert set(SMALL_LENGTH) == set(tasks.TASKS)


# -----------------------------------------------------------------------------
# properties every task shares


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_shapes_dtypes_vocab_and_targets(name):
    for length in (SMALL_LENGTH[name], SMALL_LENGTH[name] + 7):
        x, y, mask = tasks.make_batch(name, BATCH, length, torch.Generator().manual_seed(1))
        assert x.shape == y.shape == mask.shape == (BATCH, length)
        assert x.dtype == y.dtype == torch.long and mask.dtype == torch.bool
        vocab = tasks.vocab_size(name)
        assert 0 <= int(x.min()) and int(x.max()) < vocab
        assert 0 <= int(y.min()) and int(y.max()) < vocab
        assert (y[~mask] == 0).all()
        assert mask.any(dim=1).all(), "every row needs at least one target"


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_same_seed_same_batch_other_seed_other_batch(name):
    length = SMALL_LENGTH[name]
    a = tasks.make_batch(name, BATCH, length, torch.Generator().manual_seed(7))
    b = tasks.make_batch(name, BATCH, length, torch.Generator().manual_seed(7))
    c = tasks.make_batch(name, BATCH, length, torch.Generator().manual_seed(8))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_registry_options_and_vocab():
    assert tasks.task_options("retrieval") == {"symbols": 16, "offset": 3}
    assert tasks.task_options("copy") == {"symbols": 8}
    assert tasks.vocab_size("retrieval") == 17 and tasks.vocab_size("retrieval", symbols=10) == 11
    assert tasks.vocab_size("shift", symbols=10) == 10
    assert tasks.vocab_size("copy") == 10
    assert tasks.vocab_size("associative_recall", keys=5, values=7) == 13
    assert tasks.vocab_size("delay_copy") == tasks.vocab_size("selective_copy") == tasks.vocab_size("mixed_copy") == 18
    assert all(isinstance(task.doc, str) and task.doc for task in tasks.TASKS.values())


def test_unknown_task_and_option_raise():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="unknown task 'nope'; choose from"):
        tasks.make_batch("nope", 2, 10, g)
    with pytest.raises(ValueError, match="unknown task"):
        tasks.vocab_size("nope")
    with pytest.raises(ValueError, match="no option"):
        tasks.make_batch("copy", 2, 10, g, offset=3)


@pytest.mark.parametrize("name, length, options", [
    ("retrieval", 3, {"offset": 3}),
    ("shift", 3, {"offset": 3}),
    ("copy", 1, {}),
    ("reverse", 1, {}),
    ("duplicate", 2, {}),
    ("associative_recall", 2, {}),
    ("algorithmic_mix", 3, {}),  # shift rows need length > offset 3
    ("latest_recall", 9, {}),  # 4 two-token statements, then QUERY and the key: 10 tokens
    ("multi_hop", 13, {}),  # 2 chains of 3 adjacent two-token facts, then QUERY and the key: 14 tokens
    ("multi_hop", 21, {"gap": 2}),  # each chain 6 + 2 x 2 fillers: 2 x 10 + 2 = 22 tokens
    ("delay_copy", 22, {}),  # one episode at d=14 is 4 + 1 + 14 + 1 + 4 = 24 tokens: needs length >= 23
    ("delay_copy", 20, {"delays": (3, 12)}),
    ("selective_copy", 22, {}),
    ("mixed_copy", 29, {}),  # selective delays go up to 21
])
def test_impossible_length_raises(name, length, options):
    with pytest.raises(ValueError):
        tasks.make_batch(name, 2, length, torch.Generator().manual_seed(0), **options)
    tasks.make_batch(name, 2, length + 1, torch.Generator().manual_seed(0), **options)  # one more is enough


# -----------------------------------------------------------------------------
# labels, task by task


@pytest.mark.parametrize("length, offset", [(4, 3), (9, 1), (20, 5)])
def test_retrieval_labels(length, offset):
    x, y, mask = batch_of("retrieval", length, symbols=6, offset=offset)
    for xs, ys, ms in zip(x, y, mask):
        assert xs[-1] == 6 and all(0 <= s < 6 for s in xs[:-1])
        assert ms == [False] * (length - 1) + [True]
        assert ys[-1] == xs[::-1][offset]  # read backwards from the query


@pytest.mark.parametrize("length, offset", [(4, 3), (12, 2)])
def test_shift_labels(length, offset):
    x, y, mask = batch_of("shift", length, offset=offset)
    for xs, ys, ms in zip(x, y, mask):
        for t in range(length):
            assert ms[t] == (t >= offset)
            assert ys[t] == (xs[t - offset] if t >= offset else 0)


@pytest.mark.parametrize("name, length", [(name, length) for name in ("copy", "reverse", "duplicate")
                                          for length in (2, 3, 4, 9, 16) if length >= 3 or name != "duplicate"])
def test_copy_reverse_duplicate_labels(name, length):
    symbols = 5
    sep, pad = symbols, symbols + 1
    x, y, mask = batch_of(name, length, symbols=symbols)
    for xs, ys, ms in zip(x, y, mask):
        # read the input back: skip the padding, take symbols up to the separator
        i = 0
        while xs[i] == pad:
            i += 1
        source = []
        while xs[i] != sep:
            source.append(xs[i])
            i += 1
        if name == "copy":
            answer = source
        elif name == "reverse":
            answer = source[::-1]
        else:
            answer = source + source
        # the answer is predicted from the separator on, and fills the window to its last position
        assert len(answer) == length - i and len(source) >= 1
        assert len(source) == length // (3 if name == "duplicate" else 2)
        assert ms == [False] * i + [True] * len(answer)
        assert ys == [0] * i + answer
        assert xs[i + 1:] == answer[:-1]  # teacher forcing: x holds the answer shifted by one


@pytest.mark.parametrize("length", [7, 12, 33])
def test_algorithmic_mix_labels(length):
    """Each row read back as the one kind it can be: with a separator, copy or reverse of what stands before it
    (the one of the two its targets match); without, shift by the offset. Every kind is drawn, and the
    separator and PAD are the top two ids (PAD is the ryarn targets' QUERY: it never precedes a target)."""
    symbols, offset = 5, 2
    sep, pad = symbols, symbols + 1
    x, y, mask = batch_of("algorithmic_mix", length, symbols=symbols, offset=offset)
    kinds = set()
    for xs, ys, ms in zip(x, y, mask):
        assert all(0 <= v <= pad for v in xs + ys) and tasks.vocab_size("algorithmic_mix", symbols=symbols) == 7
        if sep not in xs:  # shift (its symbols never include SEP or PAD)
            kinds.add("shift")
            assert ms == [t >= offset for t in range(length)]
            assert ys == [xs[t - offset] if t >= offset else 0 for t in range(length)]
            continue
        i = xs.index(sep)
        source = [v for v in xs[:i] if v != pad]
        targets = [v for v, m in zip(ys, ms) if m]
        assert ms == [t >= i for t in range(length)] and len(source) == length // 2
        kind = "copy" if targets == source else "reverse"
        kinds.add(kind)
        assert targets == (source if kind == "copy" else source[::-1])
        assert not any(m for v, m in zip(xs, ms) if v == pad)
    assert kinds == {"copy", "reverse", "shift"}


def test_algorithmic_mix_shares_the_ryarn_targets_vocabulary():
    """The bases pretrain on it and fine-tune on latest_recall and multi_hop: train.py --init needs one
    embedding table, so the three must use the same number of token ids."""
    assert tasks.vocab_size("algorithmic_mix") == tasks.vocab_size("latest_recall", keys=8, values=8, fillers=8) \
        == tasks.vocab_size("multi_hop", keys=16, fillers=8) == 25


@pytest.mark.parametrize("length", [3, 4, 11, 40])
def test_associative_recall_labels(length):
    keys, values = 6, 5
    x, y, mask = batch_of("associative_recall", length, keys=keys, values=values)
    for xs, ys, ms in zip(x, y, mask):
        body = [t for t in xs[:-1] if t != keys + values]
        assert len(body) == 2 * min((length - 1) // 2, keys)
        table = {}
        for k, v in zip(body[0::2], body[1::2]):
            assert 0 <= k < keys and keys <= v < keys + values
            assert k not in table, "keys must be distinct within a row"
            table[k] = v
        assert xs[-1] in table
        assert ms == [False] * (length - 1) + [True]
        assert ys[-1] == table[xs[-1]]


@pytest.mark.parametrize("length", [10, 17, 64])
def test_latest_recall_labels(length):
    """Read each row as a reader would: every key token followed by a value token is a statement; the answer
    is the value of the last statement of the queried key. Bugs caught: the first (not the latest) value as
    the answer, a queried key stated once or always with one value (then order would not matter), facts that
    overlap."""
    keys, values, statements, fillers = 3, 5, 4, 4
    x, y, mask = batch_of("latest_recall", length, keys=keys, values=values, statements=statements, fillers=fillers)
    query, is_key = fillers + keys + values, (lambda t: fillers <= t < fillers + keys)
    for xs, ys, ms in zip(x, y, mask):
        body, said = xs[:-2], []
        for i, t in enumerate(body[:-1]):
            if is_key(t):
                assert fillers + keys <= body[i + 1] < query, "a key is always followed by its value"
                said.append((t, body[i + 1]))
        assert len(said) == statements and all(t < fillers + keys for t in body if t not in sum(said, ()))
        assert xs[-2] == query and is_key(xs[-1])
        values_of_asked = [v for k, v in said if k == xs[-1]]
        assert len(set(values_of_asked)) >= 2  # stated at least twice, and not always with the same value
        assert ys[-1] == values_of_asked[-1] and ys[:-1] == [0] * (length - 1)
        assert ms == [False] * (length - 1) + [True]


def hop_facts(body: list[int], is_key) -> list[tuple[int, int, int]]:
    """(index, source, target) of every fact in a multi_hop row's body: its key tokens come in runs (a fact,
    or a chain's facts back to back when gap is 0, or two chains side by side), read two at a time."""
    facts, i = [], 0
    while i < len(body):
        if not is_key(body[i]):
            i += 1
            continue
        end = i
        while end < len(body) and is_key(body[end]):
            end += 1
        assert (end - i) % 2 == 0, "a run of keys is whole facts"
        facts += [(j, body[j], body[j + 1]) for j in range(i, end, 2)]
        i = end
    return facts


@pytest.mark.parametrize("length, gap", [(14, 0), (40, 0), (40, 1), (97, 3)])
def test_multi_hop_labels(length, gap):
    """Follow the facts as a reader would: from the queried key, each fact's target is the next fact's source,
    `hops` times; the answer is where that ends. Bugs caught: one hop too few or too many, the distractor
    chain's end, chains that share a key or overlap."""
    keys, hops, chains, fillers = 9, 3, 2, 4
    x, y, mask = batch_of("multi_hop", length, keys=keys, hops=hops, chains=chains, gap=gap, fillers=fillers)
    query, is_key = fillers + keys, (lambda t: fillers <= t < fillers + keys)
    for xs, ys, ms in zip(x, y, mask):
        facts = hop_facts(xs[:-2], is_key)
        follow = {source: target for _, source, target in facts}
        assert len(facts) == chains * hops == len(follow), "every fact has a source of its own"
        assert xs[-2] == query and xs[-1] in follow
        key = xs[-1]
        for _ in range(hops):
            key = follow[key]
        assert key not in follow, "the chain ends after `hops` hops"
        assert ys[-1] == key and ys[:-1] == [0] * (length - 1)
        assert ms == [False] * (length - 1) + [True]


@pytest.mark.parametrize("gap", [0, 2])
def test_multi_hop_hops_keep_their_distance_at_every_length(gap):
    """The property the task exists for: each hop is read at 2 + gap tokens, however long the sequence (only
    where the chain sits moves). Bug caught: facts spread over the filler as it grows, as latest_recall's do
    (watched failing with the facts placed length // 16 apart)."""
    for length in (32, 128, 512):
        x, _, _ = batch_of("multi_hop", length, gap=gap)
        for xs in x:
            facts = hop_facts(xs[:-2], lambda t: 8 <= t < 8 + 16)
            follow = {source: (index, target) for index, source, target in facts}
            index, key = follow[xs[-1]]
            starts = [index]
            while key in follow:
                index, key = follow[key]
                starts.append(index)
            assert [b - a for a, b in zip(starts, starts[1:])] == [2 + gap] * 2


# delay tasks: parse the window from x alone. Control tokens come in pairs, but the window may begin inside
# an episode, so the first control seen can open or close one; try both phases. Under a phase, each pair
# (p, q) must be of one kind with q - p - 1 fillers in that kind's delays, and the reproduction starts at
# x[q + 1], i.e. it is predicted at y[q]. Sources before the window are unknown: in delay copy their
# reproductions are not targets; in selective copy it is unknown how many of them were even, so try every count.


def expected_targets(xs, m, control_delays, control_selective):
    """Every {position: token} target map consistent with the window x."""
    controls = [i for i, token in enumerate(xs) if token in control_delays]
    answers = []
    for phase in (0, 1):
        if phase == 1 and not controls:
            continue
        pairs = list(zip(controls[phase::2], controls[phase + 1::2]))
        if any(xs[p] != xs[q] or q - p - 1 not in control_delays[xs[p]] for p, q in pairs):
            continue
        options = [{}]
        for p, q in pairs:
            visible = xs[max(p - m, 0):p]
            hidden = m - len(visible)
            if control_selective[xs[p]]:
                seen = [s for s in visible if s % 2 == 0]
                runs = [(q + h, seen) for h in range(hidden + 1)]  # h hidden sources were even
            else:
                runs = [(q + hidden, visible)]
            options = [{**targets, **{start + j: s for j, s in enumerate(run) if start + j < len(xs)}}
                       for targets in options for start, run in runs]
        answers.extend(options)
    return answers


def check_episode_batch(x, y, mask, m, control_delays, control_selective):
    for xs, ys, ms in zip(x, y, mask):
        actual = {t: ys[t] for t in range(len(xs)) if ms[t]}
        assert actual, "every row needs at least one target"
        assert actual in expected_targets(xs, m, control_delays, control_selective)


@pytest.mark.parametrize("length", [23, 24, 31, 64])
def test_delay_copy_labels(length):
    x, y, mask = batch_of("delay_copy", length, seed=length)
    check_episode_batch(x, y, mask, 4, {16: set(range(8, 15))}, {16: False})


@pytest.mark.parametrize("length", [23, 24, 31, 64])
def test_selective_copy_labels(length):
    x, y, mask = batch_of("selective_copy", length, seed=length)
    check_episode_batch(x, y, mask, 4, {17: set(range(8, 15))}, {17: True})


@pytest.mark.parametrize("length", [30, 50])
def test_mixed_copy_labels(length):
    x, y, mask = batch_of("mixed_copy", length, seed=length, symbols=10, m=3, delays=(2, 3), selective_delays=(6, 8))
    check_episode_batch(x, y, mask, 3, {10: {2, 3}, 11: {6, 8}}, {10: False, 11: True})
    assert any(10 in xs for xs in x) and any(11 in xs for xs in x)


def test_one_fixed_delay_and_every_delay_drawn():
    # evaluation at one d: every C...C pair inside a window is d fillers apart, and every row has a target
    x, y, mask = batch_of("delay_copy", 40, delays=(5,))
    check_episode_batch(x, y, mask, 4, {16: {5}}, {16: False})
    # training: every delay in the set occurs
    x, _, _ = batch_of("delay_copy", 64, delays=(0, 4, 9))
    seen = set()
    for xs in x:
        controls = [i for i, token in enumerate(xs) if token == 16]
        seen.update(q - p - 1 for p, q in zip(controls, controls[1:]))
    assert {0, 4, 9} <= seen


def test_delay_copy_reproduces_at_fixed_distance():
    # in delay copy every target equals the token m + d + 2 positions earlier in the stream, i.e. x[t - m - d - 1]
    m, d = 3, 6
    x, y, mask = batch_of("delay_copy", 30, m=m, delays=(d,))
    for xs, ys, ms in zip(x, y, mask):
        for t in range(30):
            if ms[t]:
                assert t - m - d - 1 >= 0 and ys[t] == xs[t - m - d - 1]


def test_episode_gaps_follow_binomial():
    # with m=2 and d=1, an episode's two controls are 2 apart and two episodes' controls at least 5 apart,
    # so pairs are easy to find; the fillers between one episode's reproduction and the next episode's
    # source are Binomial(9, 6/9): from 0 to 9, mean 6
    m, d = 2, 1
    x, _, _ = batch_of("delay_copy", 400, m=m, delays=(d,))
    gaps = []
    for xs in x:
        controls = [i for i, token in enumerate(xs) if token == 16]
        opens = [p for p, q in zip(controls, controls[1:]) if q - p == d + 1]
        # an episode opening at a ends at a + d + 1 + m; the next one's source starts m before its open b
        gaps += [(b - m) - (a + d + 1 + m) - 1 for a, b in zip(opens, opens[1:])]
    assert min(gaps) >= 0 and max(gaps) <= 9
    assert abs(sum(gaps) / len(gaps) - 6) < 0.2
