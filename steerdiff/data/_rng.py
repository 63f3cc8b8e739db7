"""Seeded, prefix-stable random streams for the embedded data sets: deterministic given a seed
(docs/methods/conventions.md, "Randomness").

Every data set draws from numpy ``Generator`` streams keyed by ``(seed, stream)``, never from a global
RNG. Each stream fills a fixed-size block of numbers per sample, row after row, so the first ``m`` samples
of a call with ``n > m`` equal the samples of a call with ``n = m`` ("prefix stability"): a sample does not
depend on how many were asked for. Distinct jobs (nuisance parameters, pixel noise) use distinct streams so
that the block size of one stream never shifts the draws of another.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_seed(seed: int) -> int:
    """Return ``seed`` as a Python int, or raise if it is not a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


def check_count(n: int, name: str = "n") -> int:
    """Return ``n`` as a Python int, or raise if it is not a non-negative integer."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")
    return int(n)


def check_number(value: object, name: str, positive: bool = False, optional: bool = False) -> float | None:
    """Return ``value`` as a float, or raise naming ``name`` unless it is a finite real number, ``> 0`` when
    ``positive`` (else ``>= 0``); None passes through when ``optional``."""
    if optional and value is None:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        bound = "a positive finite number" if positive else "a finite number >= 0"
        raise ValueError(f"{name} must be {'None or ' if optional else ''}{bound}, got {value!r}")
    return float(value)


def stream(seed: int, key: int) -> np.random.Generator:
    """A PCG64 generator for stream ``key`` of ``seed``.

    ``SeedSequence([seed, key])`` hashes both numbers, so streams of one seed, and equal streams of
    different seeds, are independent (unlike ``seed + key``, where seed 0 stream 1 would equal seed 1
    stream 0).
    """
    return np.random.default_rng(np.random.SeedSequence([check_seed(seed), key]))
