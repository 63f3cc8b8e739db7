"""Confidence-ordered decoding with remasking (``steerdiff.discrete.remask``) and the confidence corrector
(``steerdiff.discrete.corrector``): exact where the method is (random order, random Gibbs loop, full redraw of a
product law), their plans and costs, and refusals."""

import math

import pytest
import torch

import steerdiff.discrete as dd
from steerdiff.discrete.corrector import correct
from steerdiff.discrete.remask import plan, remask_decode

L, K, N = 4, 3, 12000
TABLE = dd.random_table(L, K, seed=1)  # 81 sequences, strongly dependent positions
FLOOR = dd.tv_floor(TABLE, N, quantile=0.999)
ABS = dd.make_process("absorbing", K, schedule="linear")


def _decode(seed=3, **kw):
    x0 = torch.full((N, L), K)
    x, stats = remask_decode(dd.TableModel(TABLE, L, ABS), ABS, x0, L, generator=torch.Generator().manual_seed(seed),
                             return_stats=True, **kw)
    return dd.total_variation(dd.empirical(x, K), TABLE), stats


def test_random_order_is_exact_and_a_random_gibbs_loop_keeps_the_law():
    # One reveal per step in uniform order is the any-order chain; a loop step re-draws one uniformly chosen
    # position from its exact conditional (a Gibbs move), so the law is kept.
    tv, stats = _decode(choice_temperature=1e6)
    assert tv < FLOOR and stats.nfe == L
    tv, stats = _decode(choice_temperature=1e6, loop=6, remask_by="random")
    assert tv < FLOOR and stats.nfe == L + 6


def test_greedy_order_and_confidence_remasking_are_not_exact_and_random_loops_mix_toward_the_table():
    greedy, _ = _decode(choice_temperature=0.0)
    conf_loop, _ = _decode(choice_temperature=1e6, loop=6)
    mixed, _ = _decode(choice_temperature=0.0, loop=12, remask_by="random")
    assert greedy > FLOOR and conf_loop > FLOOR
    assert mixed < greedy / 2  # Gibbs moves from the greedy law's output toward the table


def test_plan_follows_each_rows_cosine_schedule_and_remasks_eta_per_reveal():
    counts, steps = [10, 190, 3], 8
    remask, masked = plan(counts, steps, eta=0.5, loop=2, loop_k=4)
    assert len(masked) == steps + 2 and remask[0] == [0, 0, 0]
    left = counts
    for j in range(steps):
        want = [math.floor(n * math.cos(math.pi * (j + 1) / (2 * steps)) + 1e-9) if j < steps - 1 else 0
                for n in counts]
        assert masked[j] == [m + r for m, r in zip(left, remask[j], strict=True)]
        if j > 0:
            assert remask[j] == [min(round(0.5 * (m - w)), n - m) for n, m, w in zip(counts, left, want, strict=True)]
        left = want
    assert masked[steps:] == [[4, 4, 3], [4, 4, 3]]


class _Oracle:
    """p0 one-hot on a fixed clean sequence per row (whatever the state): every decoding must return it."""

    def __init__(self, target):
        self.target = target

    def __call__(self, x, t, cond=None):
        assert t.shape == (x.shape[0],) and bool(((t >= 0) & (t <= 1)).all())
        rows = self.target.repeat(x.shape[0] // len(self.target), 1)  # a doubled CFG batch: both halves
        return torch.nn.functional.one_hot(rows, K).double()


def test_padded_and_given_tokens_are_kept_masks_filled_and_cfg_doubles_the_cost():
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, K, (6, 9), generator=g)
    x0 = torch.full((6, 9), K)
    x0[:, 0] = 1  # given
    x0[:3, 7:] = K + 1  # a "pad" state (not a token, not the mask)
    for kw in ({}, {"eta": 0.7, "loop": 3, "loop_k": 2}, {"eta": 1.0, "remask_by": "random", "loop": 1}):
        x, stats = remask_decode(_Oracle(target), ABS, x0, 5, generator=1, return_stats=True, **kw)
        assert bool((x[:, 0] == 1).all()) and bool((x[:3, 7:] == K + 1).all())
        keep = (x0 == K)
        assert torch.equal(x[keep], target[keep])
        assert stats.nfe == 5 + kw.get("loop", 0)
    cond = torch.zeros(6, dtype=torch.long)
    _, stats = remask_decode(_Oracle(target), ABS, x0, 5, loop=2, cond=cond, guidance=dd.CFG(2.0), generator=1,
                             return_stats=True)
    assert stats.nfe == 2 * (5 + 2)


def test_remask_refusals():
    x0 = torch.full((2, L), K)
    model = dd.TableModel(TABLE, L, ABS)
    with pytest.raises(ValueError, match="absorbing"):
        remask_decode(model, dd.make_process("uniform", K), torch.zeros(2, L, dtype=torch.long), 2)
    for kw, name in (({"eta": -1.0}, "eta"), ({"eta": math.nan}, "eta"), ({"loop": -1}, "loop"),
                     ({"loop_k": 0}, "loop_k"), ({"remask_by": "lowest"}, "remask_by"),
                     ({"choice_temperature": -1.0}, "choice_temperature")):
        with pytest.raises(ValueError, match=name):
            remask_decode(model, ABS, x0, 2, **kw)
    with pytest.raises(ValueError, match="steps"):
        remask_decode(model, ABS, x0, 0)
    with pytest.raises(ValueError, match="x must"):
        remask_decode(model, ABS, x0.float(), 2)


# ------------------------------------------------------------------------------------------------ the corrector
Q = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.45, 0.45, 0.1]], dtype=torch.float64)


def _product(x, t, cond=None):
    """A denoiser that ignores the state: position ``l``'s clean token has law ``Q[l]``."""
    return Q.expand(x.shape[0], -1, -1)


def test_corrector_redecides_the_least_probable_tokens_first_and_only_below_the_threshold():
    proc = dd.make_process("uniform", K)
    x = torch.tensor([[2, 2, 2, 2], [0, 1, 2, 0]])
    # row 0: current probabilities 0.1, 0.1, 0.8, 0.1; row 1: 0.6, 0.7, 0.8, 0.45
    one = correct(_product, proc, x, sweeps=1, threshold=0.5)
    assert one[0].tolist() in ([0, 2, 2, 2], [2, 1, 2, 2], [2, 2, 2, 0])  # one of the three tied at 0.1
    assert one[1].tolist() == [0, 1, 2, 0]  # its lowest, 0.45, is argmax-tied: the argmax keeps a 0
    full = correct(_product, proc, x, sweeps=4, threshold=0.5)
    assert full[0].tolist() == [0, 1, 2, 0]
    high = correct(_product, proc, x, sweeps=4, threshold=0.65, per_sweep=2)
    assert high[1].tolist() == [0, 1, 2, 0] and high[0].tolist() == [0, 1, 2, 0]
    assert torch.equal(correct(_product, proc, x, sweeps=0), x)


def test_a_full_redraw_of_a_product_law_is_exact_and_masks_pads_are_kept():
    proc = dd.make_process("uniform", K)
    x = torch.zeros(N, L, dtype=torch.long)
    out, stats = correct(_product, proc, x, sweeps=1, threshold=1.0, per_sweep=L, mode="draw",
                         generator=torch.Generator().manual_seed(5), return_stats=True)
    law = torch.ones(1, dtype=torch.float64)
    for q in Q:  # the product table in all_sequences order (last position fastest)
        law = (law[:, None] * q[None]).flatten()
    assert dd.total_variation(dd.empirical(out, K), law) < dd.tv_floor(law, N, 0.999)
    assert stats.nfe == 1
    y = torch.tensor([[K, 2, K + 1, 2]])  # a mask and a pad state are not tokens: never re-decided
    out = correct(_product, ABS, y, sweeps=3, threshold=1.0, per_sweep=L)
    assert out.tolist() == [[K, 1, K + 1, 0]]
    _, stats = correct(_product, proc, x[:4], sweeps=3, cond=torch.zeros(4, dtype=torch.long),
                       guidance=dd.CFG(2.0), return_stats=True)
    assert stats.nfe == 6


def test_corrector_refusals():
    proc = dd.make_process("uniform", K)
    x = torch.zeros(2, L, dtype=torch.long)
    for kw, name in (({"sweeps": -1}, "sweeps"), ({"sweeps": 1, "t": 1.5}, "t"), ({"sweeps": 1, "threshold": 0.0},
                     "threshold"), ({"sweeps": 1, "per_sweep": 0}, "per_sweep"), ({"sweeps": 1, "mode": "max"},
                     "mode")):
        with pytest.raises(ValueError, match=name):
            correct(_product, proc, x, **kw)
    with pytest.raises(ValueError, match="x must"):
        correct(_product, proc, x.float(), sweeps=1)
