"""A small synthetic English grammar with tense/agreement rules.

Every sentence opens with a time expression (or a frequency adverb right after
the subject), so the correct verb form is always decidable from the words to
its left -- a causal language model can therefore be scored at verb positions:

    past time   (yesterday, last night, two days ago ...)  -> past simple
    habitual    (every day, usually, often ...)            -> present simple,
                                                              -s after he/she/it
    future      (tomorrow, next week ...)                  -> will + base
    now         (now, right now, at the moment)            -> am/is/are + -ing

Sentences are drawn deterministically from a seed (`generate_corpus`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FORMS = ("base", "s", "past", "ing")

# Verb frames decide what may follow the verb, so sentences stay roughly sensible.
#   food  : takes a food object          thing : takes a thing object
#   person: takes a person object        place : "to" + a place
#   none  : intransitive, optional prepositional phrase
# (base, third-person -s, past simple, -ing, frame). Verbs whose forms coincide
# (put/put/put, read/read, cut, hit, set ...) are deliberately absent, so every
# verb token belongs to exactly one form.
VERBS = [
    # irregular past
    ("go", "goes", "went", "going", "place"),
    ("see", "sees", "saw", "seeing", "thing"),
    ("eat", "eats", "ate", "eating", "food"),
    ("take", "takes", "took", "taking", "thing"),
    ("come", "comes", "came", "coming", "place"),
    ("make", "makes", "made", "making", "food"),
    ("give", "gives", "gave", "giving", "thing"),
    ("get", "gets", "got", "getting", "thing"),
    ("find", "finds", "found", "finding", "thing"),
    ("buy", "buys", "bought", "buying", "food"),
    ("bring", "brings", "brought", "bringing", "thing"),
    ("drink", "drinks", "drank", "drinking", "drinkable"),
    ("drive", "drives", "drove", "driving", "place"),
    ("write", "writes", "wrote", "writing", "thing"),
    ("speak", "speaks", "spoke", "speaking", "none"),
    ("sing", "sings", "sang", "singing", "none"),
    ("swim", "swims", "swam", "swimming", "none"),
    ("run", "runs", "ran", "running", "place"),
    ("sit", "sits", "sat", "sitting", "none"),
    ("stand", "stands", "stood", "standing", "none"),
    ("sleep", "sleeps", "slept", "sleeping", "none"),
    ("leave", "leaves", "left", "leaving", "thing"),
    ("meet", "meets", "met", "meeting", "person"),
    ("teach", "teaches", "taught", "teaching", "person"),
    ("catch", "catches", "caught", "catching", "thing"),
    ("fly", "flies", "flew", "flying", "place"),
    ("draw", "draws", "drew", "drawing", "thing"),
    ("throw", "throws", "threw", "throwing", "thing"),
    ("break", "breaks", "broke", "breaking", "thing"),
    ("choose", "chooses", "chose", "choosing", "thing"),
    ("forget", "forgets", "forgot", "forgetting", "thing"),
    ("begin", "begins", "began", "beginning", "none"),
    ("ride", "rides", "rode", "riding", "place"),
    ("win", "wins", "won", "winning", "thing"),
    ("lose", "loses", "lost", "losing", "thing"),
    ("sell", "sells", "sold", "selling", "food"),
    ("tell", "tells", "told", "telling", "person"),
    ("hold", "holds", "held", "holding", "thing"),
    ("keep", "keeps", "kept", "keeping", "thing"),
    ("feel", "feels", "felt", "feeling", "none"),
    ("build", "builds", "built", "building", "thing"),
    ("send", "sends", "sent", "sending", "thing"),
    ("spend", "spends", "spent", "spending", "none"),
    ("pay", "pays", "paid", "paying", "person"),
    ("wear", "wears", "wore", "wearing", "thing"),
    ("grow", "grows", "grew", "growing", "food"),
    ("know", "knows", "knew", "knowing", "person"),
    ("hide", "hides", "hid", "hiding", "thing"),
    ("shake", "shakes", "shook", "shaking", "thing"),
    ("wake", "wakes", "woke", "waking", "none"),
    ("fall", "falls", "fell", "falling", "none"),
    ("feed", "feeds", "fed", "feeding", "person"),
    # regular past
    ("walk", "walks", "walked", "walking", "place"),
    ("play", "plays", "played", "playing", "none"),
    ("cook", "cooks", "cooked", "cooking", "food"),
    ("clean", "cleans", "cleaned", "cleaning", "thing"),
    ("watch", "watches", "watched", "watching", "thing"),
    ("visit", "visits", "visited", "visiting", "person"),
    ("call", "calls", "called", "calling", "person"),
    ("help", "helps", "helped", "helping", "person"),
    ("open", "opens", "opened", "opening", "thing"),
    ("close", "closes", "closed", "closing", "thing"),
    ("wash", "washes", "washed", "washing", "thing"),
    ("paint", "paints", "painted", "painting", "thing"),
    ("carry", "carries", "carried", "carrying", "thing"),
    ("study", "studies", "studied", "studying", "none"),
    ("dance", "dances", "danced", "dancing", "none"),
    ("jump", "jumps", "jumped", "jumping", "none"),
    ("climb", "climbs", "climbed", "climbing", "none"),
    ("talk", "talks", "talked", "talking", "none"),
    ("work", "works", "worked", "working", "none"),
    ("travel", "travels", "traveled", "traveling", "place"),
    ("wait", "waits", "waited", "waiting", "none"),
    ("laugh", "laughs", "laughed", "laughing", "none"),
    ("smile", "smiles", "smiled", "smiling", "none"),
    ("move", "moves", "moved", "moving", "thing"),
    ("love", "loves", "loved", "loving", "person"),
    ("like", "likes", "liked", "liking", "food"),
    ("want", "wants", "wanted", "wanting", "food"),
    ("need", "needs", "needed", "needing", "thing"),
    ("use", "uses", "used", "using", "thing"),
    ("finish", "finishes", "finished", "finishing", "food"),
    ("start", "starts", "started", "starting", "none"),
    ("stop", "stops", "stopped", "stopping", "none"),
    ("fix", "fixes", "fixed", "fixing", "thing"),
    ("push", "pushes", "pushed", "pushing", "thing"),
    ("pull", "pulls", "pulled", "pulling", "thing"),
    ("kick", "kicks", "kicked", "kicking", "thing"),
    ("kiss", "kisses", "kissed", "kissing", "person"),
    ("hug", "hugs", "hugged", "hugging", "person"),
    ("miss", "misses", "missed", "missing", "person"),
    ("enjoy", "enjoys", "enjoyed", "enjoying", "food"),
    ("order", "orders", "ordered", "ordering", "food"),
    ("answer", "answers", "answered", "answering", "person"),
    ("ask", "asks", "asked", "asking", "person"),
    ("borrow", "borrows", "borrowed", "borrowing", "thing"),
    ("join", "joins", "joined", "joining", "person"),
    ("learn", "learns", "learned", "learning", "none"),
    ("plant", "plants", "planted", "planting", "food"),
    ("prepare", "prepares", "prepared", "preparing", "food"),
    ("share", "shares", "shared", "sharing", "food"),
    ("try", "tries", "tried", "trying", "food"),
    ("bake", "bakes", "baked", "baking", "food"),
    ("return", "returns", "returned", "returning", "place"),
]

PRONOUNS = {  # pronoun -> agreement class
    "i": "1sg",
    "you": "pl",
    "he": "3sg",
    "she": "3sg",
    "it": "3sg",
    "we": "pl",
    "they": "pl",
}
SUBJECT_NOUNS_SG = [
    "dog",
    "cat",
    "teacher",
    "doctor",
    "farmer",
    "student",
    "baby",
    "boy",
    "girl",
    "man",
    "woman",
    "child",
    "friend",
    "brother",
    "sister",
    "mother",
    "father",
    "neighbor",
    "uncle",
    "aunt",
]
SUBJECT_NOUNS_PL = [
    "dogs",
    "cats",
    "teachers",
    "doctors",
    "students",
    "boys",
    "girls",
    "men",
    "women",
    "children",
    "friends",
    "sisters",
    "parents",
    "neighbors",
]
SUBJECT_DETS = ["the", "my", "your", "his", "her", "our", "their"]
OBJECT_DETS = ["the", "a", "my", "your", "his", "her", "our", "their", "this", "that"]

FOOD = [
    "apple",
    "bread",
    "cake",
    "soup",
    "rice",
    "pizza",
    "salad",
    "egg",
    "orange",
    "banana",
    "sandwich",
    "cheese",
    "fish",
    "cookie",
]
DRINKABLE = ["tea", "coffee", "milk", "juice", "water", "lemonade"]
THINGS = [
    "book",
    "letter",
    "ball",
    "box",
    "bag",
    "phone",
    "key",
    "cup",
    "chair",
    "table",
    "door",
    "window",
    "car",
    "bike",
    "picture",
    "song",
    "story",
    "map",
    "hat",
    "coat",
    "umbrella",
    "bottle",
    "clock",
    "computer",
    "present",
    "kite",
]
PLACES = [
    "park",
    "school",
    "market",
    "library",
    "beach",
    "station",
    "office",
    "garden",
    "hospital",
    "river",
    "city",
    "village",
    "museum",
    "zoo",
    "shop",
    "kitchen",
    "airport",
    "lake",
]
PLACE_PREPS = ["in", "at", "near", "behind", "by"]
COMPANY_PREPS = ["with", "for"]

NUMBERS = ["two", "three", "four", "five", "six", "ten"]
PAST_TIME = (
    [["yesterday"], ["yesterday", "morning"], ["yesterday", "evening"]]
    + [["last", u] for u in ("night", "week", "month", "year", "summer", "winter", "monday", "friday")]
    + [[n, u, "ago"] for n in NUMBERS for u in ("days", "weeks", "months", "years", "hours")]
)
HABIT_TIME = [["every", u] for u in ("day", "morning", "evening", "week", "night", "summer", "monday", "friday")] + [
    ["on", "sundays"],
    ["on", "weekends"],
]
HABIT_ADVERBS = ["usually", "often", "always", "sometimes", "never", "rarely"]
FUTURE_TIME = (
    [["tomorrow"], ["tomorrow", "morning"], ["tomorrow", "evening"], ["soon"], ["later"]]
    + [["next", u] for u in ("week", "month", "year", "summer", "winter", "monday", "friday")]
    + [["in", n, u] for n in NUMBERS for u in ("days", "weeks", "months", "years", "hours")]
)
NOW_TIME = [["now"], ["right", "now"], ["at", "the", "moment"], ["today"]]
BE = {"1sg": "am", "3sg": "is", "pl": "are"}

PUNCT = [".", ",", "?", "!"]
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
FUNCTION_WORDS = ["am", "is", "are", "will", "to", "and", "home", "together", "a", "an", "some", "the"]
OBJECT_PRONOUNS = ["me", "him", "her", "us", "them"]
# "a bread" reads badly; these take "some" instead of a/an
MASS_NOUNS = {"bread", "soup", "rice", "cheese", "fish", "tea", "coffee", "milk", "juice", "water", "lemonade"}


@dataclass(frozen=True)
class Sentence:
    """A tokenised sentence plus, for each verb position, the verb form it requires."""

    tokens: tuple[str, ...]
    verb_positions: tuple[tuple[int, str], ...]  # (index into tokens, form)

    @property
    def text(self) -> str:
        return " ".join(self.tokens)


def _other_words() -> list[str]:
    """Every non-verb word, with repeats (e.g. "her" is a determiner and a pronoun)."""
    groups = [
        list(PRONOUNS),
        SUBJECT_NOUNS_SG,
        SUBJECT_NOUNS_PL,
        SUBJECT_DETS,
        OBJECT_DETS,
        FOOD,
        DRINKABLE,
        THINGS,
        PLACES,
        PLACE_PREPS,
        COMPANY_PREPS,
        NUMBERS,
        HABIT_ADVERBS,
        FUNCTION_WORDS,
        OBJECT_PRONOUNS,
        list(BE.values()),
        [w for phrase in PAST_TIME + HABIT_TIME + FUTURE_TIME + NOW_TIME for w in phrase],
    ]
    return [w for group in groups for w in group]


def vocabulary() -> list[str]:
    """All tokens in a fixed order: specials, punctuation, verbs, other words (deduplicated)."""
    words = [t for v in VERBS for t in v[:4]] + _other_words()
    seen: set[str] = set()
    ordered = []
    for w in SPECIALS + PUNCT + words:
        if w not in seen:
            seen.add(w)
            ordered.append(w)
    return ordered


def verb_table() -> list[dict[str, str]]:
    return [dict(zip(FORMS, v[:4], strict=True)) for v in VERBS]


def _check_tables() -> None:
    """Each verb token must name one form of one verb and never be a non-verb word."""
    verb_tokens = [t for v in VERBS for t in v[:4]]
    dupes = {t for t in verb_tokens if verb_tokens.count(t) > 1}
    if dupes:
        raise AssertionError(f"verb tokens used twice: {sorted(dupes)}")
    clash = set(_other_words()) & set(verb_tokens)
    if clash:
        raise AssertionError(f"tokens that are both verbs and other words: {sorted(clash)}")


_check_tables()


class _Generator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def pick(self, seq):
        return self.rng.choice(seq)

    def subject(self) -> tuple[list[str], str]:
        r = self.rng.random()
        if r < 0.55:
            p = self.pick(list(PRONOUNS))
            return [p], PRONOUNS[p]
        if r < 0.8:
            return [self.pick(SUBJECT_DETS), self.pick(SUBJECT_NOUNS_SG)], "3sg"
        return [self.pick(SUBJECT_DETS), self.pick(SUBJECT_NOUNS_PL)], "pl"

    def noun_phrase(self, nouns: list[str]) -> list[str]:
        det = self.pick(OBJECT_DETS)
        noun = self.pick(nouns)
        if det == "a" and noun in MASS_NOUNS:
            det = "some"
        elif det == "a" and noun[0] in "aeiou":
            det = "an"
        return [det, noun]

    def person(self) -> list[str]:
        r = self.rng.random()
        if r < 0.3:
            return [self.pick(OBJECT_PRONOUNS)]
        return [self.pick(SUBJECT_DETS), self.pick(SUBJECT_NOUNS_SG + SUBJECT_NOUNS_PL)]

    def complement(self, frame: str) -> list[str]:
        if frame == "food":
            out = self.noun_phrase(FOOD)
        elif frame == "drinkable":
            out = self.noun_phrase(DRINKABLE)
        elif frame == "thing":
            out = self.noun_phrase(THINGS)
        elif frame == "person":
            out = self.person()
        elif frame == "place":
            out = ["home"] if self.rng.random() < 0.15 else ["to", "the", self.pick(PLACES)]
        else:
            out = []
        # optional adjunct so the sentence length and the words after the verb vary
        r = self.rng.random()
        if r < 0.3:
            out += [self.pick(PLACE_PREPS), "the", self.pick(PLACES)]
        elif r < 0.45:
            out += [self.pick(COMPANY_PREPS)] + self.person()
        elif r < 0.5 and frame == "none":
            out += ["together"]
        return out

    def sentence(self) -> Sentence:
        tense = self.pick(["past", "habit", "future", "now"])
        subj, agr = self.subject()
        toks: list[str] = []
        verb_pos: list[tuple[int, str]] = []

        if tense == "past":
            form, aux = "past", []
            toks += self.pick(PAST_TIME)
        elif tense == "habit":
            form, aux = ("s" if agr == "3sg" else "base"), []
        elif tense == "future":
            form, aux = "base", ["will"]
            toks += self.pick(FUTURE_TIME)
        else:
            form, aux = "ing", [BE[agr]]
            toks += self.pick(NOW_TIME)

        if tense == "habit":
            r = self.rng.random()
            if r < 0.5:
                toks += self.pick(HABIT_TIME)
                toks += [","] if self.rng.random() < 0.2 else []
                toks += subj
            elif r < 0.8:
                toks += subj + [self.pick(HABIT_ADVERBS)]
            else:
                toks += [self.pick(HABIT_ADVERBS)] + subj
        else:
            toks += [","] if self.rng.random() < 0.2 else []
            toks += subj
        toks += aux

        n_verbs = 1 if self.rng.random() < 0.7 else 2
        for k in range(n_verbs):
            if k:
                toks.append("and")
            v = self.pick(VERBS)
            verb_pos.append((len(toks), form))
            toks.append(v[FORMS.index(form)])
            toks += self.complement(v[4])
        toks.append(".")
        return Sentence(tuple(toks), tuple(verb_pos))


# One prompt per tense and form of time expression: past, habitual (time phrase or adverb),
# future, and now. The tests judge the model's next word after each by its verb category.
TENSE_PROMPTS = (
    "Yesterday I",
    "Last week they",
    "Two days ago my sister",
    "Every day she",
    "Usually he",
    "On weekends the children",
    "Tomorrow I will",
    "Next week we will",
    "Right now we are",
    "Now he is",
    "At the moment the dog is",
)


def generate_corpus(n: int, seed: int = 0) -> list[Sentence]:
    """`n` sentences, identical for identical (n, seed)."""
    gen = _Generator(seed)
    return [gen.sentence() for _ in range(n)]


def max_sentence_length() -> int:
    """Upper bound on words per sentence: time 3, ',' 1, subject 2, adverb/aux 1,
    two verb phrases of verb 1 + complement 3 ("to the park") + adjunct 3, 'and' 1, '.' 1."""
    return 3 + 1 + 2 + 1 + 2 * (1 + 3 + 3) + 1 + 1  # = 23
