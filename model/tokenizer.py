"""Word-level tokenizer over the grammar's vocabulary.

The vocabulary file (model/weights/vocab.json) stores the token list and, for
every verb, which token is its base / -s / past / -ing form, so predictions
can be checked by category without a hard-coded word list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from model import grammar

DEFAULT_VOCAB = Path(__file__).resolve().parent / "weights" / "vocab.json"
_WORD_RE = re.compile(r"[a-z]+|[.,?!]|\S")


class UnknownWordError(ValueError):
    """A word that is not in the vocabulary."""


class Tokenizer:
    def __init__(self, tokens: list[str], verbs: list[dict[str, str]]):
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary has duplicate tokens")
        self.id_to_token = list(tokens)
        self.token_to_id = {t: i for i, t in enumerate(tokens)}
        self.verbs = [dict(v) for v in verbs]
        self._form: dict[int, str] = {}
        for v in self.verbs:
            for form in grammar.FORMS:
                tok = v[form]
                if tok not in self.token_to_id:
                    raise ValueError(f"verb form {tok!r} missing from the token list")
                tid = self.token_to_id[tok]
                if tid in self._form:
                    raise ValueError(f"token {tok!r} is listed as more than one verb form")
                self._form[tid] = form
        for name in grammar.SPECIALS:
            if name not in self.token_to_id:
                raise ValueError(f"special token {name!r} missing from the vocabulary")
        self.pad_id = self.token_to_id["<pad>"]
        self.bos_id = self.token_to_id["<bos>"]
        self.eos_id = self.token_to_id["<eos>"]

    # --- construction / persistence -------------------------------------------------
    @classmethod
    def from_grammar(cls) -> Tokenizer:
        return cls(grammar.vocabulary(), grammar.verb_table())

    @classmethod
    def load(cls, path: str | Path | None = None) -> Tokenizer:
        path = Path(path) if path is not None else DEFAULT_VOCAB
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            tokens, verbs = data["tokens"], data["verbs"]
        except FileNotFoundError:
            raise FileNotFoundError(f"vocabulary file not found: {path}") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"cannot read vocabulary file {path}: {e}") from None
        return cls(tokens, verbs)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"tokens": self.id_to_token, "verbs": self.verbs, "forms": list(grammar.FORMS)}
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    # --- text <-> ids -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def split(self, text: str) -> list[str]:
        return _WORD_RE.findall(text.lower())

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in self.split(text):
            if word not in self.token_to_id:  # text names no special: "<bos>" splits into "<", "bos", ">"
                raise UnknownWordError(f"unknown word {word!r}: not in the vocabulary")
            ids.append(self.token_to_id[word])
        return ids

    def decode(self, ids) -> str:
        out = ""
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
            tok = self.id_to_token[i]
            if tok in ("<pad>", "<bos>", "<eos>"):
                continue
            out += tok if (tok in grammar.PUNCT or not out) else " " + tok
        return out

    # --- verb categories --------------------------------------------------------------
    def verb_form(self, token) -> str | None:
        """'base' | 's' | 'past' | 'ing' for a verb token (str or id), else None."""
        tid = self.token_to_id.get(token) if isinstance(token, str) else int(token)
        return self._form.get(tid) if tid is not None else None

    def tokens_of_form(self, form: str) -> set[int]:
        if form not in grammar.FORMS:
            raise ValueError(f"unknown verb form {form!r}; expected one of {grammar.FORMS}")
        return {tid for tid, f in self._form.items() if f == form}
