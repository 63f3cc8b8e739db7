"""sigma = inf as the first level: what takes it, what refuses it (naming the argument), and bad flow input."""

import math
import warnings

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core import FlowDenoiser, VPDenoiser
from steerdiff.core.sigmas import check_sigmas
from steerdiff.models import EDMPrecond, builtin_mixture

INF = math.inf


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


def _noise(n=3, d=2):
    return sd.randn((n, d), seeds=0, dtype=torch.float64)


def test_check_sigmas_takes_inf_only_first_and_only_where_asked():
    s = check_sigmas([INF, 3.0, 0.0])
    assert math.isinf(s[0]) and s.dtype == torch.float64
    for bad, msg in (([3.0, INF, 0.0], r"sigmas\[1\] = inf"), ([INF, INF, 0.0], r"sigmas\[1\] = inf"),
                     ([INF, math.nan, 0.0], r"sigmas must be finite \(sigmas\[1\] = nan\)"),
                     ([2.0, -INF, 0.0], "sigmas must be finite"), ([INF, 1.0, 2.0, 0.0], "strictly decreasing"),
                     ([INF, 0.0, 0.0], "strictly decreasing")):
        with pytest.raises(ValueError, match=msg):
            check_sigmas(bad)
    for final in ("any", "positive"):  # SMC grids and solver levels stay finite unless the consumer opts in
        with pytest.raises(ValueError, match=f"final='{final}'.*cannot start at sigma = inf"):
            check_sigmas([INF, 3.0, 1.0], final=final)
        assert math.isinf(check_sigmas([INF, 3.0, 1.0], final=final, allow_inf_start=True)[0])
    with pytest.raises(ValueError, match="cannot start at sigma = inf"):
        check_sigmas([INF, 1.0, 0.0], allow_inf_start=False)


@pytest.mark.parametrize("method", ["euler", "heun", "ddim", "ddpm"])
def test_sample_refuses_inf_after_the_first_level_and_non_decreasing_schedules(gmm2d, method):
    with pytest.raises(ValueError, match=r"sigmas must be finite except the first level: sigmas\[2\] = inf"):
        sd.sample(gmm2d, _noise(), torch.tensor([5.0, 2.0, INF, 0.0]), method=method)
    with pytest.raises(ValueError, match=r"strictly decreasing; sigmas\[1\]=3 <= sigmas\[2\]=4"):
        sd.sample(gmm2d, _noise(), torch.tensor([INF, 3.0, 4.0, 0.0]), method=method)


def _vp():
    abar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    return VPDenoiser(lambda x, t, c: torch.zeros_like(x), abar)


def _edm():
    return EDMPrecond({"class": "MLP", "config": {"dim": 2, "hidden": [8]}}, sigma_data=0.5)


@pytest.mark.parametrize("make", [_vp, _edm], ids=["VPDenoiser", "EDMPrecond"])
def test_a_denoiser_with_a_finite_range_refuses_an_inf_start_naming_sigmas_and_its_range(make):
    d = make()
    calls = []
    for allow in (False, True):  # not even with allow_out_of_range: there is no top timestep to clamp to at inf
        with pytest.raises(ValueError, match=rf"sigmas\[0\] = inf .*{type(d).__name__}.*sigma_range is \(0"):
            sd.sample(d, _noise(), sd.sigmas.flow(5), method="euler", allow_out_of_range=allow,
                      callback=calls.append)
    assert calls == []  # refused before any evaluation


def test_ocm_kernels_refuse_an_inf_start(gmm2d):
    for method in ("ocm-ddpm", "ocm-ddim"):
        with pytest.raises(ValueError, match=r"sigmas\[0\] = inf .*ocm-\* Gaussian kernels need a finite first"):
            sd.sample(gmm2d, _noise(), sd.sigmas.flow(5), method=method, covariance=gmm2d, generator=0)
    from steerdiff.covariance import sample_gaussian

    with pytest.raises(ValueError, match="ocm-\\* Gaussian kernels need a finite first level"):
        sample_gaussian(gmm2d, _noise(), sd.sigmas.flow(5), kind="ddpm", covariance=gmm2d, generator=0)


def test_an_inf_start_never_warns_about_the_prior(gmm2d):
    flow = FlowDenoiser(lambda x_t, t: torch.zeros_like(x_t), t_scale=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sd.sample(gmm2d, _noise(), sd.sigmas.flow(4), method="heun")
        sd.sample(flow, _noise(), sd.sigmas.flow(4), method="heun")
        sd.sample(gmm2d, _noise(), sd.sigmas.karras(4, 0.01, 5.0), method="euler")  # an exact model: no scale rule
    # a flow model's t-grid mistaken for sigmas still warns (flow models are trained on unit-scale data)
    with pytest.warns(RuntimeWarning, match="not the model's pure-noise prior"):
        sd.sample(flow, _noise(), torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), method="euler")


def test_a_plain_denoiser_without_a_limit_at_inf_is_named_with_the_step_and_t():
    def edm_like(x, sigma, cond=None):  # x sigma^2 / (1 + sigma^2): inf / inf at sigma = inf
        return x * sigma[:, None] ** 2 / (1 + sigma[:, None] ** 2)

    with pytest.raises(FloatingPointError, match=r"at step 0 \(sigma=inf\) .*t = sigma/\(1\+sigma\) = 1\).*"
                                                 r"unit noise as x"):
        sd.sample(edm_like, _noise(), sd.sigmas.flow(3), method="euler")


@pytest.mark.parametrize("kwargs, msg", [
    ({"steps": 0}, "steps must be an integer >= 1"),
    ({"steps": 2.0}, "steps must be an integer >= 1"),
    ({"steps": 4, "shift": 0.0}, "shift must be a positive finite number"),
    ({"steps": 4, "shift": -3.0}, "shift must be a positive finite number"),
    ({"steps": 4, "shift": math.inf}, "shift must be a positive finite number"),
    ({"steps": 4, "shift": math.nan}, "shift must be a positive finite number"),
    ({"steps": 4, "shift": 3.0, "mu": 0.5}, "shift=3.0 is the static shift"),
    ({"steps": 4, "mu": 0.5, "image_seq_len": 1024}, "not both"),
    ({"steps": 4, "mu": math.nan}, "mu must be a finite number"),
    ({"steps": 4, "image_seq_len": 0}, "image_seq_len must be a positive integer"),
    ({"steps": 4, "image_seq_len": 64, "base_seq_len": 4096, "max_seq_len": 256}, "need base_seq_len < max_seq_len"),
    ({"steps": 4, "image_seq_len": 64, "max_shift": math.inf}, "max_shift must be a finite number"),
    ({"steps": 4, "grid": "karras"}, "grid must be one of"),
    ({"steps": 4, "num_train_timesteps": 0}, "num_train_timesteps must be an integer >= 1"),
])
def test_flow_schedule_bad_input(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        sd.sigmas.flow(**kwargs)


def test_flow_schedule_formulas():
    # static shift on the scheduler's grid, in numpy: u = linspace(1, shift(1/1000), N), t = shift(u)
    shift, n = 3.0, 7
    sh = lambda u: shift * u / (1 + (shift - 1) * u)  # noqa: E731
    t = sh(np.linspace(1.0, sh(1e-3), n))
    s = sd.sigmas.flow(n, shift)
    assert s.shape == (n + 1,) and s.dtype == torch.float64 and math.isinf(s[0]) and s[-1] == 0
    np.testing.assert_allclose(s[1:-1].numpy(), t[1:] / (1 - t[1:]), rtol=1e-12)
    np.testing.assert_allclose((s[1:] / (1 + s[1:])).numpy(), np.append(t[1:], 0.0), rtol=1e-12)
    # dynamic shift (FLUX): u = linspace(1, 1/N, N), t = e^mu / (e^mu + 1/u - 1), mu linear in the token count
    mu = 0.5 + (1.15 - 0.5) * (1024 - 256) / (4096 - 256)
    u = np.linspace(1.0, 1 / n, n)
    t = np.exp(mu) / (np.exp(mu) + 1 / u - 1)
    s = sd.sigmas.flow(n, image_seq_len=1024)
    np.testing.assert_allclose(s[1:-1].numpy(), t[1:] / (1 - t[1:]), rtol=1e-12)
    torch.testing.assert_close(sd.sigmas.flow(n, mu=mu), s, rtol=1e-14, atol=0)
    assert sd.sigmas.flow(1).tolist() == [INF, 0.0]
    assert torch.all(sd.sigmas.flow(200, 3.0)[1:] < sd.sigmas.flow(200, 3.0)[:-1])


def test_flow_denoiser_bad_input():
    net = lambda x_t, t, cond=None: torch.zeros_like(x_t)  # noqa: E731
    with pytest.raises(ValueError, match=r"prediction must be one of \('velocity', 'x0', 'eps'\), got 'v'"):
        FlowDenoiser(net, prediction="v")
    for bad in (0.0, -1.0, math.inf, math.nan, "1000", True):
        with pytest.raises(ValueError, match="t_scale must be a positive finite number"):
            FlowDenoiser(net, t_scale=bad)
    with pytest.raises(TypeError, match="net must be a callable"):
        FlowDenoiser(42)
    with pytest.raises(TypeError, match=r"net must accept \(x_t, t\) or \(x_t, t, cond\)"):
        FlowDenoiser(lambda x_t: x_t)
    with pytest.raises(ValueError, match="cond was given but the flow network takes"):
        FlowDenoiser(lambda x_t, t: x_t)(_noise(), torch.ones(3), torch.zeros(3, dtype=torch.long))


def test_a_flow_network_of_the_wrong_shape_or_nan_is_named_with_the_step_and_t():
    wrong = FlowDenoiser(lambda x_t, t: x_t[:, :1], t_scale=1.0)
    with pytest.raises(ValueError, match=r"flow network returned shape \(3, 1\), expected the shape of x_t \(3, 2\)"
                                         r".*at step 0 \(sigma=inf, flow time t = sigma/\(1\+sigma\) = 1\)"):
        sd.sample(wrong, _noise(), sd.sigmas.flow(4), method="euler")

    def nan_late(x_t, t):  # fine until t < 0.5
        return torch.where(t[:, None] < 0.5, torch.full_like(x_t, math.nan), torch.zeros_like(x_t))

    sig = sd.sigmas.flow(4)
    step = int(np.argmax((sig / (1 + sig)).numpy() < 0.5))
    t_at = (sig[step] / (1 + sig[step])).item()
    with pytest.raises(FloatingPointError, match=rf"non-finite values at step {step} \(sigma={sig[step]:.6g}\) "
                                                 rf"for 3 of 3 samples \(flow time t = sigma/\(1\+sigma\) = "
                                                 rf"{t_at:.6g}\)"):
        sd.sample(FlowDenoiser(nan_late, t_scale=1.0), _noise(), sig, method="euler")


def test_an_eps_flow_network_refuses_sigma_inf():
    d = FlowDenoiser(lambda x_t, t: torch.zeros_like(x_t), prediction="eps", t_scale=1.0)
    assert d.sigma_range[1] < INF
    with pytest.raises(ValueError, match=r"sigmas\[0\] = inf .*FlowDenoiser.*sigma_range"):
        sd.sample(d, _noise(), sd.sigmas.flow(4), method="euler")
    with pytest.raises(ValueError, match="eps-predicting flow network cannot be evaluated at sigma = inf"):
        d(_noise(), torch.full((3,), INF))
    finite = sd.sigmas.flow(4)
    finite[0] = 1e4  # a finite start (noise * 1e4) is fine
    assert torch.isfinite(sd.sample(d, _noise(), finite, method="euler")).all()


def test_a_sampler_not_written_for_an_inf_start_is_refused_there(gmm2d):
    """A sampler registered without ``inf_start`` would get the unit noise as its state unawares: refused."""
    from steerdiff.core import SAMPLERS, register_sampler

    calls = []

    @register_sampler("test-no-inf", nfe=lambda steps: steps)
    def _naive(model, x, sigmas, **_):
        calls.append(sigmas[0])
        return x

    try:
        with pytest.raises(ValueError, match=r"method='test-no-inf' was not written for an infinite first level"):
            sd.sample(gmm2d, _noise(), sd.sigmas.flow(5), method="test-no-inf")
        assert calls == []
        sd.sample(gmm2d, _noise(), sd.sigmas.karras(5), method="test-no-inf")  # a finite start still runs
        assert calls == [80.0]
    finally:
        SAMPLERS.remove("test-no-inf")
    assert all(SAMPLERS.get(n).inf_start for n in ("euler", "heun", "ddim", "ddpm"))
