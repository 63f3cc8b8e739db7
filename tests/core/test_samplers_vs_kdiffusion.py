"""The new samplers against k-diffusion's (``k_diffusion.sampling.sample_*``) on the same denoiser and schedule.

k-diffusion is a test-only dependency (``requirements-test-reference.txt``, installed by ``make test`` with
``--no-deps``). Its package ``__init__`` imports torchvision (through ``utils`` and ``evaluation``), whose PyPI wheels
are CUDA builds that do not load beside the CPU torch; ``k_diffusion/sampling.py`` itself needs only scipy,
torchdiffeq, torchsde and, from ``k_diffusion.utils``, ``append_dims``. So the installed ``sampling.py`` is loaded as
a file module under its own name, with ``k_diffusion.utils`` made of the installed ``utils.py``'s own
``append_dims`` (its source, compiled from the file; the test fails if ``sampling.py`` starts needing more of
``utils``). Every line of k-diffusion that runs is k-diffusion's.

Deterministic paths must agree to 1e-5 (float64 mixture: to rounding). The stochastic samplers get our per-sample
noise through k-diffusion's ``noise_sampler(sigma, sigma_next)`` argument, so both integrate the same path; with
k-diffusion's own Brownian-tree noise the two are compared in distribution.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import steerdiff as sd
from steerdiff.core import SampleNoise, make_generators
from steerdiff.metrics import sliced_wasserstein
from steerdiff.models import builtin_mixture

HINT = "k-diffusion is a test-only dependency: pip install --no-deps -r requirements-test-reference.txt"


def _load_kdiffusion_sampling():
    spec = importlib.util.find_spec("k_diffusion")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(HINT)
    for dep in ("torchsde", "torchdiffeq", "scipy"):
        if importlib.util.find_spec(dep) is None:
            pytest.skip(f"{dep} is missing; {HINT}")
    root = Path(spec.submodule_search_locations[0])
    src = (root / "sampling.py").read_text()
    used = {n.attr for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "utils"}
    utils_tree = ast.parse((root / "utils.py").read_text())
    defs = [n for n in utils_tree.body if isinstance(n, ast.FunctionDef) and n.name in used]
    assert {d.name for d in defs} == used, f"k_diffusion.sampling now uses utils.{sorted(used)}: extend the loader"
    pkg = types.ModuleType("_kd_ref")
    pkg.__path__ = [str(root)]
    utils = types.ModuleType("_kd_ref.utils")
    utils.__dict__["torch"] = torch
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(root / "utils.py"), "exec"), utils.__dict__)
    pkg.utils = utils
    saved = {k: sys.modules.get(k) for k in ("_kd_ref", "_kd_ref.utils", "_kd_ref.sampling")}
    sys.modules.update({"_kd_ref": pkg, "_kd_ref.utils": utils})
    try:
        mod_spec = importlib.util.spec_from_file_location("_kd_ref.sampling", root / "sampling.py")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules["_kd_ref.sampling"] = module
        mod_spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


@pytest.fixture(scope="module")
def K():
    return _load_kdiffusion_sampling()


@pytest.fixture(scope="module")
def gmm16d():
    return builtin_mixture("gmm16d")


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")


def _kd_model(denoiser):
    return lambda x, sigma, **_: denoiser(x, sigma, None)


def _mlp_denoiser(dim: int = 4):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(dim + 1, 64), torch.nn.SiLU(), torch.nn.Linear(64, dim))

    def denoiser(x, sigma, cond=None):
        s = sigma[:, None].to(x.dtype)
        return x / (1 + s**2) + net(torch.cat([x / (1 + s**2).sqrt(), s.log() / 4], 1)) * s / (1 + s**2).sqrt()

    return denoiser


def _mode_frequencies(x, mixture) -> torch.Tensor:
    assign = mixture.responsibilities(x).argmax(-1)
    return torch.bincount(assign, minlength=mixture.n_components).double() / x.shape[0]


def _err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1))


DETERMINISTIC = [("dpmpp_2m", "sample_dpmpp_2m", {}), ("lms", "sample_lms", {})]
STOCHASTIC = [
    ("dpmpp_2m_sde", "sample_dpmpp_2m_sde", {"solver_type": "midpoint"}, 1.0),
    ("dpmpp_2m_sde", "sample_dpmpp_2m_sde", {"solver_type": "heun"}, 1.0),
    ("dpmpp_2m_sde", "sample_dpmpp_2m_sde", {"solver_type": "heun"}, 0.5),
    ("dpmpp_3m_sde", "sample_dpmpp_3m_sde", {}, 1.0),
    ("dpmpp_3m_sde", "sample_dpmpp_3m_sde", {}, 0.3),
    ("euler_ancestral", "sample_euler_ancestral", {}, 1.0),
    ("euler_ancestral", "sample_euler_ancestral", {}, 0.5),
]


@pytest.mark.parametrize("ours,theirs,opts", DETERMINISTIC)
@pytest.mark.parametrize("steps", [2, 3, 12])
def test_deterministic_samplers_match_kdiffusion(K, gmm16d, ours, theirs, opts, steps):
    noise = sd.randn((64, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    a = sd.sample(gmm16d, noise, sigmas, method=ours, **opts)
    b = getattr(K, theirs)(_kd_model(gmm16d), noise * sigmas[0], sigmas, disable=True, **opts)
    assert _err(a, b) < 1e-5, _err(a, b)


@pytest.mark.parametrize("ours,theirs,opts,eta", STOCHASTIC)
def test_stochastic_samplers_match_kdiffusion_with_the_same_noise(K, gmm16d, ours, theirs, opts, eta):
    noise = sd.randn((32, 16), seeds=0, dtype=torch.float64)
    sigmas = sd.sigmas.karras(15, 0.002, 80.0)
    a = sd.sample(gmm16d, noise, sigmas, method=ours, generator=100, eta=eta, **opts)
    same = SampleNoise(make_generators(100, 32))  # the generators sd.sample made: the same draws, in order
    calls = []

    def noise_sampler(sigma, sigma_next):
        calls.append((float(sigma), float(sigma_next)))
        return same.randn((32, 16), torch.float64)

    b = getattr(K, theirs)(_kd_model(gmm16d), noise * sigmas[0], sigmas, disable=True, eta=eta,
                           noise_sampler=noise_sampler, **opts)
    assert len(calls) == 14  # noise on every step but the last, to sigma = 0
    assert _err(a, b) < 1e-5, _err(a, b)
    # The noise matters: a different seed gives a different path (the comparison above is not vacuous).
    c = sd.sample(gmm16d, noise, sigmas, method=ours, generator=200, eta=eta, **opts)
    assert _err(c, b) > 1e-2


@pytest.mark.parametrize("ours,theirs,opts,eta", [*[(o, t, p, 1.0) for o, t, p in DETERMINISTIC], *STOCHASTIC[::3]])
def test_samplers_match_kdiffusion_on_a_float32_network(K, ours, theirs, opts, eta):
    denoiser = _mlp_denoiser()
    noise = sd.randn((16, 4), seeds=3)
    sigmas = sd.sigmas.karras(10, 0.01, 20.0).float()
    kw = {} if ours in ("dpmpp_2m", "lms") else {"eta": eta}
    a = sd.sample(denoiser, noise, sigmas.double(), method=ours, generator=5, **kw, **opts)
    same = SampleNoise(make_generators(5, 16))
    extra = {} if not kw else {"noise_sampler": lambda s, sn: same.randn((16, 4), torch.float32)}
    b = getattr(K, theirs)(_kd_model(denoiser), noise * sigmas[0], sigmas, disable=True, **kw, **extra, **opts)
    assert _err(a, b) < 1e-5, _err(a, b)


@pytest.mark.parametrize("method,theirs", [("dpmpp_2m_sde", "sample_dpmpp_2m_sde"),
                                           ("dpmpp_3m_sde", "sample_dpmpp_3m_sde")])
def test_sde_samplers_match_kdiffusion_brownian_tree_in_distribution(K, gmm2d, method, theirs):
    n, steps = 4000, 50
    sigmas = sd.sigmas.karras(steps, 0.002, 80.0)
    noise = sd.randn((n, 2), seeds=0, dtype=torch.float64)
    ours = sd.sample(gmm2d, noise, sigmas, method=method, generator=10_000)
    # k-diffusion's default noise: a Brownian tree over [sigma_min, sigma_max] (one tree for the batch here).
    tree = K.BrownianTreeNoiseSampler(noise, sigmas[sigmas > 0].min(), sigmas.max(), seed=1234)
    start = sd.randn((n, 2), seeds=50_000, dtype=torch.float64) * sigmas[0]
    theirs_x = getattr(K, theirs)(_kd_model(gmm2d), start, sigmas, disable=True, noise_sampler=tree)
    exact = [gmm2d.sample(n, torch.Generator().manual_seed(300 + i)) for i in range(3)]
    floor = max(sliced_wasserstein(exact[i], exact[j]) for i in range(3) for j in range(i + 1, 3))
    assert sliced_wasserstein(ours, theirs_x) <= 1.2 * floor, (sliced_wasserstein(ours, theirs_x), floor)
    # Mode frequencies: ours and theirs differ by no more than two exact draws of the same size do (total variation).
    hist = [_mode_frequencies(x, gmm2d) for x in (ours, theirs_x, *exact)]
    tv_floor = max(0.5 * (hist[i] - hist[j]).abs().sum() for i in range(2, 5) for j in range(i + 1, 5))
    assert 0.5 * (hist[0] - hist[1]).abs().sum() <= 1.5 * tv_floor, (hist[0], hist[1], tv_floor)
    # Same moments (mean and covariance) to within sampling error of n = 4000 draws.
    m_a, m_b = ours.mean(0), theirs_x.mean(0)
    assert (m_a - m_b).abs().max() < 0.15, (m_a, m_b)
    np.testing.assert_allclose(np.cov(ours.T.numpy()), np.cov(theirs_x.T.numpy()), atol=0.25)
