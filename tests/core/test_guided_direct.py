"""The guided loop's direct path (``Guider.direct_combiner``, taken by ``GuidedDenoiser`` after a trajectory's first
call): the same samples as the guider's own ``guide`` at every call, bit for bit, and refused where a call may do
anything else.

Independent truth: the same guider run through a wrapper that only forwards ``guide`` (so no direct path exists),
and ``guide`` called by hand on the current labels.
"""

import copy

import pytest
import torch

import steerdiff as sd
from steerdiff.core.denoiser import NFECounter
from steerdiff.core.guided import GuidedDenoiser
from steerdiff.guidance import APG, CFG, FDG, CFGRescale
from steerdiff.models import GaussianMixture
from steerdiff.pipelines import TextCond


def _mixture() -> GaussianMixture:
    return GaussianMixture([0.4, 0.6], [[-1.5, 0.5], [1.5, -0.5]], [[0.3, 0.1], [0.2, 0.4]], labels=[0, 1])


class ForwardGuide:
    """Forwards ``guide`` / ``reset`` / ``set_schedule`` to a guider: the guider's own rule at every call."""

    def __init__(self, guider):
        self.guider = guider

    def guide(self, denoiser, x, sigma, cond, step=None):
        return self.guider.guide(denoiser, x, sigma, cond, step=step)

    def reset(self):
        self.guider.reset()

    def set_schedule(self, sigmas):
        self.guider.set_schedule(sigmas)


@pytest.mark.parametrize("make", [lambda: CFG(3.0), lambda: APG(4.0), lambda: CFGRescale(3.0, phi=0.7)])
@pytest.mark.parametrize("method", ["euler", "heun", "dpmpp_2m"])
def test_direct_path_equals_the_guide_bit_for_bit(make, method):
    gm = _mixture()
    sig = sd.sigmas.karras(6, 0.02, 20.0)
    cond = torch.tensor([0, 1, 0, 1, 1])
    noise = sd.randn((5, 2), seeds=0, dtype=torch.float64)
    guider = make()
    assert guider.direct_combiner() is not None
    x, stats = sd.sample(gm, noise, sig, method=method, cond=cond, guidance=guider, return_stats=True)
    ref, ref_stats = sd.sample(gm, noise, sig, method=method, cond=cond, guidance=ForwardGuide(copy.deepcopy(make())),
                               return_stats=True)
    assert torch.equal(x, ref)
    assert (stats.nfe, stats.calls) == (ref_stats.nfe, ref_stats.calls)


def test_direct_path_on_a_structured_condition_equals_the_guide():
    g = torch.Generator().manual_seed(0)
    cond = TextCond({"emb": torch.randn(3, 2, generator=g)}, TextCond({"emb": torch.randn(3, 2, generator=g)}))

    def den(x, sigma, c):
        return x / (1 + sigma[:, None] ** 2) + c["emb"].sin()

    sig = sd.sigmas.karras(5, 0.05, 10.0)
    noise = sd.randn((3, 2), seeds=1, dtype=torch.float32)
    x = sd.sample(den, noise, sig, method="euler", cond=cond, guidance=APG(5.0))
    ref = sd.sample(den, noise, sig, method="euler", cond=cond, guidance=ForwardGuide(APG(5.0)))
    assert torch.equal(x, ref)


def test_guide_runs_once_per_trajectory_then_the_direct_path():
    gm = _mixture()
    guider = CFG(2.5)
    calls = []
    own = guider.guide
    guider.guide = lambda *a, **k: calls.append(1) or own(*a, **k)  # the instance's guide, counted
    sig = sd.sigmas.karras(6, 0.02, 20.0)
    noise = sd.randn((4, 2), seeds=2, dtype=torch.float64)
    _, stats = sd.sample(gm, noise, sig, method="euler", cond=torch.tensor([0, 1, 1, 0]), guidance=guider,
                         return_stats=True)
    assert len(calls) == 1 and stats.nfe == 2 * 6
    sd.sample(gm, noise, sig, method="euler", cond=torch.tensor([0, 1, 1, 0]), guidance=guider)
    assert len(calls) == 2  # each trajectory's first call checks its inputs again


def test_labels_changed_in_place_leave_the_direct_path():
    gm = _mixture()
    cond = torch.tensor([0, 1, 0])
    guided = GuidedDenoiser(NFECounter(gm), CFG(3.0), cond)
    guided.begin(sd.sigmas.karras(4, 0.02, 20.0))
    x = sd.randn((3, 2), seeds=3, dtype=torch.float64)
    sigma = torch.full((3,), 2.0, dtype=torch.float64)
    guided(x, sigma, step=0)
    guided(x, sigma, step=1)
    cond[0] = 1  # the caller's labels change: the next call must see them
    expected = CFG(3.0).guide(gm, x, sigma, torch.tensor([1, 1, 0]))
    assert torch.equal(guided(x, sigma, step=2), expected)


@pytest.mark.parametrize("make", [
    lambda: CFG(3.0, start=0.2, stop=0.8),  # a window: calls differ by step
    lambda: CFG(torch.tensor([1.0, 3.0])),  # per-sample weights: rows at w = 1 are the conditional model
    lambda: CFG(3.0, enabled=False),
    lambda: CFG(1.0),  # one evaluation, not two
    lambda: CFG(0.0),
    lambda: FDG(3.0),  # its own _branches()
])
def test_no_direct_path_where_guide_does_more(make):
    assert make().direct_combiner() is None


def test_no_direct_path_for_a_subclass_with_its_own_guide():
    class Clipped(CFG):
        def guide(self, denoiser, x, sigma, cond, step=None):
            return super().guide(denoiser, x, sigma, cond, step=step).clamp(-1, 1)

    assert Clipped(3.0).direct_combiner() is None


def test_cfg_direct_combiner_is_its_combine_without_sigma():
    """CFG's direct combiner is its lerp with the weight fixed, reads no sigma (``uses_sigma = False``: the sampler
    hands it None), and equals ``combine`` bit for bit; a subclass with its own ``combine`` keeps that one."""
    g = torch.Generator().manual_seed(0)
    d_cond, d_null, x = (torch.randn(3, 4, generator=g) for _ in range(3))
    sigma = torch.full((3,), 0.7)
    cfg = CFG(4.5)
    direct = cfg.direct_combiner()
    assert direct.uses_sigma is False
    assert torch.equal(direct(d_cond, d_null, x, None, 2), cfg.combine(d_cond, d_null, x, sigma))

    class Halved(CFG):
        def combine(self, d_cond, d_null, x, sigma, step=None):
            return 0.5 * super().combine(d_cond, d_null, x, sigma, step)

    other = Halved(4.5).direct_combiner()
    assert getattr(other, "uses_sigma", True) is not False
    assert torch.equal(other(d_cond, d_null, x, sigma, 2), 0.5 * cfg.combine(d_cond, d_null, x, sigma))
