"""Tokenizer of the built-in tiny masked-diffusion LM: characters plus whole words.

Three special tokens, then one token per character of a fixed, explicit alphabet, then (optional)
whole lowercase words learned from the training split. Any text over the alphabet round-trips: a
word outside the vocabulary is spelled out in characters. Token ids are part of the checkpoint's
contract, so the alphabet is append-only: never reorder it, only add characters at the end (and
retrain); the word list is saved with the checkpoint.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

PAD_TOKEN = "<pad>"
MASK_TOKEN = "<mask>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS = (PAD_TOKEN, MASK_TOKEN, EOS_TOKEN)  # ids 0, 1, 2

# Lowercase letters, digits, space, newline, then the punctuation the task suites use.
CHARACTERS = (
    "abcdefghijklmnopqrstuvwxyz"
    "0123456789"
    " \n"
    ".,:;=+-*?#|()'_/!"
)

TOKENIZER_FILE = "tokenizer.json"

# Whole lowercase words may be single tokens (a word vocabulary learned from the training data by
# scripts/train_tiny_dlm.py); anything else, and any word not in the vocabulary, is spelled out in
# characters, so every text over the alphabet round-trips.
_WORD = re.compile(r"[a-z]+")
_PIECES = re.compile(r"[a-z]+|[^a-z]+")


class TinyCharTokenizer:
    """Character tokenizer, with optional whole-word tokens, and a minimal Hugging Face-like interface.

    Whole-word tokens shorten sequences about threefold on the task suites and turn copying a
    name into copying one token, which a model this small learns far sooner than spelling it out.

    `encode` never adds special tokens (a masked-diffusion prompt has no BOS); the flag is
    accepted for interface compatibility only. Unknown characters raise `ValueError`.

    Prompt convention: the model was trained on `prompt + "\n"` followed by the response, so a
    prompt must end with `prompt_suffix`. `format_prompt` adds it unless the text already ends
    with it (so formatting twice changes nothing) and `encode_prompt` returns the ids the model
    expects; `DLMPipeline`, the `dlm` CLI and the benchmark all go through them.
    """

    prompt_suffix = "\n"

    def __init__(self, characters: str = CHARACTERS, words: Sequence[str] = ()):
        if len(set(characters)) != len(characters):
            raise ValueError("tokenizer characters must be distinct")
        words = tuple(words)
        bad = [w for w in words if not _WORD.fullmatch(w) or len(w) < 2]
        if bad or len(set(words)) != len(words):
            raise ValueError(f"tokenizer words must be distinct runs of 2+ lowercase letters, got {bad or 'duplicates'}")
        self.characters = characters
        self.words = words
        # Words come after the characters, so character ids are the same with or without words.
        self._itos: list[str] = list(SPECIAL_TOKENS) + list(characters) + list(words)
        self._stoi: dict[str, int] = {s: i for i, s in enumerate(self._itos)}
        self._word_ids = {w: self._stoi[w] for w in words}
        self.pad_token, self.mask_token, self.eos_token = SPECIAL_TOKENS
        self.pad_token_id = 0
        self.mask_token_id = 1
        self.eos_token_id = 2
        self.padding_side = "left"

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        return [self.pad_token_id, self.mask_token_id, self.eos_token_id]

    def get_vocab(self) -> dict[str, int]:
        return dict(self._stoi)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = []
        for match in _PIECES.finditer(text):
            word_id = self._word_ids.get(match.group())
            if word_id is not None:
                ids.append(word_id)
                continue
            ids.extend(self._encode_chars(match.group(), match.start()))
        return ids

    def format_prompt(self, text: str) -> str:
        """The model's input text for a user prompt: `text` ending in `prompt_suffix` (idempotent)."""
        return text if text.endswith(self.prompt_suffix) else text + self.prompt_suffix

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of `format_prompt(text)`: what `dlm.generate` needs as a prompt for the tiny model."""
        return self.encode(self.format_prompt(text))

    def _encode_chars(self, text: str, offset: int) -> list[int]:
        ids = []
        for pos, ch in enumerate(text, start=offset):
            i = self._stoi.get(ch)
            if i is None or i < len(SPECIAL_TOKENS):
                raise ValueError(
                    f"character {ch!r} at position {pos} is not in the tiny-dlm alphabet "
                    f"(lowercase a-z, digits, space, newline and {CHARACTERS[38:]!r})"
                )
            ids.append(i)
        return ids

    def __call__(self, text, add_special_tokens: bool = False):
        if isinstance(text, str):
            return {"input_ids": self.encode(text)}
        return {"input_ids": [self.encode(t) for t in text]}

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
            out.append(self._itos[i])
        return out

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        special = set(self.all_special_ids)
        toks = [t for i, t in zip(ids, self.convert_ids_to_tokens(ids))
                if not (skip_special_tokens and int(i) in special)]
        return "".join(toks)

    def batch_decode(self, sequences, skip_special_tokens: bool = True) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, save_directory: str | os.PathLike) -> list[str]:
        d = Path(save_directory)
        d.mkdir(parents=True, exist_ok=True)
        spec = {
            "tokenizer_class": "TinyCharTokenizer",
            "special_tokens": list(SPECIAL_TOKENS),
            "characters": self.characters,
            "words": list(self.words),
            "pad_token_id": self.pad_token_id,
            "mask_token_id": self.mask_token_id,
            "eos_token_id": self.eos_token_id,
        }
        path = d / TOKENIZER_FILE
        path.write_text(json.dumps(spec, indent=2) + "\n")
        return [str(path)]

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "TinyCharTokenizer":
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}")
        spec = json.loads(path.read_text())
        if spec.get("special_tokens") != list(SPECIAL_TOKENS):
            raise ValueError(f"{path}: unexpected special tokens {spec.get('special_tokens')}")
        return cls(spec["characters"], spec.get("words", ()))

    def pad_batch(self, batch: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """Left-pad id lists to one length; returns (input_ids, attention_mask)."""
        n = max(len(s) for s in batch)
        ids = [[self.pad_token_id] * (n - len(s)) + list(s) for s in batch]
        att = [[0] * (n - len(s)) + [1] * len(s) for s in batch]
        return ids, att
