"""An exact discrete denoiser: a joint table over short sequences, its x0-posteriors by enumeration.

For ``L`` positions over ``K`` tokens the table holds ``K^L`` probabilities (``p(x)``, or ``p(x | c)`` for ``C``
labels). Under an interpolating process the noisy sequence's likelihood factorises,
``q(x_t | x_0) = prod_l q_t(x_t^l | x_0^l)``, so the exact posterior over clean sequences is
``p(x_0 | x_t) ∝ p(x_0) prod_l q_t(x_t^l | x_0^l)`` and the denoiser's per-position probabilities are its marginals
(``docs/methods/discrete.md``, "Exact checks"). Samplers, guidance and SMC are checked against it by total variation.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from .process import Process


def all_sequences(length: int, num_classes: int) -> Tensor:
    """``[K^L, L]`` long: every sequence, in the order of :func:`sequence_index` (the last position fastest)."""
    return torch.tensor(list(itertools.product(range(num_classes), repeat=length)), dtype=torch.long)


def sequence_index(x: Tensor, num_classes: int) -> Tensor:
    """``[N]``: the index of each clean sequence ``x [N, L]`` in :func:`all_sequences`."""
    w = num_classes ** torch.arange(x.shape[1] - 1, -1, -1, device=x.device)
    return (x * w).sum(-1)


def empirical(x: Tensor, num_classes: int, weights: Tensor | None = None) -> Tensor:
    """``[K^L]`` float64: the (weighted) histogram of clean sequences ``x [N, L]``, normalised."""
    idx = sequence_index(x, num_classes)
    w = torch.ones(len(idx), dtype=torch.float64) if weights is None else weights.to(torch.float64).flatten()
    h = torch.zeros(num_classes ** x.shape[1], dtype=torch.float64).index_add_(0, idx.cpu(), w.cpu())
    return h / h.sum()


def total_variation(p: Tensor, q: Tensor) -> float:
    """``1/2 sum |p - q|`` of two distributions on the same support."""
    return 0.5 * float((p.double() - q.double()).abs().sum())


def tv_floor(p: Tensor, n: int, quantile: float = 0.99, repeats: int = 200, seed: int = 0) -> float:
    """The ``quantile`` of the total variation between ``p`` and the histogram of ``n`` i.i.d. draws from it (by
    simulation): the Monte Carlo error of an exact sampler with ``n`` samples."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.stack([torch.bincount(torch.multinomial(p.double(), n, True, generator=g), minlength=len(p))
                          for _ in range(repeats)]).double() / n
    return float((0.5 * (counts - p.double()).abs().sum(1)).quantile(quantile))


class TableModel:
    """The exact denoiser of a table ``p(x)`` (``[K^L]``) or ``p(x | c)`` (``[C, K^L]``) under ``process``.

    ``model(x_t [B, L], t [B], cond) -> p(x_0^l | x_t) [B, L, K]``. With labels, ``cond [B]`` picks ``p(x | c)`` and
    ``-1`` (or ``cond=None``) the marginal ``sum_c w_c p(x | c)`` with label prior ``w`` (default uniform). The
    time is read from ``t`` on the host (a test model: one read per call). Computed in float64, returned in
    ``dtype``.
    """

    def __init__(self, table, length: int, process: Process, label_prior=None, dtype: torch.dtype = torch.float64):
        table = torch.as_tensor(table, dtype=torch.float64)
        k = process.num_classes
        if table.shape[-1] != k ** length or table.dim() not in (1, 2) or bool((table < 0).any()):
            raise ValueError(f"table must be [K^L] = [{k ** length}] or [C, K^L], non-negative; got "
                             f"{tuple(table.shape)}")
        self.labelled = table.dim() == 2
        self.table = table / table.sum(-1, keepdim=True)
        self.length, self.process, self.dtype = length, process, dtype
        self.seqs = all_sequences(length, k)
        c = self.table.shape[0] if self.labelled else 1
        w = torch.full((c,), 1.0 / c, dtype=torch.float64) if label_prior is None else \
            torch.as_tensor(label_prior, dtype=torch.float64)
        self.label_prior = w / w.sum()
        self.onehot = torch.nn.functional.one_hot(self.seqs, k).to(torch.float64)  # [N, L, K]

    @property
    def marginal(self) -> Tensor:
        """``[K^L]``: ``p(x)`` (the label-averaged table when labelled)."""
        return self.label_prior @ self.table if self.labelled else self.table

    def probs(self, cond: int | None = None) -> Tensor:
        """``[K^L]``: the table of label ``cond`` (None: the marginal)."""
        return self.marginal if cond is None or cond < 0 else self.table[cond]

    def prior_rows(self, cond: Tensor | None, n: int) -> Tensor:
        """``[n, K^L]``: the table each row conditions on."""
        if not self.labelled or cond is None:
            return self.marginal.expand(n, -1)
        c = cond.cpu().long()
        return torch.where((c >= 0)[:, None], self.table[c.clamp_min(0)], self.marginal[None])

    def posterior(self, x: Tensor, t: float, cond: Tensor | None = None) -> Tensor:
        """``[B, K^L]``: ``p(x_0 | x_t)`` over every clean sequence."""
        x = x.cpu()
        if self.process.absorbing:
            # q(x_t | x_0) = alpha^(#unmasked) (1 - alpha)^(#masked) for every x_0 that agrees with the unmasked
            # tokens, 0 otherwise: the posterior is the table restricted to those, at every t (also t = 1, where a
            # start with given tokens, infilling, has probability 0 under q but the restriction is its limit).
            seen = x[:, None, :]
            agree = ((seen == self.process.mask_index) | (seen == self.seqs[None])).all(-1)  # [B, N]
            ll = torch.where(agree, 0.0, -torch.inf).to(torch.float64)
        else:
            q = self.process.transition(t).log()  # [K, S]
            a = q[:, x].permute(1, 2, 0)  # [B, L, K]: log q(x_t^l | x_0^l = k)
            ll = a[:, torch.arange(self.length)[None], self.seqs].sum(-1)  # [B, N]
        logp = self.prior_rows(cond, x.shape[0]).log() + ll
        return torch.softmax(logp, -1)

    def __call__(self, x: Tensor, t: Tensor, cond=None) -> Tensor:
        tt = float(t.flatten()[0])  # one time per call in every loop here
        post = self.posterior(x, tt, cond)
        return torch.einsum("bn,nlk->blk", post, self.onehot).to(device=x.device, dtype=self.dtype)


def random_table(length: int, num_classes: int, labels: int = 0, seed: int = 0, sharpness: float = 1.0) -> Tensor:
    """A random table ``[K^L]`` (or ``[C, K^L]``): normalised ``E^sharpness``, ``E`` i.i.d. standard exponential
    (``sharpness = 1`` is a flat-Dirichlet draw); its positions are strongly dependent, as the exact checks need."""
    g = torch.Generator().manual_seed(seed)
    shape = (labels, num_classes ** length) if labels else (num_classes ** length,)
    x = torch.empty(shape, dtype=torch.float64).exponential_(generator=g) ** sharpness
    return x / x.sum(-1, keepdim=True)


def ancestral_law(model: TableModel, process: Process, steps: int, time_power: float = 1.0) -> Tensor:
    """``[K^L]``: the exact law of the ``ancestral`` sampler's output with ``steps`` steps (on the grid of
    ``time_power``, :func:`steerdiff.discrete.sampling.ancestral_grid`), by enumeration.

    The state's law over all ``S^L`` sequences starts at the prior ``prod_l m(x^l)`` and is pushed through each step's
    kernel ``T[x_t, x_s] = prod_l p(x_s^l | x_t)`` (the factorised reverse step of :meth:`Process.posterior`); the
    law of the clean sequences is what remains at ``t = 0``. This is the sampler's own error (the factorisation over
    positions, ``O(1/steps)``), free of Monte Carlo noise.
    """
    from .sampling import ancestral_grid

    length, s_ = model.length, process.num_states
    states = all_sequences(length, s_)
    law = torch.stack([process.m[states[:, pos]] for pos in range(length)]).prod(0)
    for st in ancestral_grid(process, length, steps, time_power):
        p0 = model(states, torch.full((len(states),), st.t)).nan_to_num(0.0)  # unreachable states: 0 / 0
        post = process.posterior(states, p0, st.t, st.s).double().nan_to_num(0.0)
        kernel = torch.ones(len(states), len(states), dtype=torch.float64)
        for pos in range(length):
            kernel = kernel * post[:, pos, states[:, pos]]
        law = law @ kernel
    return law[(states < process.num_classes).all(1)]
