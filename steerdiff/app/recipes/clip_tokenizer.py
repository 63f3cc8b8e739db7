"""CLIP byte-level BPE tokenizer files written from a word list, for small text-to-image pipelines built here
(the shipped shapes pipeline's recipe, the tests' tiny pipelines): no tokenizer download is needed."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table (Radford et al. 2019), which CLIP's BPE uses."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def learn_merges(words: list[str]) -> list[tuple[str, str]]:
    """BPE merges (Sennrich et al. 2016) learned on ``words`` until each word is one symbol (``</w>`` marks its end).

    Each round merges the most frequent adjacent pair (ties: the first in sorted order) everywhere, left to right,
    which is how CLIP's tokenizer applies merges in rank order, so every word then tokenizes as one token.
    """
    seqs = [[*w[:-1], w[-1] + "</w>"] for w in sorted(set(words))]
    merges: list[tuple[str, str]] = []
    while any(len(s) > 1 for s in seqs):
        counts = Counter(p for s in seqs for p in zip(s, s[1:], strict=False))
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for i, s in enumerate(seqs):
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == best:
                    out.append(s[j] + s[j + 1])
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
    return merges


def write_clip_tokenizer(directory: str | Path, words: Iterable[str] = ()) -> None:
    """Write CLIP tokenizer files (``vocab.json``, ``merges.txt``) for ``transformers.CLIPTokenizer``: every byte
    symbol (alone and word-final), the merge results of :func:`learn_merges` on ``words`` (each of them then one
    token; none given: a byte-level vocabulary), and the two specials."""
    directory = Path(directory)
    chars = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for token in [*chars, *(c + "</w>" for c in chars)]:
        vocab.setdefault(token, len(vocab))
    merges = learn_merges(list(words))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
