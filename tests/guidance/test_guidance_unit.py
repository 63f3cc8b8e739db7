"""Guider algebra: U1-U5 of docs/methods/guidance.md ("Unit identities"), NaN safety and bad input.

Predictions come from a scripted denoiser that returns fixed tensors ``D_c`` / ``D_u`` per row (``cond == -1``
selects ``D_u``) and records every call, so each identity is checked exactly (float64, relative 1e-10).
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import APG, CFG, CFGRescale
from steerdiff.guidance.apg import clamp_norm, project
from steerdiff.guidance.cfg import bessel_std

SHAPE = (4, 3, 5, 5)  # [B, C, H, W]
RTOL = 1e-10


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class Scripted:
    """``D(x, sigma, cond)``: row ``i`` of a batch answers ``d_c[k][i % B]`` (or ``d_u[k]`` where ``cond == -1``).

    ``k`` is the number of previous calls when lists of predictions are given (one pair per call).
    """

    def __init__(self, d_c, d_u):
        self.d_c = d_c if isinstance(d_c, list) else None
        self.d_u = d_u if isinstance(d_u, list) else None
        self.fixed = (d_c, d_u) if self.d_c is None else None
        self.calls = []

    def __call__(self, x, sigma, cond=None):
        k = len(self.calls)
        self.calls.append(None if cond is None else cond.clone())
        d_c, d_u = self.fixed if self.fixed is not None else (self.d_c[k], self.d_u[k])
        rows = torch.arange(x.shape[0]) % d_c.shape[0]
        null = (cond == -1).reshape(-1, *([1] * (x.ndim - 1))) if cond is not None else True
        return torch.where(null, d_u[rows], d_c[rows])


def close(a, b, rtol=RTOL):
    scale = max(float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) <= rtol * scale


def guide(g, d_c, d_u, x=None, sigma=None, cond=None):
    x = rand(*d_c.shape, seed=9) if x is None else x
    sigma = torch.full((d_c.shape[0],), 0.7, dtype=torch.float64) if sigma is None else sigma
    cond = torch.zeros(d_c.shape[0], dtype=torch.long) if cond is None else cond
    den = Scripted(d_c, d_u)
    return g.guide(den, x, sigma, cond), den


@pytest.fixture
def preds():
    return rand(*SHAPE, seed=1), rand(*SHAPE, seed=2)


# --- U1 CFG ---------------------------------------------------------------------------------------------------
def test_u1_cfg_w1_is_cond_without_null_branch(preds):
    d_c, d_u = preds
    out, den = guide(CFG(1.0), d_c, d_u)
    assert torch.equal(out, d_c)
    assert len(den.calls) == 1 and not (den.calls[0] == -1).any()
    assert den.calls[0].shape == (SHAPE[0],)  # not a doubled batch


def test_u1_cfg_w0_is_uncond(preds):
    d_c, d_u = preds
    out, den = guide(CFG(0.0), d_c, d_u)
    assert torch.equal(out, d_u)
    assert len(den.calls) == 1 and (den.calls[0] == -1).all()


def test_u1_cfg_formula_one_doubled_batch(preds):
    d_c, d_u = preds
    out, den = guide(CFG(4.5), d_c, d_u)
    assert close(out, d_u + 4.5 * (d_c - d_u))
    assert len(den.calls) == 1 and den.calls[0].shape == (2 * SHAPE[0],)
    assert (den.calls[0][: SHAPE[0]] == 0).all() and (den.calls[0][SHAPE[0] :] == -1).all()


@pytest.mark.parametrize("w", [0.0, 0.5, 3.0, 12.0])
def test_u1_cfg_d_and_eps_space_agree(preds, w):
    d_c, d_u = preds
    x, sigma = rand(*SHAPE, seed=5) * 3, torch.tensor([0.01, 0.5, 3.0, 40.0], dtype=torch.float64)
    out, _ = guide(CFG(w), d_c, d_u, x=x, sigma=sigma)
    e_c, e_u = sd.core.eps_from_denoised(x, sigma, d_c), sd.core.eps_from_denoised(x, sigma, d_u)
    via_eps = sd.core.denoised_from_eps(x, sigma, e_u + w * (e_c - e_u))
    assert close(out, via_eps)
    # and score space
    s_c, s_u = sd.core.score_from_denoised(x, sigma, d_c), sd.core.score_from_denoised(x, sigma, d_u)
    via_score = x + sigma.reshape(-1, 1, 1, 1) ** 2 * (s_u + w * (s_c - s_u))
    assert close(out, via_score)


# --- U2 APG reductions ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("w", [0.0, 2.0, 7.5, 15.0])
def test_u2_apg_reduces_to_cfg(preds, w):
    d_c, d_u = preds
    apg, _ = guide(APG(w, eta=1.0, norm_threshold=0.0, momentum=0.0), d_c, d_u)
    cfg, _ = guide(CFG(w), d_c, d_u)
    assert close(apg, cfg)


def test_u2_apg_w1_is_cond(preds):
    d_c, d_u = preds
    out, den = guide(APG(1.0, eta=0.0, r_rms=0.01, momentum=-0.5), d_c, d_u)
    assert torch.equal(out, d_c) and len(den.calls) == 1 and not (den.calls[0] == -1).any()


# --- U3 orthogonality, clamp, momentum ------------------------------------------------------------------------
def _per_sample(a, b):
    return (a * b).flatten(1).sum(1), a.flatten(1).norm(dim=1), b.flatten(1).norm(dim=1)


def test_u3_orthogonality(preds):
    d_c, d_u = preds
    w = 6.0
    out, _ = guide(APG(w, eta=0.0, momentum=0.0), d_c, d_u)
    orth = (out - d_c) / (w - 1)
    dot, n_orth, n_c = _per_sample(orth, d_c)
    assert ((dot.abs() / (n_orth * n_c)) < 1e-10).all()
    par, orth2 = project(d_c - d_u, d_c)
    assert close(orth, orth2) and close(par + orth2, d_c - d_u)


def test_u3_clamp(preds):
    d_c, d_u = preds
    w = 4.0
    norms = (d_c - d_u).flatten(1).norm(dim=1)
    r = float(norms.median())  # some rows above r, some below
    out, _ = guide(APG(w, eta=1.0, norm_threshold=r, momentum=0.0), d_c, d_u)
    upd = (out - d_c) / (w - 1)
    n_upd = upd.flatten(1).norm(dim=1)
    assert (n_upd <= r * (1 + 1e-12)).all()
    below = norms <= r
    assert below.any() and (~below).any()
    assert close(upd[below], (d_c - d_u)[below])  # unchanged when already below r
    assert torch.allclose(n_upd[~below], torch.full_like(n_upd[~below], r), rtol=1e-12, atol=0)
    # r_rms is r / sqrt(d)
    d = math.prod(SHAPE[1:])
    out2, _ = guide(APG(w, eta=1.0, r_rms=r / math.sqrt(d), momentum=0.0), d_c, d_u)
    assert close(out2, out)


def test_u3_momentum_over_five_calls_and_reset():
    beta, w, k = -0.5, 3.0, 5
    d_cs = [rand(*SHAPE, seed=10 + j) for j in range(k)]
    d_us = [rand(*SHAPE, seed=20 + j) for j in range(k)]
    apg = APG(w, eta=1.0, norm_threshold=0.0, momentum=beta)
    den = Scripted(d_cs, d_us)
    x, sigma, cond = rand(*SHAPE, seed=9), torch.ones(SHAPE[0], dtype=torch.float64), torch.zeros(SHAPE[0]).long()
    for j in range(k):
        out = apg.guide(den, x, sigma, cond)
        expected = sum(beta ** (j - i) * (d_cs[i] - d_us[i]) for i in range(j + 1))
        assert close((out - d_cs[j]) / (w - 1), expected)
        assert close(apg.momentum_buffer, expected)
    apg.reset()
    assert apg.momentum_buffer is None
    den2 = Scripted(d_cs, d_us)
    out = apg.guide(den2, x, sigma, cond)
    assert close((out - d_cs[0]) / (w - 1), d_cs[0] - d_us[0])


def test_u3_momentum_reinit_on_shape_change():
    apg = APG(3.0, eta=1.0, momentum=-0.5)
    d_c, d_u = rand(4, 6, seed=1), rand(4, 6, seed=2)
    guide(apg, d_c, d_u)
    out, _ = guide(apg, d_c[:2], d_u[:2])  # a new batch: the old buffer must not leak in
    assert close(out, d_c[:2] + 2.0 * (d_c[:2] - d_u[:2]))


# --- U4 batch independence ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: CFGRescale(7.0, phi=0.7),
        lambda: CFGRescale(7.0, phi=0.7, space="eps"),
        lambda: APG(9.0, eta=0.3, norm_threshold=4.0, momentum=-0.5),
        lambda: APG(9.0, eta=0.0, r_rms=0.2, momentum=-0.5, space="eps"),
    ],
    ids=["rescale-D", "rescale-eps", "apg-D", "apg-eps"],
)
def test_u4_batch_equals_per_sample(make):
    calls = 3
    d_cs = [rand(*SHAPE, seed=30 + j) * (1 + j) for j in range(calls)]
    d_us = [rand(*SHAPE, seed=40 + j) for j in range(calls)]
    x = rand(*SHAPE, seed=50)
    sigma = torch.tensor([0.1, 1.0, 5.0, 20.0], dtype=torch.float64)
    cond = torch.tensor([0, 1, 2, 0])
    g, den = make(), Scripted(d_cs, d_us)
    batch = [g.guide(den, x, sigma, cond) for _ in range(calls)]
    for i in range(SHAPE[0]):
        gi, deni = make(), Scripted([d[i : i + 1] for d in d_cs], [d[i : i + 1] for d in d_us])
        for j in range(calls):
            single = gi.guide(deni, x[i : i + 1], sigma[i : i + 1], cond[i : i + 1])
            assert close(single, batch[j][i : i + 1])


def test_cfg_rescale_formula_in_d_space(preds):
    """Lin et al. Sec. 3.4 written out: per-sample Bessel std over all non-batch dims, phi mix."""
    d_c, d_u = preds
    w, phi = 6.0, 0.7
    cfg = d_u + w * (d_c - d_u)
    std = [t.flatten(1).std(dim=1, unbiased=True).reshape(-1, 1, 1, 1) for t in (d_c, cfg)]
    expected = phi * cfg * std[0] / std[1] + (1 - phi) * cfg
    out, den = guide(CFGRescale(w, phi=phi), d_c, d_u)
    assert close(out, expected) and len(den.calls) == 1
    assert close(guide(CFGRescale(w, phi=0.0), d_c, d_u)[0], cfg)  # phi = 0 is CFG


# --- U5 scale conventions -------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", [0.0, 1.0, 3.0, 7.5])
def test_u5_diffusers_cfg_convention(preds, s):
    c, u = preds
    ours, _ = guide(CFG(sd.guidance.w_from_diffusers(s)), c, u)
    assert close(ours, u + s * (c - u))  # diffusers' default formula, written here
    ours, _ = guide(CFG(sd.guidance.w_from_diffusers(s, use_original_formulation=True)), c, u)
    assert close(ours, c + s * (c - u))  # use_original_formulation=True
    assert sd.guidance.diffusers_from_w(sd.guidance.w_from_diffusers(s)) == s
    assert sd.guidance.omega_from_w(sd.guidance.w_from_omega(s)) == s


def _comfyui_apg_reference(conds, unconds, s, eta, r, momentum):
    """ComfyUI's APG node + its CFG function, written out (comfy_extras/nodes_apg.py, comfy/samplers.py)."""
    dims = [-1, -2, -3]
    running, outs = 0, []
    for cond, uncond in zip(conds, unconds, strict=True):
        if s == 1.0:  # cfg1 optimization: no uncond batch, the pre-CFG hook returns the cond prediction
            outs.append(cond)
            continue
        guidance = cond - uncond
        if momentum != 0:
            running = guidance if not torch.is_tensor(running) else momentum * running + guidance
            guidance = running
        if r > 0:
            n = guidance.norm(p=2, dim=dims, keepdim=True)
            guidance = guidance * torch.minimum(torch.ones_like(n), r / n)
        v1 = torch.nn.functional.normalize(cond, dim=dims)
        par = (guidance * v1).sum(dim=dims, keepdim=True) * v1
        modified = (guidance - par) + eta * par
        modified_cond = (uncond + modified) + (cond - uncond) / s
        outs.append(uncond + (modified_cond - uncond) * s)  # ComfyUI's cfg_function
    return outs


@pytest.mark.parametrize("s", [1.0, 2.0, 4.5, 10.0])
def test_u5_comfyui_apg_convention(s):
    eta, r, momentum = 0.25, 20.0, -0.5
    d_cs = [rand(*SHAPE, seed=60 + j) for j in range(3)]
    d_us = [rand(*SHAPE, seed=70 + j) for j in range(3)]
    ref = _comfyui_apg_reference(d_cs, d_us, s, eta, r, momentum)
    apg = APG(sd.guidance.w_from_comfyui_apg(s), eta=eta, norm_threshold=r, momentum=momentum)
    den = Scripted(d_cs, d_us)
    x, sigma, cond = rand(*SHAPE, seed=9), torch.ones(SHAPE[0], dtype=torch.float64), torch.zeros(SHAPE[0]).long()
    for j in range(3):
        assert close(apg.guide(den, x, sigma, cond), ref[j])


def test_u5_conventions_table():
    to_w, from_w = sd.guidance.to_w, sd.guidance.from_w
    assert to_w(3.0, "ho_salimans") == 4.0 and to_w(3.0, "apg_paper") == 3.0 and to_w(3.0, "comfyui_apg") == 4.0
    assert to_w(1.0, "comfyui_apg") == 1.0  # ComfyUI skips guidance at cond_scale 1
    assert from_w(4.0, "comfyui_apg") == 3.0 and from_w(1.0, "comfyui_apg") == 1.0
    with pytest.raises(ValueError, match="no ComfyUI APG equivalent"):
        from_w(2.0, "comfyui_apg")
    with pytest.raises(ValueError, match="cond_scale = 0"):
        to_w(0.0, "comfyui_apg")
    with pytest.raises(ValueError, match="unknown scale convention"):
        to_w(1.0, "a1111")
    with pytest.raises(ValueError, match=">= 0"):
        to_w(-2.0, "ho_salimans")


def test_u5_against_installed_diffusers(preds):
    """The same identities against diffusers' own code, where it is installed."""
    pytest.importorskip("diffusers")
    from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer, normalized_guidance
    from diffusers.guiders.guider_utils import rescale_noise_cfg

    c, u = preds
    x, sigma = rand(*SHAPE, seed=5), torch.tensor([0.2, 1.0, 4.0, 9.0], dtype=torch.float64)
    s4 = sigma.reshape(-1, 1, 1, 1)
    # CFG-rescale in eps space = diffusers' rescale_noise_cfg on eps predictions.
    e_c, e_u = (x - c) / s4, (x - u) / s4
    ref = x - s4 * rescale_noise_cfg(e_u + 5.0 * (e_c - e_u), e_c, guidance_rescale=0.7)
    ours, _ = guide(CFGRescale(5.0, phi=0.7, space="eps"), c, u, x=x, sigma=sigma)
    assert close(ours, ref)
    # diffusers' APG with use_original_formulation=True is the paper's operator at w = s + 1.
    buf = MomentumBuffer(-0.5)
    apg = APG(sd.guidance.w_from_diffusers(3.0, use_original_formulation=True), eta=0.2, norm_threshold=8.0)
    for j in range(3):
        cj, uj = c * (1 + j), u - j
        ref = normalized_guidance(cj, uj, 3.0, buf, 0.2, 8.0, use_original_formulation=True)
        assert close(guide(apg, cj, uj)[0], ref)


# --- NaN safety (docs/methods/guidance.md, "Numerical safety"; huggingface/diffusers#13425) -------------------
def test_zero_cond_prediction_no_nan():
    d_c, d_u = torch.zeros(SHAPE, dtype=torch.float64), rand(*SHAPE, seed=2)
    for g in (APG(5.0), APG(5.0, eta=0.5, r_rms=0.1), APG(5.0, space="eps"), CFGRescale(5.0), CFG(5.0)):
        out, _ = guide(g, d_c, d_u)
        assert torch.isfinite(out).all(), g
    out, _ = guide(APG(5.0, eta=0.0, momentum=0.0), d_c, d_u)
    assert close(out, d_c + 4.0 * (d_c - d_u))  # no direction to project on: the whole update is kept


def test_zero_update_no_nan():
    d = rand(*SHAPE, seed=1)
    for g in (APG(5.0, norm_threshold=1.0), APG(5.0, r_rms=0.5, momentum=-0.9), CFGRescale(5.0)):
        out, _ = guide(g, d, d.clone())
        assert torch.isfinite(out).all() and close(out, d)
    assert torch.equal(clamp_norm(torch.zeros(2, 3), 1.0), torch.zeros(2, 3))


def test_zero_std_no_nan():
    const_c, const_u = torch.full(SHAPE, 0.3, dtype=torch.float64), torch.full(SHAPE, -0.2, dtype=torch.float64)
    for space in ("D", "eps"):
        x = torch.full(SHAPE, 0.5, dtype=torch.float64)  # constant x keeps the eps predictions constant too
        out, _ = guide(CFGRescale(6.0, space=space), const_c, const_u, x=x)
        assert torch.isfinite(out).all()
        assert close(out, const_u + 6.0 * (const_c - const_u))  # a constant cannot be rescaled: left as CFG
    zeros = torch.zeros(SHAPE, dtype=torch.float64)
    out, _ = guide(CFGRescale(6.0), zeros, zeros)
    assert torch.equal(out, zeros)
    # one element per sample: no Bessel-corrected std; no rescale instead of NaN
    one_c, one_u = rand(3, 1, seed=1), rand(3, 1, seed=2)
    out, _ = guide(CFGRescale(4.0), one_c, one_u)
    assert torch.isfinite(out).all() and torch.isfinite(bessel_std(one_c)).all()


def test_extreme_momentum_stays_finite():
    apg = APG(15.0, eta=0.0, momentum=-0.999, r_rms=0.5)
    d_c, d_u = rand(*SHAPE, seed=1), rand(*SHAPE, seed=2)
    for _ in range(200):
        out, _ = guide(apg, d_c, d_u)
    assert torch.isfinite(out).all()


def test_sampling_a_zero_denoiser_stays_finite():
    def zero(x, sigma, cond=None):
        return torch.zeros_like(x)

    noise = sd.randn((8, 2, 3, 3), seeds=0, dtype=torch.float64)
    cond = torch.zeros(8, dtype=torch.long)
    for g in (CFG(7.0), CFGRescale(7.0), CFGRescale(7.0, space="eps"), APG(7.0, r_rms=0.1), APG(7.0, space="eps")):
        out = sd.sample(zero, noise, sd.sigmas.karras(6), method="heun", cond=cond, guidance=g)
        assert torch.isfinite(out).all() and (out == 0).all(), g


# --- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CFG, CFGRescale, APG])
@pytest.mark.parametrize("scale", [-0.5, float("nan"), float("inf"), -float("inf")])
def test_bad_scale(cls, scale):
    with pytest.raises(ValueError, match="scale must be finite and >= 0"):
        cls(scale)


def test_bad_scale_type():
    with pytest.raises(TypeError, match="scale must be a real number"):
        CFG(True)
    with pytest.raises(TypeError, match="scale must be a real number"):
        CFG("7")


@pytest.mark.parametrize("eta", [-0.1, 1.01, float("nan")])
def test_bad_eta(eta):
    with pytest.raises(ValueError, match=r"eta must be a finite number in \[0.0, 1.0\]"):
        APG(5.0, eta=eta)


@pytest.mark.parametrize("momentum", [1.0, -1.0, 1.5, -7.0])
def test_bad_momentum(momentum):
    with pytest.raises(ValueError, match=r"\|momentum\| < 1"):
        APG(5.0, momentum=momentum)
    with pytest.raises(ValueError, match="momentum must be a finite number"):
        APG(5.0, momentum=float("nan"))


def test_bad_other_arguments():
    with pytest.raises(ValueError, match="norm_threshold must be a finite number >= 0"):
        APG(5.0, norm_threshold=-1.0)
    with pytest.raises(ValueError, match="not both"):
        APG(5.0, norm_threshold=1.0, r_rms=0.1)
    with pytest.raises(ValueError, match="phi must be"):
        CFGRescale(5.0, phi=1.5)
    with pytest.raises(ValueError, match="space must be 'D'"):
        APG(5.0, space="x0")
    with pytest.raises(ValueError, match="start must be"):
        CFG(5.0, start=1.0)
    with pytest.raises(ValueError, match="stop must be"):
        CFG(5.0, start=0.5, stop=0.25)


def test_cond_none_is_an_error(preds):
    d_c, d_u = preds
    den = Scripted(d_c, d_u)
    with pytest.raises(ValueError, match="CFG needs a condition"):
        CFG(3.0).guide(den, d_c, torch.ones(SHAPE[0]), None)
    with pytest.raises(ValueError, match="guidance needs a condition"):  # through the sampler (core's check)
        sd.sample(den, torch.randn(SHAPE), sd.sigmas.karras(2), guidance=CFG(3.0))
    with pytest.raises(ValueError, match="integer tensor"):
        CFG(3.0).guide(den, d_c, torch.ones(SHAPE[0]), torch.zeros(SHAPE[0]))


def test_model_without_null_is_an_error(preds):
    d_c, d_u = preds

    class NoNull(Scripted):
        has_null = False

    for g in (CFG(3.0), CFG(0.0), CFGRescale(3.0), APG(3.0)):
        with pytest.raises(ValueError, match="has_null = False"):
            g.guide(NoNull(d_c, d_u), d_c, torch.ones(SHAPE[0]), torch.zeros(SHAPE[0]).long())
    # w = 1 needs no null: allowed
    assert torch.equal(CFG(1.0).guide(NoNull(d_c, d_u), d_c, torch.ones(SHAPE[0]), torch.zeros(SHAPE[0]).long()), d_c)


def test_unconditional_models_are_refused():
    unlabeled = sd.models.GaussianMixture([1.0, 1.0], [[-1.0], [1.0]], 0.1)
    with pytest.raises(ValueError, match="no component labels"):
        sd.sample(unlabeled, torch.randn(4, 1), sd.sigmas.karras(3), cond=torch.zeros(4).long(), guidance=CFG(3.0))
    net = sd.models.EDMPrecond(sd.models.MLP(dim=2, hidden=[8]))
    with pytest.raises(ValueError, match="unconditional"):
        sd.sample(net, torch.randn(4, 2), sd.sigmas.karras(3), cond=torch.zeros(4).long(), guidance=APG(3.0))


def test_eps_space_needs_positive_sigma(preds):
    d_c, d_u = preds
    with pytest.raises(ValueError, match="sigma > 0"):
        guide(APG(3.0, space="eps"), d_c, d_u, sigma=torch.zeros(SHAPE[0], dtype=torch.float64))


def test_config_round_trip():
    for g in (CFG(3.0, start=0.1), CFGRescale(5.0, phi=0.5, space="eps"), APG(7.5, eta=0.2, r_rms=0.05)):
        again = type(g).from_config(g.config)
        assert again.config == g.config and repr(again) == repr(g)
