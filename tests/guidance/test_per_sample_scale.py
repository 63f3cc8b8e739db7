"""Per-sample guidance scales (docs/methods/guidance.md, "Per-sample scales"): ``scale`` may be a 1-D tensor or list
``[B]``, one weight per sample, for CFG, CFG-rescale, APG and Compose.

Truth: row ``b`` of a batch guided with scales ``[w_1, .., w_B]`` is row ``b`` of the same batch sampled at the
scalar ``w_b`` (every guider is per sample: its norms, stds, projections and momentum never mix rows), checked on
the exact mixtures through the samplers.
"""

import json

import pytest
import torch

import steerdiff as sd
from steerdiff.core import NFECounter
from steerdiff.guidance import APG, CFG, CFGRescale, Compose, build_guider
from steerdiff.models import GaussianMixture, builtin_mixture

SCALES = [0.0, 1.0, 2.5, 4.0, 7.0, 1.0, 0.5, 4.0]  # rows repeat with period 8; 0 and 1 included
MAKERS = {
    "cfg": lambda w: CFG(w),
    "cfg_rescale": lambda w: CFGRescale(w, phi=0.7),
    "cfg_rescale_eps": lambda w: CFGRescale(w, phi=0.7, space="eps"),
    "apg": lambda w: APG(w, eta=0.3, r_rms=0.5, momentum=-0.5),
    "apg_eps": lambda w: APG(w, eta=0.0, momentum=-0.5, space="eps"),
}


def _close(a, b):
    # Round-off only: a scalar w = 0 or 1 takes a one-branch shortcut (another batch size for the denoiser).
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["euler", "heun"])
@pytest.mark.parametrize("name", list(MAKERS))
def test_rows_equal_separate_scalar_runs(name, method):
    gmm = builtin_mixture("gmm2d")
    n = 16
    noise, cond, sig = sd.randn((n, 2), seeds=0, dtype=torch.float64), torch.arange(n) % 8, sd.sigmas.karras(8)
    scales = torch.tensor(SCALES * (n // len(SCALES)), dtype=torch.float64)
    batch = sd.sample(gmm, noise, sig, method=method, cond=cond, guidance=MAKERS[name](scales))
    for w in sorted(set(SCALES)):
        rows = scales == w
        alone = sd.sample(gmm, noise, sig, method=method, cond=cond, guidance=MAKERS[name](w))
        _close(batch[rows], alone[rows])


def test_compose_rows_equal_separate_scalar_runs():
    levels = (-2.0, 0.0, 2.0)
    combos = [(a, b) for a in range(3) for b in range(3)]
    gmm = GaussianMixture(torch.ones(9), [[levels[a], levels[b]] for a, b in combos], 0.3**2, labels=combos)
    attrs = {"a": ["m2", "z", "p2"], "b": ["m2", "z", "p2"]}
    n, sig = 12, sd.sigmas.karras(10, 0.01, 20.0)
    noise = sd.randn((n, 2), seeds=1, dtype=torch.float64)
    scales = [0.0, 1.0, 2.0, 3.5] * 3
    for expr in ("a=p2 & b=m2", "2*a=z & !b={m2,p2}"):
        g = Compose(expr, scales, attrs)
        batch = sd.sample(gmm, noise, sig, method="heun", cond=g.cond(n), guidance=g)
        for w in sorted(set(scales)):
            rows = torch.tensor(scales) == w
            gw = Compose(expr, w, attrs)
            _close(batch[rows], sd.sample(gmm, noise, sig, method="heun", cond=gw.cond(n), guidance=gw)[rows])
        assert g.query_terms == Compose(expr, 1.0, attrs).terms


def test_cost_skips_the_null_branch_only_when_every_row_allows_it():
    gmm = builtin_mixture("gmm2d")
    x, s, c = torch.randn(4, 2, dtype=torch.float64), torch.ones(4, dtype=torch.float64), torch.arange(4)
    for guider, rows in [(CFG([1.0] * 4), 4), (APG([1.0] * 4), 4), (CFG([0.0] * 4), 4), (CFG([1.0, 1.0, 0.0, 1.0]), 8),
                         (APG([1.0, 3.0, 1.0, 1.0]), 8), (CFGRescale([1.0, 1.0, 1.0, 2.0]), 8)]:
        counter = NFECounter(gmm)
        out = guider.guide(counter, x, s, c)
        assert counter.calls == 1 and counter.rows == rows, guider
        ones = guider.scale == 1.0
        assert torch.equal(out[ones], gmm(x, s, c)[ones])  # w = 1 rows are D_c exactly
    null = torch.full_like(c, -1)
    out = CFG([0.0, 2.0, 0.0, 1.0]).guide(gmm, x, s, c)
    assert torch.equal(out[[0, 2]], gmm(x, s, null)[[0, 2]])  # lerp is exact at w = 0, row by row


def test_config_is_json_and_round_trips():
    for g in (CFG(torch.tensor([1.0, 3.0])), CFGRescale([2.0, 5.0], phi=0.5), APG([1.5, 7.5], r_rms=0.05),
              build_guider("apg", [3.0, 4.0], eta=0.2)):
        cfg = json.loads(json.dumps(g.config))
        assert isinstance(cfg["scale"], list)
        again = type(g).from_config(cfg)
        assert again.config == g.config and torch.equal(again.scale, g.scale)
    c = Compose("a=1", [1.0, 2.0], {"a": 3})
    assert Compose(**json.loads(json.dumps(c.config))).config == c.config


@pytest.mark.parametrize("bad,error,match", [
    ([1.0, -2.0], ValueError, "scale must be finite and >= 0 in every row"),
    ([1.0, float("nan")], ValueError, "scale must be finite and >= 0 in every row"),
    (torch.tensor([1.0, float("inf")]), ValueError, "scale must be finite and >= 0 in every row"),
    ([], ValueError, "non-empty 1-D tensor"),
    (torch.ones(2, 2), ValueError, "non-empty 1-D tensor"),
    (torch.tensor([True, False]), TypeError, "dtype torch.bool"),
    ([1.0, "2"], TypeError, "entry of type str"),
    ([True, 2.0], TypeError, "entry of type bool"),
    ([[1.0, 2.0]], TypeError, "entry of type list"),
    ("7", TypeError, "scale must be a real number or a 1-D tensor"),
    (None, TypeError, "scale must be a real number or a 1-D tensor"),
])
def test_bad_per_sample_scales(bad, error, match):
    for make in (CFG, CFGRescale, APG, lambda w: Compose("a=1", w, {"a": 3})):
        with pytest.raises(error, match=match):
            make(bad)


@pytest.mark.parametrize("make", [CFG, CFGRescale, APG])
def test_scale_length_must_match_the_batch_before_any_evaluation(make):
    gmm = builtin_mixture("gmm2d")
    counter = NFECounter(gmm)
    noise, cond = sd.randn((4, 2), seeds=0, dtype=torch.float64), torch.arange(4)
    for scale in ([2.0, 3.0, 4.0], [1.0, 1.0, 1.0]):  # the shortcut branches check it too
        with pytest.raises(ValueError, match=r"scale has 3 per-sample weights but the batch has 4 rows"):
            sd.sample(counter, noise, sd.sigmas.karras(4), method="euler", cond=cond, guidance=make(scale))
    assert counter.calls == 0


def test_compose_scale_length_must_match_the_batch():
    gmm = GaussianMixture(torch.ones(3), [[-1.0], [0.0], [1.0]], 0.1, labels=[[0], [1], [2]])
    g = Compose("a=1", [1.0, 2.0, 3.0], {"a": 3})
    counter = NFECounter(gmm)
    with pytest.raises(ValueError, match=r"scale has 3 per-sample weights but the batch has 2 rows"):
        g.guide(counter, torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, dtype=torch.float64), g.cond(2))
    assert counter.calls == 0
