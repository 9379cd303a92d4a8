"""Tests for the long-context text tasks (text_tasks.py): budgets, determinism, answers re-derived from the prompt."""

import os
import re
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import text_tasks  # noqa: E402

torch.set_num_threads(1)


def words(s):
    return len(s.split())


def quarter_chars(s):
    return len(s) // 4


COUNTERS = {"words": words, "chars": quarter_chars}

# every task with the options worth covering
CASES = [
    ("passkey", {}),
    ("passkey", {"template": "varied"}),
    ("babilong", {"facts": 1}),
    ("babilong", {"facts": 2}),
    ("babilong", {"facts": 3}),
    ("babilong", {"facts": 4}),
    ("babilong", {"facts": 5}),
    ("mrcr", {}),
    ("mrcr", {"needles": 2}),
]
CASE_IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in options.items())}" for name, options in CASES]


def test_registry():
    assert set(text_tasks.TEXT_TASKS) == {"passkey", "babilong", "mrcr"}
    assert text_tasks.text_task_options("passkey") == {"depth": None, "template": "published"}
    assert text_tasks.text_task_options("babilong") == {"facts": 1, "depth": None}
    assert text_tasks.text_task_options("mrcr") == {"needles": 4, "index": None}


# -----------------------------------------------------------------------------
# length budget and determinism


@pytest.mark.parametrize("counter", sorted(COUNTERS))
@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
def test_prompt_fits_the_budget_and_nearly_fills_it(name, options, counter):
    count = COUNTERS[counter]
    for length in (200, 1000, 4000):
        prompt, answer = text_tasks.make_text_sample(name, length, 5, count, **options)
        n = count(prompt)
        assert n <= length
        if length >= 500:
            assert n >= 0.9 * length, (length, n)
        if counter == "words":
            # word counts add up exactly, so one more filler unit (at most ~20 words) would have gone over
            assert length - n <= 20, (length, n)
        assert answer and answer.strip() == answer


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
def test_counting_stays_cheap(name, options):
    calls = []

    def counting(s):
        calls.append(len(s))
        return words(s)

    prompt, _ = text_tasks.make_text_sample(name, 30000, 0, counting, **options)
    assert len(calls) <= 30, len(calls)
    assert max(calls) <= 1.5 * len(prompt), "never counts a prompt far longer than the budget"


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
def test_same_seed_same_text_other_seed_other_text(name, options):
    a = text_tasks.make_text_sample(name, 800, 11, words, **options)
    b = text_tasks.make_text_sample(name, 800, 11, words, **options)
    assert a == b
    others = {text_tasks.make_text_sample(name, 800, seed, words, **options) for seed in range(12, 17)}
    assert a not in others and len(others) == 5
    assert len({answer for _, answer in others | {a}}) >= 2


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
def test_one_seed_one_story_whatever_the_length_or_counter(name, options):
    # only the amount of filler changes: the answer stays, and a shorter prompt's filler is a prefix of a longer's
    samples = [text_tasks.make_text_sample(name, length, 4, count, **options)
               for length in (300, 900) for count in (words, quarter_chars)]
    assert len({answer for _, answer in samples}) == 1
    if name == "babilong":
        assert len({tuple(story_events(prompt)) for prompt, _ in samples}) == 1
    if name == "mrcr":
        assert len({tuple(replies_to_asked(prompt)[1]) for prompt, _ in samples}) == 1


# -----------------------------------------------------------------------------
# answers re-derived from the prompt alone


def body_of(prompt):
    """The text between the instruction paragraph and the question paragraph."""
    paragraphs = prompt.split("\n\n")
    return "\n\n".join(paragraphs[1:-1])


@pytest.mark.parametrize("template", text_tasks.PASSKEY_TEMPLATES)
def test_passkey_answer_is_the_number_in_the_key_sentence(template):
    for seed in range(30):
        prompt, answer = text_tasks.passkey(400, seed, words, template=template)
        found = re.findall(r"The pass key is (\d+)\. Remember it\. (\d+) is the pass key\.", prompt)
        assert len(found) == 1 and found[0][0] == found[0][1] == answer
        assert re.fullmatch(r"\d{5}", answer)
        assert re.findall(r"\d+", prompt) == [answer, answer], "the filler must hold no other number"
        assert prompt.rstrip().endswith("What is the pass key? The pass key is" if template == "published" else
                                        "What is the pass key? Answer with the number only.")
        assert answer == text_tasks.passkey(400, seed, words, template="varied")[1], "one key per seed"


def test_passkey_published_template_is_word_for_word():
    """Bug caught: a published prompt that drifts from Mohtashami & Jaggi's (landmark attention's run_test.py):
    its instruction, its five-sentence filler block repeated whole, the key line, the completion question."""
    prompt, key = text_tasks.passkey(300, 7, words, depth=0.5)
    task, *middle, question = prompt.split("\n")
    assert task == ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                    "them. I will quiz you about the important information there.")
    assert question == "What is the pass key? The pass key is"
    block = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    before, needle, after = middle
    assert needle == f"The pass key is {key}. Remember it. {key} is the pass key."
    for side in (before, after):
        assert side == " ".join([block] * (side.count("grass")))
    assert abs(before.count("grass") - after.count("grass")) <= 1


@pytest.mark.parametrize("template", text_tasks.PASSKEY_TEMPLATES)
def test_passkey_depth_places_the_key(template):
    def relative_position(depth):
        prompt, _ = text_tasks.passkey(2000, 3, words, depth=depth, template=template)
        body = body_of(prompt) if template == "varied" else "\n".join(prompt.split("\n")[1:-1])
        return body.index("The pass key is") / len(body)

    assert relative_position(0.0) == 0.0
    assert relative_position(1.0) > 0.95
    assert 0.4 < relative_position(0.5) < 0.6
    assert relative_position(0.2) < relative_position(0.4) < relative_position(0.8)


NAME = r"(Mary|John|Sandra|Daniel)"
MOVE = re.compile(NAME + r" (?:went to|moved to|travelled to|journeyed to|went back to) the (\w+)\.")
TAKE = re.compile(NAME + r" (?:picked up|got|grabbed|took) the (\w+)\.")
DROP = re.compile(NAME + r" (?:dropped|put down|discarded) the (\w+)\.")


def story_events(prompt):
    """The story as (kind, person, place or object) in the order the sentences appear in the prompt body."""
    events = []
    for kind, pattern in (("move", MOVE), ("take", TAKE), ("drop", DROP)):
        events += [(m.start(), kind, m.group(1), m.group(2)) for m in pattern.finditer(body_of(prompt))]
    return [event[1:] for event in sorted(events)]


def replay(events):
    """Simulate the bAbI world: where each person is, who holds what, and each object's trail of places."""
    at, holder, trail = {}, {}, {}
    for kind, who, what in events:
        if kind == "move":
            at[who] = what
            for thing, person in holder.items():
                if person == who:
                    trail[thing].append(what)
        elif kind == "take":
            assert who in at, "a person picks something up only after the story says where they are"
            assert holder.get(what) is None, "nobody takes an object someone else holds"
            holder[what] = who
            trail[what] = [at[who]]
        else:
            assert holder.get(what) == who, "only the holder drops an object"
            holder[what] = None
    return at, trail


@pytest.mark.parametrize("facts", [1, 2, 3])
def test_babilong_answer_replays_from_the_story(facts):
    for seed in range(40):
        prompt, answer = text_tasks.babilong(500, seed, words, facts=facts)
        events = story_events(prompt)
        # every mention of a person in the body is a parsed story sentence: the filler mentions nobody
        assert len(re.findall(r"\b" + NAME + r"\b", body_of(prompt))) == len(events)
        assert all(place in text_tasks.PLACES for kind, _, place in events if kind == "move")
        at, trail = replay(events)
        question = prompt.split("\n\n")[-1]
        assert question.endswith("Answer with one word.")
        if facts == 1:
            who = re.fullmatch(r"Question: Where is (\w+)\? Answer with one word\.", question).group(1)
            visits = [place for kind, person, place in events if kind == "move" and person == who]
            assert len(visits) >= 2, "the hero moves before the last move, so the last one must be picked"
            assert answer == at[who]
        elif facts == 2:
            thing = re.fullmatch(r"Question: Where is the (\w+)\? Answer with one word\.", question).group(1)
            assert answer == trail[thing][-1]
        else:
            thing, before = re.fullmatch(r"Question: Where was the (\w+) before the (\w+)\? Answer with one word\.",
                                         question).groups()
            assert trail[thing][-1] == before and trail[thing].count(before) == 1
            assert len(trail[thing]) >= 3
            assert answer == trail[thing][-2]
        assert answer in text_tasks.PLACES and len(answer.split()) == 1


def test_babilong_qa4_answer_follows_from_the_two_relations():
    """The answer re-derived from the prompt: the three rooms put in a line by the two sentences."""
    for seed in range(40):
        prompt, answer = text_tasks.babilong(300, seed, words, facts=4)
        relations = re.findall(r"The (\w+) is (north|south|east|west) of the (\w+)\.", body_of(prompt))
        assert len(relations) == 2 and len({way for _, way, _ in relations}) == 1
        question = prompt.split("\n\n")[-1]
        ask = re.fullmatch(r"Question: What is (?:(north|south|east|west) of the (\w+)|the (\w+) "
                           r"(north|south|east|west) of)\? Answer with one word\.", question)
        if ask.group(1):  # what is WAY of X: the room related to X as the subject
            assert [a for a, way, b in relations if b == ask.group(2)] == [answer]
        else:  # what is X WAY of: the room X is related to
            assert [b for a, way, b in relations if a == ask.group(3)] == [answer]
        assert answer in text_tasks.PLACES


def test_babilong_qa5_answer_follows_from_who_gave_what_to_whom():
    """The answer re-derived from the prompt: the one give that matches the question's two known parts."""
    gives = r"(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\."
    forms = {0: 0, 1: 0, 2: 0}
    for seed in range(60):
        prompt, answer = text_tasks.babilong(400, seed, words, facts=5)
        events = re.findall(gives, body_of(prompt))
        question = prompt.split("\n\n")[-1].removeprefix("Question: ").removesuffix(" Answer with one word.")
        if m := re.fullmatch(r"Who gave the (\w+) to (\w+)\?", question):
            found, forms[0] = [g for g, t, r in events if (t, r) == m.groups()], forms[0] + 1
        elif m := re.fullmatch(r"Who did (\w+) give the (\w+) to\?", question):
            found, forms[1] = [r for g, t, r in events if (g, t) == m.groups()], forms[1] + 1
        else:
            m = re.fullmatch(r"What did (\w+) give to (\w+)\?", question)
            found, forms[2] = [t for g, t, r in events if (g, r) == m.groups()], forms[2] + 1
        assert found == [answer]
        assert answer in text_tasks.answer_candidates("babilong", {"facts": 5})
    assert min(forms.values()) >= 10, forms


def test_babilong_depth_places_the_first_fact():
    def first_fact_position(depth):
        prompt, _ = text_tasks.babilong(3000, 2, words, facts=2, depth=depth)
        body = body_of(prompt)
        return MOVE.search(body).start() / len(body)

    assert first_fact_position(0.0) == 0.0
    assert 0.45 < first_fact_position(0.5) < 0.55
    assert first_fact_position(1.0) > 0.95
    # all the story comes after the depth
    prompt, _ = text_tasks.babilong(3000, 2, words, facts=3, depth=0.7)
    body = body_of(prompt)
    assert min(m.start() for m in re.finditer(r"\b" + NAME + r"\b", body)) / len(body) > 0.65


ORDINAL = re.compile(r'User: Reproduce the (\d+)(st|nd|rd|th) reply you gave to "([^"]+)", word for word\. '
                     r"Answer with that reply only\.$")


def replies_to_asked(prompt):
    """(the final question's ordinal, the replies to the asked request in order, all turns) from the prompt."""
    number, suffix, request = ORDINAL.search(prompt).groups()
    assert suffix == {"1": "st", "2": "nd", "3": "rd"}.get(number, "th")
    turns = re.findall(r"^User: (.+)\nAssistant: (.+)$", prompt, flags=re.MULTILINE)
    return int(number), [reply for asked, reply in turns if asked == request], turns


@pytest.mark.parametrize("needles", [1, 2, 4, 6])
def test_mrcr_answer_is_the_ith_reply_to_the_request(needles):
    for seed in range(25):
        prompt, answer = text_tasks.mrcr(600, seed, words, needles=needles)
        number, replies, turns = replies_to_asked(prompt)
        assert len(replies) == needles and len(set(replies)) == needles
        assert 1 <= number <= needles
        assert answer == replies[number - 1]
        assert 6 <= len(answer.split()) <= 10
        assert len(turns) > needles, "the conversation holds distractor turns too"


def test_mrcr_index_option_and_ordinals():
    prompts = [text_tasks.mrcr(500, 9, words, needles=12, index=i) for i in range(1, 13)]
    for i, (prompt, answer) in enumerate(prompts, start=1):
        number, replies, _ = replies_to_asked(prompt)
        assert number == i and answer == replies[i - 1]
    assert [text_tasks._ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th"]


# -----------------------------------------------------------------------------
# the docstring examples are what the functions produce


@pytest.mark.parametrize("fn, kwargs", [
    (text_tasks.passkey, dict(length=60, seed=0, depth=0.5, template="varied")),
    (text_tasks.babilong, dict(length=120, seed=0, facts=3, depth=0.3)),
    (text_tasks.mrcr, dict(length=90, seed=3, needles=2, index=2)),
])
def test_docstring_example(fn, kwargs):
    shown_prompt, shown_answer = re.search(r'prompt = "(.*?)"\n\s*answer = "(.*?)"', fn.__doc__, re.DOTALL).groups()
    prompt, answer = fn(count_tokens=words, **kwargs)
    assert " ".join(prompt.split()) == " ".join(shown_prompt.split())
    assert answer == shown_answer


# -----------------------------------------------------------------------------
# scoring


def test_answer_matches():
    assert text_tasks.answer_matches("kitchen", "kitchen")
    assert text_tasks.answer_matches("  Kitchen.\n", "kitchen")
    assert text_tasks.answer_matches("kitchen, because Mary went there last", "kitchen")
    assert text_tasks.answer_matches("68211", "68211")
    assert text_tasks.answer_matches("The pass key... 68211", "the pass key")
    assert text_tasks.answer_matches("The kitchen.", "kitchen")
    assert text_tasks.answer_matches("The pass key is 68211. Remember it.", "68211")
    reply = "Velvet shadow rests always inside the shadow and wanders."
    assert text_tasks.answer_matches("velvet shadow rests always inside the shadow and wanders", reply)
    assert text_tasks.answer_matches("Velvet shadow rests always inside the shadow and wanders.\nUser:", reply)
    assert not text_tasks.answer_matches("The answer is Mary.", "kitchen")
    assert not text_tasks.answer_matches("682110", "68211")
    assert not text_tasks.answer_matches("kitchens", "kitchen")
    assert not text_tasks.answer_matches("", "kitchen")
    assert not text_tasks.answer_matches("kitchen", "")
    assert not text_tasks.answer_matches("68212", "68211")
    assert not text_tasks.answer_matches("Velvet shadow rests always inside the shadow.", reply)
    assert not text_tasks.answer_matches("Velvet shadow rests inside always the shadow and wanders.", reply)


# -----------------------------------------------------------------------------
# bad input


def test_unknown_task_and_option():
    with pytest.raises(ValueError, match="unknown text task 'haystack'"):
        text_tasks.make_text_sample("haystack", 1000, 0, words)
    with pytest.raises(ValueError, match="no option hops"):
        text_tasks.make_text_sample("babilong", 1000, 0, words, hops=3)


@pytest.mark.parametrize("name, options", CASES, ids=CASE_IDS)
def test_too_short_length(name, options):
    for count in (words, quarter_chars):
        with pytest.raises(ValueError, match="needs length >="):
            text_tasks.make_text_sample(name, 20, 0, count, **options)


@pytest.mark.parametrize("name, options", [
    ("passkey", {"depth": 1.5}), ("passkey", {"depth": -0.1}), ("passkey", {"template": "grass"}),
    ("babilong", {"facts": 6}),
    ("babilong", {"facts": 0}), ("babilong", {"depth": 2}), ("mrcr", {"needles": 0}), ("mrcr", {"index": 0}),
    ("mrcr", {"needles": 3, "index": 4}),
])
def test_bad_options(name, options):
    with pytest.raises(ValueError):
        text_tasks.make_text_sample(name, 1000, 0, words, **options)
