"""
Long-context text tasks for an LLM: the fine-tuning and evaluation data of Paper R (2606.23687), generated
offline at any length in tokens. The small GPT's token tasks are in tasks.py.
"""

import inspect
import random
import re
from typing import Callable

# These make text, not token ids. Every one is a plain function
#
#     fn(length, seed, count_tokens, **options) -> (prompt, answer)
#
# count_tokens(text) -> int is how the caller measures length (for a Hugging Face model,
# lambda s: len(tokenizer(s).input_ids)). A task first draws everything from random.Random(seed): the
# facts, the question, where the facts go, and an endless stream of filler. Then it takes as many filler
# units as fit: the prompt is the longest one found with count_tokens(prompt) <= length. So one seed gives
# one text whatever the tokenizer; only how much of the filler is used depends on count_tokens. Nothing is
# downloaded. The answer is a short string, scored with answer_matches.
#
# - passkey: a 5-digit key hidden in filler (Mohtashami & Jaggi, 2305.16300), at a chosen depth: in their
#   published prompt (the "grass is green" filler, as the PI and YaRN papers also use it), or in varied filler.
# - babilong: a bAbI story (Weston et al., 1502.05698; tasks qa1 to qa5) spread through filler, as in
#   BABILong (Kuratov et al., 2406.10149). Paper R fine-tunes on its 3-hop subset.
# - mrcr: multi-round coreference resolution, as in OpenAI's MRCR (after Michelangelo, 2409.12640): the same
#   request appears several times in a long conversation; reproduce the reply to the i-th one.
#
# TEXT_TASKS maps names to the functions; make_text_sample(name, ...) is what train.py and eval.py call.


# filler: combinatorial sentences about nature, so a long haystack does not repeat one sentence verbatim.
# It names no person, place or object of the stories, and holds no digit.
_FILLER_PREDICATES = {
    "the grass": ("is green", "grows tall", "sways in the breeze", "is wet with dew"),
    "the sky": ("is blue", "is clear", "turns grey", "is full of clouds"),
    "the river": ("flows slowly", "sparkles in the light", "runs toward the sea", "is cold and clear"),
    "the wind": ("blows softly", "moves through the trees", "carries the smell of pine", "dies down"),
    "the sun": ("shines warmly", "rises over the hills", "sinks behind the mountains", "hides behind a cloud"),
    "the birds": ("sing in the trees", "fly south", "build their nests", "circle overhead"),
    "the forest": ("is quiet", "is dark and deep", "smells of moss", "rustles softly"),
    "the mountains": ("stand tall", "are covered in snow", "look far away", "glow in the evening light"),
}
_FILLER_OPENINGS = ("", "Far away, ", "Once more, ", "As usual, ", "Quietly, ", "Here and there, ")
_FILLER_TIMES = ("", " today", " in the morning", " at dusk", " in spring", " after the rain", " all day long",
                 " as always")


def _filler(rng):
    """An endless stream of filler sentences, e.g. 'Once more, the river flows slowly after the rain.'"""
    subjects = list(_FILLER_PREDICATES)
    while True:
        subject = rng.choice(subjects)
        opening = rng.choice(_FILLER_OPENINGS)
        sentence = f"{opening}{subject} {rng.choice(_FILLER_PREDICATES[subject])}{rng.choice(_FILLER_TIMES)}."
        yield sentence[0].upper() + sentence[1:]


class _Stream:
    """Prefixes of an endless iterator, made once and kept: first(k) extends whatever first(j < k) made."""

    def __init__(self, items):
        self.items, self.made = items, []

    def first(self, k):
        while len(self.made) < k:
            self.made.append(next(self.items))
        return self.made[:k]


def _weave(filler, inserts, where):
    """Put inserts[i] after round(where[i] * len(filler)) filler units; `where` is sorted, so order is kept."""
    out, done = [], 0
    for item, w in zip(inserts, where):
        cut = round(w * len(filler))
        out += filler[done:cut]
        out.append(item)
        done = cut
    return out + filler[done:]


def _fit(name, length, count_tokens, build):
    """
    build(k) -> the prompt with k filler units. Return build(k) for the largest k found with
    count_tokens(build(k)) <= length, and raise ValueError when even k = 0 is too long.

    Counting a long prompt is the expensive part, so k is first estimated from the tokens per unit of a small
    sample, bracketed around that estimate, then bisected: about a dozen counts for a 32K-token prompt.
    A real tokenizer is not exactly additive across sentence boundaries, so k is "the largest found", but the
    budget always holds: only a k whose prompt was counted and fit (or k = 0) is ever returned.
    """
    base = count_tokens(build(0))
    if base > length:
        raise ValueError(f"{name} needs length >= {base} tokens to hold its question and facts, got length={length}")

    def fits(k):
        return count_tokens(build(k)) <= length

    sample = 16
    per_unit = max(count_tokens(build(sample)) - base, 1) / sample
    guess = int((length - base) / per_unit)
    step = max(guess // 32, 1)
    if fits(guess):
        lo, hi = guess, guess + step
        while fits(hi):
            lo, hi, step = hi, hi + 2 * step, 2 * step
    else:
        lo, hi = max(guess - step, 0), guess
        while lo > 0 and not fits(lo):
            lo, hi, step = max(lo - 2 * step, 0), lo, 2 * step
    while hi - lo > 1:  # invariant: lo fits (or is 0), hi does not
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return build(lo)


def _depth(drawn, depth, name):
    """The depth to use: the caller's, checked, or the one drawn (always drawn, so a depth sweep keeps the text)."""
    if depth is None:
        return drawn
    if not 0 <= depth <= 1:
        raise ValueError(f"{name} needs 0 <= depth <= 1, got depth={depth}")
    return depth


# The passkey prompt as Mohtashami & Jaggi published it (landmark attention's run_test.py; Figure 3 of the PI paper,
# 2306.15595, which YaRN's evaluation reuses): one filler block repeated, the key line between two of its copies,
# and a question the model completes. Lines are joined by newlines, as there.
PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                "I will quiz you about the important information there.")
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
PASSKEY_TEMPLATES = ("published", "varied")


def passkey(length, seed, count_tokens, depth=None, template="published"):
    """
    A 5-digit pass key hidden in filler, at relative depth `depth` (0 = before all the filler, 1 = after it;
    uniform in [0, 1] if None); the question asks for it. Mohtashami & Jaggi's test, scored by exact match.

    template="published": their prompt, word for word (PASSKEY_TASK, PASSKEY_FILLER repeated, PASSKEY_QUESTION),
        the key placed between whole copies of the filler block. The key is 5 digits, as in the PI paper.
    template="varied": generated filler sentences that never repeat one verbatim, and a question that asks for
        the number only (this project's first version; the same key and depth for a seed).

    Example, passkey(60, seed=0, count_tokens=lambda s: len(s.split()), depth=0.5, template="varied"), 59 words
    (one more filler sentence would pass 60):
        prompt = "There is a pass key hidden in the text below, among many sentences that do not matter. Find it
                  and remember it.

                  Here and there, the birds circle overhead as always. The pass key is 65125. Remember it. 65125
                  is the pass key. Once more, the wind dies down.

                  What is the pass key? Answer with the number only."
        answer = "65125"
    """
    if template not in PASSKEY_TEMPLATES:
        raise ValueError(f"passkey needs template in {', '.join(PASSKEY_TEMPLATES)}, got template={template!r}")
    rng = random.Random(seed)
    depth = _depth(rng.random(), depth, "passkey")
    key = str(rng.randint(10000, 99999))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    if template == "published":
        def build(k):
            cut = round(depth * k)
            lines = [PASSKEY_TASK, " ".join([PASSKEY_FILLER] * cut), needle, " ".join([PASSKEY_FILLER] * (k - cut)),
                     PASSKEY_QUESTION]
            return "\n".join(line for line in lines if line)  # no empty line where a side has no filler

        return _fit("passkey", length, count_tokens, build), key
    filler = _Stream(_filler(random.Random(rng.getrandbits(64))))

    def build(k):
        text = " ".join(_weave(filler.first(k), [needle], [depth]))
        return ("There is a pass key hidden in the text below, among many sentences that do not matter. "
                f"Find it and remember it.\n\n{text}\n\nWhat is the pass key? Answer with the number only.")

    return _fit("passkey", length, count_tokens, build), key


# bAbI's small world: four people, six places, three objects, and a few ways to say each action
PEOPLE = ("Mary", "John", "Sandra", "Daniel")
PLACES = ("kitchen", "office", "garden", "bathroom", "hallway", "bedroom")
OBJECTS = ("apple", "football", "milk")
_MOVES = ("went to", "moved to", "travelled to", "journeyed to", "went back to")
_TAKES = ("picked up", "got", "grabbed", "took")
_DROPS = ("dropped", "put down", "discarded")


def _interleave(rng, chains):
    """A uniformly random merge of several lists that keeps each list's own order."""
    chains = [list(c) for c in chains if c]
    out = []
    while chains:
        # picking a list with probability proportional to what it has left makes every merge equally likely
        i = rng.choices(range(len(chains)), weights=[len(c) for c in chains])[0]
        out.append(chains[i].pop(0))
        if not chains[i]:
            chains.pop(i)
    return out


def _babi_story(rng, facts):
    """(story sentences in order, question, answer) for bAbI qa1, qa2 or qa3; see babilong for the rules."""
    hero, carrier, *walkers = rng.sample(PEOPLE, len(PEOPLE))
    thing, other_thing = rng.sample(OBJECTS, 2)
    trail = rng.sample(PLACES, 5)  # distinct places, so every answer is unique

    def move(who, place):
        return f"{who} {rng.choice(_MOVES)} the {place}."

    def take(who, what):
        return f"{who} {rng.choice(_TAKES)} the {what}."

    def drop(who, what):
        return f"{who} {rng.choice(_DROPS)} the {what}."

    # distractors: people who only walk about, and in qa2/qa3 someone who carries another object
    chains = [[move(who, rng.choice(PLACES)) for _ in range(rng.randint(1, 2))] for who in walkers]
    if facts == 1:
        chains.append([move(carrier, rng.choice(PLACES)) for _ in range(rng.randint(1, 2))])
        visits = rng.randint(2, 3)
        chains.append([move(hero, place) for place in trail[:visits]])
        question, answer = f"Where is {hero}?", trail[visits - 1]
    else:
        chains.append([move(carrier, rng.choice(PLACES)), take(carrier, other_thing),
                       move(carrier, rng.choice(PLACES))])
        carried = 1 if facts == 2 else rng.randint(2, 3)  # places the hero walks to while holding the thing
        hero_chain = [move(hero, trail[0]), take(hero, thing)] + [move(hero, p) for p in trail[1:1 + carried]]
        if rng.random() < 0.5:  # leave the thing behind and walk on: the thing stays, the hero does not
            hero_chain += [drop(hero, thing), move(hero, trail[4])]
        chains.append(hero_chain)
        if facts == 2:
            question, answer = f"Where is the {thing}?", trail[1]
        else:
            question, answer = f"Where was the {thing} before the {trail[carried]}?", trail[carried - 1]
    return _interleave(rng, chains), question, answer


_DIRECTIONS = {"north": "south", "south": "north", "east": "west", "west": "east"}
_GIVES = ("gave", "handed", "passed")


def _babi_relations(rng):
    """(story, question, answer) for bAbI qa4, two-argument relations: 'The A is north of the B. The B is north
    of the C.' in either order; 'What is north of the B?' asks for A, 'What is the B north of?' for C."""
    a, b, c = rng.sample(PLACES, 3)
    way = rng.choice(list(_DIRECTIONS))
    story = [f"The {a} is {way} of the {b}.", f"The {b} is {way} of the {c}."]
    rng.shuffle(story)
    if rng.random() < 0.5:
        return story, f"What is {way} of the {b}?", a
    return story, f"What is the {b} {way} of?", c


def _babi_giving(rng):
    """(story, question, answer) for bAbI qa5, three-argument relations: a thing passes along 2 or 3 people
    ('Mary gave the apple to John.'); a person off that path hands another thing to its first. One give of the
    passed thing is asked about as 'Who gave the apple to John?', 'Who did Mary give the apple to?' or 'What
    did Mary give to John?'. The people on the path are distinct, so each question has one answer."""
    people = rng.sample(PEOPLE, len(PEOPLE))
    other, path = people[0], people[1:1 + rng.choice((2, 3))]  # the thing passes once or twice
    thing, other_thing = rng.sample(OBJECTS, 2)
    chain = [f"{path[0]} {rng.choice(_TAKES)} the {thing}."]
    chain += [f"{giver} {rng.choice(_GIVES)} the {thing} to {taker}." for giver, taker in zip(path, path[1:])]
    aside = [f"{other} {rng.choice(_TAKES)} the {other_thing}.",
             f"{other} {rng.choice(_GIVES)} the {other_thing} to {path[0]}."]
    walks = [f"{who} {rng.choice(_MOVES)} the {rng.choice(PLACES)}." for who in rng.sample(PEOPLE, 2)]
    story = _interleave(rng, [chain, aside, walks])
    i = rng.randrange(len(path) - 1)
    giver, taker = path[i], path[i + 1]
    form = rng.randrange(3)
    if form == 0:
        return story, f"Who gave the {thing} to {taker}?", giver
    if form == 1:
        return story, f"Who did {giver} give the {thing} to?", taker
    return story, f"What did {giver} give to {taker}?", thing


def babilong(length, seed, count_tokens, facts=1, depth=None):
    """
    A bAbI story hidden in generated filler (BABILong): task qa`facts`; in qa1 to qa3 the question needs `facts`
    supporting sentences. The first story sentence comes at relative depth `depth` of the filler (uniform in
    [0, 1] if None); the rest follow in order at random places between there and the end. The answer is one
    word: a place (qa1 to qa4), a person or a thing (qa5).

    facts=1 (qa1): people walk about; "Where is Mary?" is the last place Mary went to (she always goes
        somewhere else first, and others walk too).
    facts=2 (qa2): the hero goes to a place, picks up a thing there and walks to a new place, where the thing
        is now; half the time the hero then drops it and walks on, and the thing stays. "Where is the apple?"
        is that place. Someone else carries another object about.
    facts=3 (qa3): the thing's trail is the place where it was picked up, then each place its carrier went to
        while holding it: here 3 or 4 distinct places, after which it may be dropped (the hero walks on to a
        fifth place). "Where was the apple before the B?", with B the last place of the trail, asks for the
        place just before B in the trail.
    facts=4 (qa4, two-argument relations): two sentences place three rooms in a line ("The office is north of the
        kitchen."); "What is north of the kitchen?" or "What is the kitchen north of?" asks for one of the ends.
    facts=5 (qa5, three-argument relations): a thing is handed along 2 or 3 people while another changes hands
        once; "Who gave the apple to John?", "Who did Mary give the apple to?" or "What did Mary give to John?".
        The answer is a person or a thing.
    (facts names bAbI's task: qa4 and qa5 need one supporting fact each, the relation asked about.)

    Example, babilong(120, seed=0, count_tokens=lambda s: len(s.split()), facts=3, depth=0.3), 118 words; the
    football's trail is bathroom, garden, office (Mary's milk and everyone's walks are distractors):
        prompt = "Below is a long text. A few of its sentences tell where people and objects are; the rest does
                  not matter. Read it and answer the question at the end.

                  Quietly, the sky is clear. Sandra went to the garden. Mary went to the bedroom. Once more, the
                  wind blows softly as always. Mary grabbed the milk. The sun shines warmly in the morning. Daniel
                  travelled to the bathroom. John went to the office. Daniel took the football. Daniel travelled
                  to the garden. John travelled to the hallway. The mountains stand tall at dusk. Daniel went back
                  to the office. Mary went back to the bathroom.

                  Question: Where was the football before the office? Answer with one word."
        answer = "garden"
    """
    if facts not in (1, 2, 3, 4, 5):
        raise ValueError(f"babilong needs facts in 1 to 5 (bAbI's qa1 to qa5), got facts={facts}")
    rng = random.Random(seed)
    depth = _depth(rng.random(), depth, "babilong")
    story, question, answer = {4: _babi_relations, 5: _babi_giving}.get(facts, lambda r: _babi_story(r, facts))(rng)
    where = [depth] + sorted(depth + (1 - depth) * rng.random() for _ in story[1:])
    filler = _Stream(_filler(random.Random(rng.getrandbits(64))))

    def build(k):
        text = " ".join(_weave(filler.first(k), story, where))
        return ("Below is a long text. A few of its sentences tell where people and objects are; the rest does "
                f"not matter. Read it and answer the question at the end.\n\n{text}\n\n"
                f"Question: {question} Answer with one word.")

    return _fit("babilong", length, count_tokens, build), answer


# MRCR's conversation: requests are a kind of piece about a topic; replies are short generated word strings,
# so that reproducing one exactly is a fair test of retrieval rather than of writing
_KINDS = ("write a short poem about", "write a riddle about", "write a haiku about", "write a joke about",
          "write a slogan about", "write a limerick about", "write a fun fact about", "write a short story about")
_TOPICS = ("tapirs", "the sea", "autumn", "coffee", "robots", "mountains", "libraries", "owls", "rain",
           "bicycles", "lanterns", "glaciers")
_ADJECTIVES = ("silver", "quiet", "amber", "golden", "gentle", "hollow", "bright", "velvet", "restless", "ancient")
_NOUNS = ("moon", "harbor", "lantern", "meadow", "whisper", "feather", "ember", "pebble", "shadow", "orchard")
_VERBS = ("wanders", "hums", "drifts", "glows", "waits", "dances", "sleeps", "turns", "rests", "sings")
_ADVERBS = ("softly", "slowly", "always", "gladly", "alone", "again", "still", "twice")
_PREPOSITIONS = ("beneath", "beyond", "across", "inside", "toward", "behind", "above", "near")


def _reply(rng):
    """
    A reply of 6 to 10 words: adjective noun verb [adverb] preposition the [adjective] noun [and verb], e.g.
    'Amber lantern drifts softly beneath the quiet harbor.'
    """
    words = [rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADVERBS))
    words += [rng.choice(_PREPOSITIONS), "the"]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADJECTIVES))
    words.append(rng.choice(_NOUNS))
    if rng.random() < 0.5:
        words += ["and", rng.choice(_VERBS)]
    return " ".join(words).capitalize() + "."


def _ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _mrcr_conversation(rng, needles):
    """
    (request, its `needles` distinct replies, their sorted depths in [0, 1), a _Stream of distractor turns),
    drawn from `rng` in that order; the distractors draw from their own generator, seeded from `rng`.
    """
    kind, topic = rng.choice(_KINDS), rng.choice(_TOPICS)
    replies = []
    while len(replies) < needles:  # distinct, so "the i-th reply" names one string
        reply = _reply(rng)
        if reply not in replies:
            replies.append(reply)
    where = sorted(rng.random() for _ in range(needles))
    turns = _Stream(_distractors(random.Random(rng.getrandbits(64)), (kind, topic)))
    return f"{kind} {topic}", replies, where, turns


def _distractors(rng, asked):
    """Endless User/Assistant turns whose (kind, topic) request is never `asked`, though it may share one."""
    while True:
        other = (rng.choice(_KINDS), rng.choice(_TOPICS))
        if other != asked:
            yield f"User: {other[0]} {other[1]}\nAssistant: {_reply(rng)}"


def mrcr(length, seed, count_tokens, needles=4, index=None):
    """
    A long User/Assistant conversation of short requests (a kind of piece about a topic) with generated
    replies. One request appears `needles` times, each with a different reply, at random places; the final
    user turn asks for the reply to its `index`-th occurrence (1-based; uniform in 1..needles if None).
    The answer is that reply, word for word. Other requests may share the kind or the topic, never both.

    Example, mrcr(90, seed=3, count_tokens=lambda s: len(s.split()), needles=2, index=2), 77 words:
        prompt = "Below is a conversation between a user and an assistant.

                  User: write a haiku about mountains
                  Assistant: Ancient pebble sings softly near the golden meadow.

                  User: write a joke about tapirs
                  Assistant: Bright feather hums across the feather and turns.

                  User: write a haiku about mountains
                  Assistant: Velvet shadow rests always inside the shadow and wanders.

                  User: Reproduce the 2nd reply you gave to "write a haiku about mountains", word for word.
                  Answer with that reply only."
        answer = "Velvet shadow rests always inside the shadow and wanders."
    """
    if needles < 1:
        raise ValueError(f"mrcr needs needles >= 1, got needles={needles}")
    rng = random.Random(seed)
    drawn = rng.randint(1, needles)
    index = drawn if index is None else index
    if not 1 <= index <= needles:
        raise ValueError(f"mrcr needs 1 <= index <= needles={needles}, got index={index}")
    request, replies, where, turns = _mrcr_conversation(rng, needles)
    asked = [f"User: {request}\nAssistant: {reply}" for reply in replies]

    def build(k):
        conversation = "\n\n".join(_weave(turns.first(k), asked, where))
        return (f"Below is a conversation between a user and an assistant.\n\n{conversation}\n\n"
                f"User: Reproduce the {_ordinal(index)} reply you gave to \"{request}\", word for word. "
                "Answer with that reply only.")

    return _fit("mrcr", length, count_tokens, build), replies[index - 1]


# -----------------------------------------------------------------------------
# text registry and scoring


TEXT_TASKS: dict[str, Callable] = {"passkey": passkey, "babilong": babilong, "mrcr": mrcr}


def answer_candidates(name, options=None):
    """Where every answer is one of a few words, a model can also be scored by how it ranks the right one among
    them: babilong's places (qa1 to qa4), its people and things (qa5); () for the other tasks."""
    if name != "babilong":
        return ()
    return PEOPLE + OBJECTS if (options or {}).get("facts") == 5 else PLACES


def text_task_options(name):
    """The text task's options and their defaults, read from its signature (after length, seed, count_tokens)."""
    if name not in TEXT_TASKS:
        raise ValueError(f"unknown text task '{name}'; choose from {', '.join(TEXT_TASKS)}")
    parameters = list(inspect.signature(TEXT_TASKS[name]).parameters.values())[3:]
    return {p.name: p.default for p in parameters}


def make_text_sample(name, length, seed, count_tokens, **options):
    """Make one (prompt, answer) of the named text task, with count_tokens(prompt) <= length; see each docstring."""
    unknown = sorted(set(options) - set(text_task_options(name)))
    if unknown:
        raise ValueError(f"text task '{name}' has no option {', '.join(unknown)}; "
                         f"its options are {', '.join(text_task_options(name))}")
    return TEXT_TASKS[name](length, seed, count_tokens, **options)


def _words(text):
    """Lowercase, drop punctuation, split on whitespace: 'The Kitchen!' -> ['the', 'kitchen']."""
    return re.sub(r"[^\w\s]", "", text.lower()).split()


def answer_matches(generated, answer):
    """
    Match after normalising both strings (lowercase, punctuation dropped, whitespace collapsed): True when
    the answer's words occur in the generation as a run of whole words, as BABILong and passkey scoring do.
    So for the answer "kitchen", "Kitchen.", "The kitchen." and "kitchen, because Mary went there last"
    match; "kitchens", "The answer is Mary." and "" do not. For mrcr the whole reply must appear, word for
    word. An empty answer never matches.
    """
    expected, said = _words(answer), _words(generated)
    return bool(expected) and any(said[i:i + len(expected)] == expected
                                  for i in range(len(said) - len(expected) + 1))
