"""Per-sample randomness: one generator or seed per sample (docs/methods/conventions.md, "Randomness").

A sample must not change with the batch it is drawn in, so every random draw is made row by row from that row's
own generator (as EDM's ``StackedRandomGenerator`` and k-diffusion's seeded noise samplers do).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

GeneratorLike = int | Sequence[int] | torch.Generator | Sequence[torch.Generator] | None


class SampleNoise:
    """Standard-normal draws with one generator per batch row.

    Each row's generator fills a block of ``block`` draws at a time (one call per row per block instead of one
    per row per step, which dominates the cost of ancestral steps on small models); the block size is fixed, so
    a row's noise depends only on its own generator, never on the batch.

    Args:
        generators: one ``torch.Generator`` per row, or ``None`` for the global RNG (then a row's noise depends on
            the batch).
        block: draws buffered per row.
    """

    def __init__(self, generators: list[torch.Generator] | None, block: int = 16):
        self.generators = generators
        self.block = block
        self._buffer: Tensor | None = None
        self._next = 0

    def randn(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
        """Draw ``[B, *shape[1:]]`` standard normals, row ``i`` from generator ``i``."""
        shape = tuple(shape)
        if self.generators is None:
            return torch.randn(shape, dtype=dtype, device=device)
        if shape[0] != len(self.generators):
            raise ValueError(f"batch of {shape[0]} rows but {len(self.generators)} generators")
        buf = self._buffer
        if buf is None or self._next == self.block or buf.shape[2:] != shape[1:] or buf.dtype != dtype:
            rows = [torch.randn((self.block, *shape[1:]), generator=g, dtype=dtype, device=g.device)
                    for g in self.generators]
            # Host generators for a device state: an asynchronous copy (a blocking one waits for the device).
            self._buffer = buf = torch.stack(rows).to(device, non_blocking=True)
            self._next = 0
        self._next += 1
        return buf[:, self._next - 1]

    def randn_like(self, x: Tensor) -> Tensor:
        return self.randn(x.shape, x.dtype, x.device)


# The seeds torch.Generator.manual_seed accepts (a negative seed s is taken as 2**64 + s).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def make_generators(generator: GeneratorLike, n: int, device: torch.device | str = "cpu") -> list | None:
    """Normalise the ``generator=`` argument to ``n`` per-sample generators.

    ``int`` seed ``s`` gives row ``i`` the seed ``s + i``; a sequence of ints gives each row its seed; a sequence of
    generators is used as is; one ``torch.Generator`` is shared by all rows (not batch-invariant); ``None`` uses the
    global RNG.
    """
    if generator is None:
        return None
    if isinstance(generator, torch.Generator):
        # One generator drawn row after row: reproducible for a fixed batch, but rows depend on their position.
        return [generator] * n
    if isinstance(generator, bool) or isinstance(generator, Sequence) and any(isinstance(s, bool) for s in generator):
        raise TypeError(f"generator: a seed must be an int, not a bool (got {generator!r})")
    if isinstance(generator, numbers.Integral):  # numpy integers too
        seeds = [int(generator) + i for i in range(n)]
    elif isinstance(generator, Sequence) and len(generator) > 0 and all(isinstance(s, numbers.Integral)
                                                                        for s in generator):
        seeds = [int(s) for s in generator]
    elif isinstance(generator, Sequence) and all(isinstance(g, torch.Generator) for g in generator):
        gens = list(generator)
        if len(gens) != n:
            raise ValueError(f"generator: got {len(gens)} generators for {n} samples")
        return gens
    else:
        raise TypeError(
            "generator must be None, an int seed, a torch.Generator, or a sequence of ints or generators; "
            f"got {type(generator).__name__}"
        )
    if len(seeds) != n:
        raise ValueError(f"generator: got {len(seeds)} seeds for {n} samples")
    bad = next((s for s in seeds if not SEED_MIN <= s <= SEED_MAX), None)
    if bad is not None:  # torch.Generator.manual_seed would raise an overflow error that names no argument
        where = f"seed {generator} + row {bad - generator}" if isinstance(generator, numbers.Integral) else \
            f"row {seeds.index(bad)}"
        raise ValueError(f"seeds must lie in [-2**63, 2**64 - 1], the range torch.Generator.manual_seed takes; "
                         f"got {bad} ({where})")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def randn(
    shape: Sequence[int], seeds: GeneratorLike, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> Tensor:
    """Standard-normal starting noise ``[B, *shape[1:]]`` with one seed (or generator) per row.

    ``randn((64, 2), seeds=0)`` gives row ``i`` the noise of seed ``i``, so ``randn((1, 2), seeds=[5])`` equals
    row 5 of it.
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not all(
            isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in shape):
        raise TypeError(f"shape must be a sequence of ints [B, *sample_shape], got {shape!r}")
    shape = tuple(int(n) for n in shape)
    if len(shape) < 1 or shape[0] < 1 or any(n < 1 for n in shape):
        raise ValueError(f"shape must start with a positive batch size and have positive sizes, got {shape}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
    if seeds is None:
        raise ValueError("seeds must be given (an int, a list of ints or of generators) for per-sample noise")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a device such as 'cpu', 'cuda' or 'cuda:0', got {device!r}") from err
    rows = [torch.randn(shape[1:], generator=g, dtype=dtype) for g in make_generators(seeds, shape[0], "cpu")]
    return torch.stack(rows).to(device)
