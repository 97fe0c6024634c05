"""Digit words as text: a word-level tokenizer and the captions the variant models read and write.

The vocabulary is closed and tiny: three specials, the ten digit names, the ten numerals and four filler
words. A caption is ``BOS w_1 … w_n EOS`` padded with ``PAD`` to a fixed length::

    "seven"            → [BOS, seven, EOS, PAD, …]
    "a 7"              → [BOS, a, 7, EOS, PAD, …]
    "three one four"   → [BOS, three, one, four, EOS, PAD, …]

``caption(d, template)`` writes one digit in one of :data:`TEMPLATES`; ``PROMPTS`` are the ten zero-shot
prompts (``"the digit seven"``); ``sequence_caption(digits)`` spells a canvas left to right
("three one four").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["BOS", "EOS", "PAD", "PROMPTS", "TEMPLATES", "VOCAB", "VOCAB_SIZE", "WORDS", "DigitTokenizer",
           "caption", "sequence_caption"]

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPECIALS = ("<pad>", "<bos>", "<eos>")
FILLERS = ("a", "the", "digit", "number")
VOCAB = (*SPECIALS, *WORDS, *(str(d) for d in range(10)), *FILLERS)
VOCAB_SIZE = len(VOCAB)
PAD, BOS, EOS = 0, 1, 2
TEMPLATES = ("{word}", "a {num}", "a {word}", "the digit {word}", "the number {num}")
PROMPT_TEMPLATE = "the digit {word}"
PROMPTS = tuple(PROMPT_TEMPLATE.format(word=w) for w in WORDS)


def caption(digit: int, template: str = PROMPT_TEMPLATE) -> str:
    """One digit in words: ``caption(7, "a {num}") == "a 7"``."""
    if not 0 <= int(digit) <= 9:
        raise ValueError(f"digit must be in 0..9, got {digit}")
    return template.format(word=WORDS[int(digit)], num=str(int(digit)))


def sequence_caption(digits: Sequence[int]) -> str:
    """A canvas left to right: ``sequence_caption([3, 1, 4]) == "three one four"``."""
    return " ".join(WORDS[int(d)] for d in digits)


class DigitTokenizer:
    """Word-level tokenizer over :data:`VOCAB`; ``encode`` pads (or refuses) to ``max_len`` tokens."""

    def __init__(self, max_len: int = 8) -> None:
        if not isinstance(max_len, int) or max_len < 3:
            raise ValueError(f"max_len must be an int ≥ 3 (BOS, a word, EOS), got {max_len!r}")
        self.max_len = max_len
        self.index = {w: i for i, w in enumerate(VOCAB)}

    def ids(self, text: str) -> list[int]:
        """``BOS w_1 … w_n EOS`` without padding."""
        out = [BOS]
        for w in text.split():
            if w not in self.index or w in SPECIALS:
                raise ValueError(f"word {w!r} in {text!r} is not in the vocabulary {VOCAB[3:]}")
            out.append(self.index[w])
        return out + [EOS]

    def encode(self, texts: str | Sequence[str]) -> torch.Tensor:
        """Texts → (B, max_len) int64 ids, padded with PAD."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        out = torch.full((len(texts), self.max_len), PAD, dtype=torch.long)
        for i, t in enumerate(texts):
            ids = self.ids(t)
            if len(ids) > self.max_len:
                raise ValueError(f"{t!r} is {len(ids)} tokens with BOS and EOS, more than "
                                 f"max_len={self.max_len}")
            out[i, : len(ids)] = torch.tensor(ids)
        return out

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Ids → text: BOS skipped, stops at the first EOS or PAD."""
        words = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == BOS:
                continue
            if i in (EOS, PAD):
                break
            words.append(VOCAB[i])
        return " ".join(words)

    def digits(self, ids: torch.Tensor | Sequence[int]) -> list[int]:
        """The digit names in a decoded caption, in order (other words dropped)."""
        return [WORDS.index(w) for w in self.decode(ids).split() if w in WORDS]
