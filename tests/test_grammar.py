"""The synthetic grammar, its vocabulary and the word tokenizer."""

import itertools
import json

import pytest

from model import grammar
from model.numpy_minigpt import CONTEXT
from model.tokenizer import DEFAULT_VOCAB, Tokenizer, UnknownWordError

pytestmark = pytest.mark.cpu

PAST_MARKERS = {"yesterday", "last", "ago"}
HABIT_MARKERS = {"every", "on", "usually", "often", "always", "sometimes", "never", "rarely"}
FUTURE_MARKERS = {"tomorrow", "next", "soon", "later", "in"}
NOW_MARKERS = {"now", "right", "at", "today"}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_grammar()


@pytest.fixture(scope="module")
def corpus():
    return grammar.generate_corpus(3000, seed=123)


def test_vocabulary_size_and_verbs(tok):
    assert 550 <= tok.vocab_size <= 650
    assert len(grammar.VERBS) >= 100
    for form in grammar.FORMS:
        assert len(tok.tokens_of_form(form)) == len(grammar.VERBS)
    forms = [set(tok.tokens_of_form(f)) for f in grammar.FORMS]
    for i in range(len(forms)):
        for j in range(i + 1, len(forms)):
            assert not forms[i] & forms[j], "a token belongs to two verb forms"
    irregular = [v for v in grammar.verb_table() if not v["past"].endswith("ed")]
    regular = [v for v in grammar.verb_table() if v["past"].endswith("ed")]
    assert len(irregular) >= 30 and len(regular) >= 30


@pytest.mark.parametrize(
    "word,form",
    [
        ("went", "past"),
        ("saw", "past"),
        ("ate", "past"),
        ("took", "past"),
        ("goes", "s"),
        ("eat", "base"),
        ("swimming", "ing"),
        ("carries", "s"),
        ("studied", "past"),
    ],
)
def test_verb_form_lookup(tok, word, form):
    assert tok.verb_form(word) == form
    assert tok.verb_form(tok.token_to_id[word]) == form
    assert tok.token_to_id[word] in tok.tokens_of_form(form)


@pytest.mark.parametrize("word", ["the", "dog", "yesterday", "will", "is", ".", "<bos>"])
def test_non_verbs_have_no_form(tok, word):
    assert tok.verb_form(word) is None


def test_unknown_form_is_rejected(tok):
    with pytest.raises(ValueError, match="unknown verb form"):
        tok.tokens_of_form("future")


def test_corpus_is_deterministic():
    a = grammar.generate_corpus(300, seed=7)
    assert a == grammar.generate_corpus(300, seed=7)
    assert a != grammar.generate_corpus(300, seed=8)


def test_sentences_fit_the_context(corpus):
    longest = max(len(s.tokens) for s in corpus)
    assert longest <= grammar.max_sentence_length()
    assert grammar.max_sentence_length() + 2 - 1 <= CONTEXT  # <bos> + words + <eos>, shifted by one


def _expected_form(tokens, verb_index):
    """Re-derive the required verb form from the words themselves."""
    words = set(tokens[:verb_index])
    if tokens[verb_index - 1] == "will" or "will" in words:
        return "base"
    if {"am", "is", "are"} & words:
        return "ing"
    if PAST_MARKERS & words:
        return "past"
    assert HABIT_MARKERS & words, tokens
    third = {"he", "she", "it"} | set(grammar.SUBJECT_NOUNS_SG)
    subj = next(
        w for w in tokens if w in grammar.PRONOUNS or w in grammar.SUBJECT_NOUNS_SG or w in grammar.SUBJECT_NOUNS_PL
    )
    return "s" if subj in third else "base"


def test_labels_follow_the_agreement_rules(tok, corpus):
    seen = set()
    for s in corpus:
        labelled = {pos for pos, _ in s.verb_positions}
        verb_slots = {i for i, w in enumerate(s.tokens) if tok.verb_form(w) is not None}
        assert labelled == verb_slots, s.text
        for pos, form in s.verb_positions:
            assert tok.verb_form(s.tokens[pos]) == form, s.text
            assert _expected_form(s.tokens, pos) == form, s.text
            seen.add(form)
        # the tense is fixed by a time word somewhere before the first verb
        before = set(s.tokens[: min(labelled)])
        assert before & (PAST_MARKERS | HABIT_MARKERS | FUTURE_MARKERS | NOW_MARKERS), s.text
        assert s.tokens[-1] == "."
    assert seen == set(grammar.FORMS)


def test_subject_agreement_of_be(corpus):
    for s in corpus:
        for be, subjects in (("am", {"i"}), ("is", {"he", "she", "it"}), ("are", {"you", "we", "they"})):
            if be in s.tokens:
                before = s.tokens[s.tokens.index(be) - 1]
                if before in grammar.PRONOUNS:
                    assert before in subjects, s.text


def test_encode_decode_roundtrip(tok, corpus):
    for s in corpus[:200]:
        ids = tok.encode(s.text)
        assert [tok.id_to_token[i] for i in ids] == list(s.tokens)
        assert tok.encode(tok.decode(ids)) == ids


def test_articles_agree_with_their_nouns(corpus):
    """ "a" before a consonant, "an" before a vowel, "some" before a mass noun, in every sentence."""
    nouns = {"a": 0, "an": 0, "some": 0}
    for s in corpus:
        for det, noun in itertools.pairwise(s.tokens):
            if det == "an":
                assert noun[0] in "aeiou" and noun not in grammar.MASS_NOUNS, s.text
            elif det == "a":
                assert noun[0] not in "aeiou" and noun not in grammar.MASS_NOUNS, s.text
            elif det == "some" and noun in grammar.MASS_NOUNS:
                pass
            else:
                continue
            nouns[det] += 1
    assert min(nouns.values()) > 0, nouns  # each rule was exercised


def test_decode_attaches_every_punctuation_mark(tok):
    words = ["are", "you", "at", "home"]
    for mark in grammar.PUNCT:
        ids = tok.encode(" ".join(words)) + [tok.token_to_id[mark]]
        assert tok.decode(ids) == " ".join(words) + mark


def test_encode_is_case_insensitive(tok):
    assert tok.encode("Yesterday I WENT home.") == tok.encode("yesterday i went home .")
    assert tok.decode(tok.encode("Yesterday, I went home.")) == "yesterday, i went home."


@pytest.mark.parametrize(
    "text,word", [("Yesterday I flibbered", "flibbered"), ("the dog <bos>", "<"), ("tomorrow she will put", "put")]
)
def test_unknown_word_names_the_word(tok, text, word):
    with pytest.raises(UnknownWordError, match=f"unknown word '{word}'"):
        tok.encode(text)


def test_decode_rejects_bad_ids(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])


def test_vocab_file_roundtrip(tok, tmp_path):
    path = tmp_path / "vocab.json"
    tok.save(path)
    back = Tokenizer.load(path)
    assert back.id_to_token == tok.id_to_token
    assert all(back.verb_form(i) == tok.verb_form(i) for i in range(tok.vocab_size))


def test_committed_vocab_matches_grammar(tok):
    data = json.loads(DEFAULT_VOCAB.read_text())
    assert data["tokens"] == tok.id_to_token
    assert Tokenizer.load().verbs == grammar.verb_table()


def test_bad_vocab_file(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read vocabulary file"):
        Tokenizer.load(path)
    with pytest.raises(FileNotFoundError, match="vocabulary file not found"):
        Tokenizer.load(tmp_path / "missing.json")
