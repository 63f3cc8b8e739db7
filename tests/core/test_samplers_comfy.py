"""ComfyUI-only samplers (``heunpp2``, ``ipndm``, ``ipndm_v``) against references written here from ComfyUI's
``comfy/k_diffusion/sampling.py`` definitions (plain loops on the denoiser, independent of steerdiff's code), on the
exact float64 mixture, to 1e-10."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS
from steerdiff.models import builtin_mixture


@pytest.fixture(scope="module")
def gmm16d():
    return builtin_mixture("gmm16d")


def _err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1))


class _Ref:
    """The denoiser as ComfyUI's samplers call it: ``model(x, sigma * ones)``, counted."""

    def __init__(self, denoiser):
        self.denoiser, self.n = denoiser, 0

    def __call__(self, x, sigma):
        self.n += 1
        return self.denoiser(x, torch.full((x.shape[0],), float(sigma), dtype=x.dtype), None)


def ref_heunpp2(model, x, sigmas):
    s_end = sigmas[-1]
    for i in range(len(sigmas) - 1):
        den = model(x, sigmas[i])
        d = (x - den) / sigmas[i]
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == s_end:
            x = x + d * dt
        elif sigmas[i + 2] == s_end:
            x2 = x + d * dt
            d2 = (x2 - model(x2, sigmas[i + 1])) / sigmas[i + 1]
            w2 = sigmas[i + 1] / (2 * sigmas[0])
            x = x + (d * (1 - w2) + d2 * w2) * dt
        else:
            x2 = x + d * dt
            d2 = (x2 - model(x2, sigmas[i + 1])) / sigmas[i + 1]
            x3 = x2 + d2 * (sigmas[i + 2] - sigmas[i + 1])
            d3 = (x3 - model(x3, sigmas[i + 2])) / sigmas[i + 2]
            w2, w3 = sigmas[i + 1] / (3 * sigmas[0]), sigmas[i + 2] / (3 * sigmas[0])
            x = x + ((1 - w2 - w3) * d + w2 * d2 + w3 * d3) * dt
    return x


def ref_ipndm(model, x, sigmas, max_order=4, variable=False):
    buf = []  # the previous derivatives, oldest first, at most max_order - 1
    t = sigmas
    for i in range(len(t) - 1):
        den = model(x, t[i])
        d = (x - den) / t[i]
        order = min(max_order, i + 1)
        hn = t[i + 1] - t[i]
        if t[i + 1] == 0:
            x_new = den
        elif order == 1:
            x_new = x + hn * d
        elif not variable:
            if order == 2:
                x_new = x + hn * (3 * d - buf[-1]) / 2
            elif order == 3:
                x_new = x + hn * (23 * d - 16 * buf[-1] + 5 * buf[-2]) / 12
            else:
                x_new = x + hn * (55 * d - 59 * buf[-1] + 37 * buf[-2] - 9 * buf[-3]) / 24
        else:
            h1 = t[i] - t[i - 1]
            if order == 2:
                x_new = x + hn * ((2 + hn / h1) / 2 * d - (hn / h1) / 2 * buf[-1])
            else:
                h2 = t[i - 1] - t[i - 2]
                tmp = (1 - hn / (3 * (hn + h1)) * (hn * (hn + h1)) / (h1 * (h1 + h2))) / 2
                if order == 3:
                    c = [(2 + hn / h1) / 2 + tmp, -(hn / h1) / 2 - (1 + h1 / h2) * tmp, tmp * h1 / h2]
                else:
                    h3 = t[i - 2] - t[i - 3]
                    g = h1 * (h1 + h2) / (h2 * (h2 + h3))
                    tmp2 = ((1 - hn / (3 * (hn + h1))) / 2 + (1 - hn / (2 * (hn + h1))) * hn / (6 * (hn + h1 + h2))) \
                        * (hn * (hn + h1) * (hn + h1 + h2)) / (h1 * (h1 + h2) * (h1 + h2 + h3))
                    c = [(2 + hn / h1) / 2 + tmp + tmp2,
                         -(hn / h1) / 2 - (1 + h1 / h2) * tmp - (1 + h1 / h2 + g) * tmp2,
                         tmp * h1 / h2 + (h1 / h2 + g * (1 + h2 / h3)) * tmp2,
                         -tmp2 * g * h1 / h2]
                x_new = x + hn * sum(cj * dj for cj, dj in zip(c, [d, *buf[::-1]], strict=False))
        x = x_new
        buf = (buf + [d])[-(max_order - 1):] if max_order > 1 else []
    return x


CASES = [("heunpp2", {}, ref_heunpp2), ("ipndm", {}, ref_ipndm),
         ("ipndm", {"max_order": 2}, lambda m, x, s: ref_ipndm(m, x, s, 2)),
         ("ipndm_v", {}, lambda m, x, s: ref_ipndm(m, x, s, variable=True)),
         ("ipndm_v", {"max_order": 3}, lambda m, x, s: ref_ipndm(m, x, s, 3, variable=True))]


@pytest.mark.parametrize("method,opts,ref", CASES)
@pytest.mark.parametrize("steps", [1, 2, 3, 10])
def test_comfy_samplers_match_their_definition(gmm16d, method, opts, ref, steps):
    noise = sd.randn((32, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method=method, return_stats=True, **opts)
    model = _Ref(gmm16d)
    b = ref(model, noise * sigmas[0], sigmas.tolist())
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == SAMPLERS.get(method).nfe(steps)


def test_ipndm_v_is_ipndm_on_equal_steps_up_to_order_3(gmm16d):
    # Up to order 3 the variable-step weights reduce to Adams-Bashforth's on equal steps. ComfyUI's order-4 weights do
    # not (57/24, ..., -11/24 instead of 55/24, ..., -9/24 on equal steps): ipndm_v keeps ComfyUI's definition.
    noise = sd.randn((8, 16), seeds=1, dtype=torch.float64)
    sigmas = torch.cat([torch.linspace(20.0, 0.5, 9, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    a = sd.sample(gmm16d, noise, sigmas, method="ipndm", max_order=3)
    b = sd.sample(gmm16d, noise, sigmas, method="ipndm_v", max_order=3)
    assert _err(a, b) < 1e-12
    four = sd.sample(gmm16d, noise, sigmas, method="ipndm_v")
    assert _err(four, sd.sample(gmm16d, noise, sigmas, method="ipndm")) > 1e-6


def test_heunpp2_refuses_an_infinite_start():
    mix = builtin_mixture("gmm2d")
    with pytest.raises(ValueError, match="infinite first"):
        sd.sample(mix, sd.randn((2, 2), seeds=0, dtype=torch.float64), sd.sigmas.flow(4), method="heunpp2")


@pytest.mark.parametrize("method", ["ipndm", "ipndm_v"])
def test_flow_start_at_infinity(method):
    mix = builtin_mixture("gmm2d")
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.flow(8)
    assert math.isinf(float(sigmas[0]))
    x = sd.sample(mix, noise, sigmas, method=method)
    assert torch.isfinite(x).all()
    # the first step from inf is the Euler limit; after it the finite schedule runs as from its second level
    one = sd.sample(mix, noise, sigmas[:2].clone().index_fill_(0, torch.tensor([1]), 0.0), method=method)
    torch.testing.assert_close(one, sd.sample(mix, noise, torch.tensor([math.inf, 0.0], dtype=torch.float64),
                                              method="euler"), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["ipndm", "ipndm_v"])
def test_max_order_is_checked(gmm16d, method):
    noise = sd.randn((2, 16), seeds=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="max_order"):
        sd.sample(gmm16d, noise, sd.sigmas.karras(4), method=method, max_order=5)


def _ancestral(s, s_next, eta):  # k-diffusion's / ComfyUI's get_ancestral_step
    if not eta:
        return s_next, 0.0
    up = min(s_next, eta * (s_next**2 * (s**2 - s_next**2) / s**2) ** 0.5)
    return (s_next**2 - up**2) ** 0.5, up


def ref_res_multistep(model, x, sigmas, noise_sampler, eta):
    old_den, old_down = None, None
    for i in range(len(sigmas) - 1):
        den = model(x, sigmas[i])
        down, up = _ancestral(sigmas[i], sigmas[i + 1], eta)
        if down == 0 or old_den is None:
            x = x + (x - den) / sigmas[i] * (down - sigmas[i])
        else:
            t, t_old, t_next, t_prev = (-math.log(v) for v in (sigmas[i], old_down, down, sigmas[i - 1]))
            h = t_next - t
            c2 = (t_prev - t_old) / h
            phi1 = math.expm1(-h) / -h
            phi2 = (phi1 - 1.0) / -h
            x = math.exp(-h) * x + h * ((phi1 - phi2 / c2) * den + (phi2 / c2) * old_den)
        if sigmas[i + 1] > 0:
            x = x + noise_sampler() * up
        old_den, old_down = den, down
    return x


def ref_er_sde(model, x, sigmas, noise_sampler, s_noise, max_stage=3):
    def f(v):
        return v * (torch.exp(v**0.3) + 10.0)

    lam = torch.tensor(sigmas, dtype=torch.float64)  # er_lambda = sigma / alpha with alpha = 1
    pts = torch.arange(0, 200.0, dtype=torch.float64)
    old_den = old_dd = None
    for i in range(len(sigmas) - 1):
        den = model(x, sigmas[i])
        stage = min(max_stage, i + 1)
        if sigmas[i + 1] == 0:
            x = den
        else:
            ls, lt = lam[i], lam[i + 1]
            r = f(lt) / f(ls)
            x = r * x + (1 - r) * den
            if stage >= 2:
                dt = lt - ls
                step = -dt / 200.0
                pos = lt + pts * step
                s = torch.sum(1 / f(pos)) * step
                dd = (den - old_den) / (ls - lam[i - 1])
                x = x + (dt + s * f(lt)) * dd
                if stage >= 3:
                    su = torch.sum((pos - ls) / f(pos)) * step
                    du = (dd - old_dd) / ((ls - lam[i - 2]) / 2)
                    x = x + (dt**2 / 2 + su * f(lt)) * du
                old_dd = dd
            if s_noise > 0:
                x = x + noise_sampler() * s_noise * (lt**2 - ls**2 * r**2).sqrt().nan_to_num(nan=0.0)
        old_den = den
    return x


NOISY = [("res_multistep", {}, 0.0), ("res_multistep", {}, 0.7), ("res_multistep_ancestral", {}, 1.0),
         ("er_sde", {}, 1.0), ("er_sde", {}, 0.0), ("er_sde", {"max_stage": 2}, 0.5)]


@pytest.mark.parametrize("method,opts,eta", NOISY)
@pytest.mark.parametrize("steps", [1, 3, 10])
def test_noisy_comfy_samplers_match_their_definition_with_the_same_noise(gmm16d, method, opts, eta, steps):
    from steerdiff.core import SampleNoise, make_generators

    n = 16
    noise = sd.randn((n, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method=method, generator=100, eta=eta, return_stats=True, **opts)
    same = SampleNoise(make_generators(100, n)) if eta > 0 else None

    def draw():
        return same.randn((n, 16), torch.float64) if same is not None else torch.zeros(n, 16, dtype=torch.float64)

    model = _Ref(gmm16d)
    if method.startswith("res"):
        b = ref_res_multistep(model, noise * sigmas[0], sigmas.tolist(), draw, eta)
    else:
        b = ref_er_sde(model, noise * sigmas[0], sigmas.tolist(), draw, eta, **opts)
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == SAMPLERS.get(method).nfe(steps)
    if eta > 0 and steps > 1:
        c = sd.sample(gmm16d, noise, sigmas, method=method, generator=200, eta=eta, **opts)
        assert _err(c, b) > 1e-3  # the noise matters


@pytest.mark.parametrize("method", ["res_multistep", "res_multistep_ancestral", "er_sde"])
def test_noisy_comfy_samplers_from_infinity(method):
    mix = builtin_mixture("gmm2d")
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    x = sd.sample(mix, noise, sd.sigmas.flow(8), method=method, generator=4)
    assert torch.isfinite(x).all()
    one = torch.tensor([math.inf, 0.0], dtype=torch.float64)
    torch.testing.assert_close(sd.sample(mix, noise, one, method=method, generator=4),
                               sd.sample(mix, noise, one, method="euler"), rtol=0, atol=1e-12)


def test_res_multistep_is_second_order(gmm16d):
    noise = sd.randn((8, 16), seeds=1, dtype=torch.float64)
    ref = sd.sample(gmm16d, noise, sd.sigmas.karras(400, 0.05, 20.0), method="heun")
    errs = [_err(sd.sample(gmm16d, noise, sd.sigmas.karras(n, 0.05, 20.0), method="res_multistep"), ref)
            for n in (10, 20)]
    assert errs[1] < errs[0] / 2.5, errs


def ref_deis_coefficients(sigmas, max_order, n=10000):
    """ComfyUI's ``get_deis_coeff_list(..., deis_mode="tab")`` (comfy/k_diffusion/deis.py) in float64: ``edm2t``, the
    integrand from autograd of ``log alpha``, Lagrange polynomials in t, its Riemann rule."""
    eps_s, smin, smax = 1e-3, torch.tensor(0.002, dtype=torch.float64), torch.tensor(80.0, dtype=torch.float64)
    beta_d = 2 * (torch.log(smin**2 + 1) / eps_s - torch.log(smax**2 + 1)) / (eps_s - 1)
    beta_min = torch.log(smax**2 + 1) - 0.5 * beta_d
    sig = torch.tensor(sigmas, dtype=torch.float64)
    t_steps = ((beta_min**2 + 2 * beta_d * (sig**2 + 1).log()).sqrt() - beta_min) / beta_d
    beta_0, beta_1 = beta_min, beta_d + beta_min
    out = []
    for i in range(len(sigmas) - 1):
        order = min(i + 1, max_order)
        if order == 1:
            out.append([])
            continue
        taus = torch.linspace(float(t_steps[i]), float(t_steps[i + 1]), n, dtype=torch.float64).requires_grad_(True)
        alpha = torch.exp(-0.5 * taus**2 * (beta_1 - beta_0) - taus * beta_0)
        (grad,) = torch.autograd.grad(alpha.log().sum(), taus)
        taus, alpha = taus.detach(), alpha.detach()
        integrand = -0.5 * grad / torch.sqrt(alpha * (1 - alpha))
        prev = t_steps[[i - k for k in range(order)]]
        dtau = (t_steps[i + 1] - t_steps[i]) / n
        coeffs = []
        for j in range(order):
            poly = 1
            for k in range(order):
                if k != j:
                    poly = poly * (taus - prev[k]) / (prev[j] - prev[k])
            coeffs.append(torch.sum(integrand * poly) * dtau)
        out.append(coeffs)
    return out


def ref_deis(model, x, sigmas, max_order=3):
    coeffs = ref_deis_coefficients(sigmas, max_order)
    buf = []  # newest last
    for i in range(len(sigmas) - 1):
        den = model(x, sigmas[i])
        d = (x - den) / sigmas[i]
        order = 1 if sigmas[i + 1] <= 0 else min(max_order, i + 1)
        if order == 1:
            x = x + (sigmas[i + 1] - sigmas[i]) * d
        else:
            x = x + coeffs[i][0] * d + sum(c * b for c, b in zip(coeffs[i][1:], buf[::-1], strict=False))
        buf = (buf + [d])[-(max_order - 1):] if max_order > 1 else []
    return x


@pytest.mark.parametrize("max_order", [2, 3])
@pytest.mark.parametrize("steps", [1, 3, 8])
def test_deis_matches_comfyui(gmm16d, max_order, steps):
    noise = sd.randn((16, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method="deis", max_order=max_order, return_stats=True)
    model = _Ref(gmm16d)
    b = ref_deis(model, noise * sigmas[0], sigmas.tolist(), max_order)
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == steps


def test_deis_from_infinity_and_accuracy():
    from steerdiff.core.deis import deis_time, deis_weights

    mix = builtin_mixture("gmm2d")
    noise = sd.randn((8, 2), seeds=0, dtype=torch.float64)
    assert torch.isfinite(sd.sample(mix, noise, sd.sigmas.flow(8), method="deis")).all()
    # The weights integrate dsigma/dt against a partition of unity: they sum to the step in sigma, up to ComfyUI's
    # Riemann rule (n points, spacing (t' - t)/n: a relative bias of about 1/n).
    times = [deis_time(v) for v in (3.0, 5.0, 9.0)]
    total = sum(deis_weights(times, deis_time(2.0)))
    assert abs(total - (2.0 - 3.0)) < 3e-4, total
    g16 = builtin_mixture("gmm16d")
    noise = sd.randn((8, 16), seeds=1, dtype=torch.float64)
    ref = sd.sample(g16, noise, sd.sigmas.karras(400, 0.05, 20.0), method="heun")
    sig = sd.sigmas.karras(10, 0.05, 20.0)
    euler = _err(sd.sample(g16, noise, sig, method="euler"), ref)
    assert _err(sd.sample(g16, noise, sig, method="deis"), ref) < euler / 3


def _ref_sa_coeffs(lams, lam_s, lam_t, tau, sigma_next):
    """ComfyUI's ``compute_stochastic_adams_b_coeffs``: the exponential moments in plain ``lambda`` by its
    integration-by-parts matrix, then the transposed Vandermonde solve, times ``alpha_t = sigma' e^{lambda'}``."""
    n = len(lams)
    c, h = 1 + tau**2, lam_t - lam_s
    p = torch.arange(n, dtype=torch.float64)
    terms = lam_t**p - lam_s**p * math.exp(-c * h)
    depth = p[:, None] - p[None, :]
    logf = (p + 1).lgamma()
    mat = logf[:, None] - logf[None, :] - (depth * math.log(c) if tau > 0 else 0)
    mat = (mat.exp() * torch.where(depth % 2 == 0, 1.0, -1.0)).tril()
    v = torch.vander(torch.tensor(lams, dtype=torch.float64), n, increasing=True).T
    return sigma_next * math.exp(lam_t) * torch.linalg.solve(v, mat @ terms)


def ref_sa_solver(model, x, sigmas, noise_sampler, tau_of, p_order=3, c_order=4, pece=False):
    lams = [-math.log(s) if s > 0 else math.inf for s in sigmas]
    n = len(sigmas) - 1
    x_pred, h, tau, nz, preds = x, 0.0, 0.0, 0.0, []
    for i in range(n):
        den = model(x_pred, sigmas[i])
        preds = (preds + [den])[-max(p_order, c_order):]
        pu = min(p_order, len(preds))
        cu = 0 if i == 0 or (sigmas[i + 1] == 0 and not pece) else min(c_order, len(preds))
        if sigmas[-1] == 0:
            pu, cu = min(pu, n - 1 - i), min(cu, n - i)
        if cu == 0:
            x = x_pred
        else:
            b = _ref_sa_coeffs(lams[i - cu + 1:i + 1], lams[i - 1], lams[i], tau, sigmas[i])
            x = sigmas[i] / sigmas[i - 1] * math.exp(-(tau**2) * h) * x + torch.tensordot(
                torch.stack(preds[-cu:], 1), b, dims=([1], [0]))
            if tau > 0:
                x = x + nz
            if pece:
                den = model(x, sigmas[i])
                preds[-1] = den
        if sigmas[i + 1] == 0:
            x_pred = den
        else:
            tau = tau_of(sigmas[i + 1])
            b = _ref_sa_coeffs(lams[i - pu + 1:i + 1], lams[i], lams[i + 1], tau, sigmas[i + 1])
            h = lams[i + 1] - lams[i]
            x_pred = sigmas[i + 1] / sigmas[i] * math.exp(-(tau**2) * h) * x + torch.tensordot(
                torch.stack(preds[-pu:], 1), b, dims=([1], [0]))
            if tau > 0:
                nz = noise_sampler() * sigmas[i + 1] * math.sqrt(-math.expm1(-2 * tau**2 * h))
                x_pred = x_pred + nz
    return x_pred


SA = [("sa_solver", {}, 1.0), ("sa_solver", {}, 0.0), ("sa_solver_pece", {}, 1.0),
      ("sa_solver", {"tau_window": (10.0, 0.5)}, 0.8), ("sa_solver_pece", {"predictor_order": 2,
                                                                           "corrector_order": 1}, 1.0)]


@pytest.mark.parametrize("method,opts,eta", SA)
@pytest.mark.parametrize("steps", [1, 2, 4, 10])
def test_sa_solver_matches_comfyui_with_the_same_noise(gmm16d, method, opts, eta, steps):
    from steerdiff.core import SampleNoise, make_generators

    n = 16
    noise = sd.randn((n, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a, stats = sd.sample(gmm16d, noise, sigmas, method=method, generator=100, eta=eta, return_stats=True, **opts)
    same = SampleNoise(make_generators(100, n))
    hi, lo = opts.get("tau_window", (math.inf, 0.0))
    model = _Ref(gmm16d)
    b = ref_sa_solver(model, noise * sigmas[0], sigmas.tolist(), lambda: same.randn((n, 16), torch.float64),
                      lambda s: eta if hi >= s >= lo else 0.0, opts.get("predictor_order", 3),
                      opts.get("corrector_order", 4), method.endswith("pece"))
    assert _err(a, b) < 1e-10, _err(a, b)
    assert stats.nfe == model.n == SAMPLERS.get(method).nfe(steps)
    if eta > 0 and any(hi >= s >= lo for s in sigmas[1:-1].tolist()):  # some step lands in the noisy window
        c = sd.sample(gmm16d, noise, sigmas, method=method, generator=200, eta=eta, **opts)
        assert _err(c, b) > 1e-3  # the noise matters


def test_sa_coefficients_integrate_polynomials_exactly():
    from steerdiff.core.sa_solver import sa_coefficients

    # at tau = 0 the weights integrate e^{-(l' - u)} q(u) exactly for q of degree < len(nodes): check q = u^2
    lams, ls, lt = [-1.3, -0.9, -0.2], -0.2, 0.5
    b = sa_coefficients(lams, ls, lt, 0.0)
    u = torch.linspace(ls, lt, 200001, dtype=torch.float64)
    exact = torch.trapezoid(torch.exp(-(lt - u)) * u**2, u)
    assert abs(sum(bj * lj**2 for bj, lj in zip(b, lams, strict=True)) - float(exact)) < 1e-9


def test_sa_solver_refuses_bad_input(gmm16d):
    noise = sd.randn((2, 16), seeds=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="corrector_order"):
        sd.sample(gmm16d, noise, sd.sigmas.karras(4, 0.002, 80.0), method="sa_solver", corrector_order=0)
    with pytest.raises(ValueError, match="tau_window"):
        sd.sample(gmm16d, noise, sd.sigmas.karras(4, 0.002, 80.0), method="sa_solver", tau_window=(0.1, 1.0))
    with pytest.raises(ValueError, match="inf"):
        sd.sample(gmm16d, noise, sd.sigmas.flow(4), method="sa_solver")
