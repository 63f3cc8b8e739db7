"""ComfyUI's schedules (comfy/samplers.py) against their definitions written here as plain Python loops over the
model's table (independent of the vectorised code), and k-diffusion's ``get_sigmas_exponential`` /
``get_sigmas_polyexponential`` (float64), to 1e-12."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from steerdiff.core import sigmas as S
from tests.core.test_samplers_vs_kdiffusion import _load_kdiffusion_sampling

TABLE = S.vp_linear_table()  # DDPM's linear schedule, 1000 increasing sigmas
SD_TABLE = S.sigmas_from_alphas_cumprod(torch.cumprod(1 - torch.linspace(0.00085**0.5, 0.012**0.5, 1000,
                                                                          dtype=torch.float64) ** 2, 0))


def _close(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(((a - b).abs() / b.abs().clamp(min=1)).max())
    assert err < 1e-12, err


def ref_simple(table, steps):
    ss = len(table) / steps
    return [float(table[-(1 + int(x * ss))]) for x in range(steps)] + [0.0]


def ref_ddim_uniform(table, steps):
    x = 1
    if math.isclose(float(table[x]), 0, abs_tol=0.00001):
        steps += 1
        sigs = []
    else:
        sigs = [0.0]
    ss = max(len(table) // steps, 1)
    while x < len(table):
        sigs.append(float(table[x]))
        x += ss
    return sigs[::-1]


def ref_sgm_uniform(table, steps):
    log_sigmas = [math.log(float(s)) for s in table]

    def sigma(ts):  # ModelSamplingDiscrete.sigma
        t = min(max(ts, 0.0), len(table) - 1)
        lo, hi = math.floor(t), math.ceil(t)
        w = t - lo
        return math.exp((1 - w) * log_sigmas[lo] + w * log_sigmas[hi])

    start, end = len(table) - 1, 0  # timestep(sigma_max), timestep(sigma_min)
    ts = np.linspace(start, end, steps + 1)[:-1]
    return [sigma(float(t)) for t in ts] + [0.0]


def ref_beta(table, steps, alpha=0.6, beta=0.6):
    total = len(table) - 1
    ts = np.rint(scipy.stats.beta.ppf(1 - np.linspace(0, 1, steps, endpoint=False), alpha, beta) * total)
    sigs, last = [], -1
    for t in ts:
        if t != last:
            sigs.append(float(table[int(t)]))
        last = t
    return sigs + [0.0]


def ref_linear_quadratic(steps, sigma_max=1.0, threshold_noise=0.025, linear_steps=None):
    if steps == 1:
        return [sigma_max, 0.0]
    linear_steps = steps // 2 if linear_steps is None else linear_steps
    lin = [i * threshold_noise / linear_steps for i in range(linear_steps)]
    diff = linear_steps - threshold_noise * steps
    q = steps - linear_steps
    qc = diff / (linear_steps * q**2)
    lc = threshold_noise / linear_steps - 2 * diff / q**2
    const = qc * linear_steps**2
    quad = [qc * i**2 + lc * i + const for i in range(linear_steps, steps)]
    return [(1.0 - u) * sigma_max for u in lin + quad + [1.0]]


def ref_kl_optimal(n, sigma_min, sigma_max):
    return [math.tan((i / (n - 1)) * math.atan(sigma_min) + (1 - i / (n - 1)) * math.atan(sigma_max))
            for i in range(n)] + [0.0]


@pytest.mark.parametrize("steps", [1, 3, 10, 30, 999])
@pytest.mark.parametrize("table", [TABLE, SD_TABLE], ids=["ddpm", "sd"])
def test_table_schedules_match_comfyui(steps, table):
    _close(S.simple(steps, table), ref_simple(table, steps))
    _close(S.ddim_uniform(steps, table), ref_ddim_uniform(table, steps))
    _close(S.sgm_uniform(steps, table), ref_sgm_uniform(table, steps))
    _close(S.beta(steps, table), ref_beta(table, steps))
    _close(S.beta(steps, table, alpha=0.3, beta=1.2), ref_beta(table, steps, 0.3, 1.2))


def test_ddim_uniform_on_a_table_starting_at_zero():
    table = torch.cat([torch.zeros(1, dtype=torch.float64), torch.linspace(1e-5, 10.0, 99, dtype=torch.float64)])
    table[1] = 1e-7  # entry 1 is "0" to ComfyUI's tolerance: one more step, no extra 0
    _close(S.ddim_uniform(7, table), ref_ddim_uniform(table, 7))


@pytest.mark.parametrize("steps", [1, 2, 5, 30])
def test_linear_quadratic_matches_comfyui(steps):
    _close(S.linear_quadratic(steps), ref_linear_quadratic(steps))
    _close(S.linear_quadratic(steps, sigma_max=14.6, threshold_noise=0.1), ref_linear_quadratic(steps, 14.6, 0.1))
    if steps > 2:
        _close(S.linear_quadratic(steps, linear_steps=1), ref_linear_quadratic(steps, linear_steps=1))


@pytest.mark.parametrize("steps", [2, 9, 40])
def test_kl_optimal_matches_comfyui(steps):
    _close(S.kl_optimal(steps, 0.03, 14.6), ref_kl_optimal(steps, 0.03, 14.6))


@pytest.mark.parametrize("steps", [1, 2, 9, 40])
def test_exponential_schedules_match_kdiffusion(steps):
    K = _load_kdiffusion_sampling()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # k-diffusion builds its ramp with the default dtype
    try:
        _close(S.exponential(steps, 0.03, 14.6), K.get_sigmas_exponential(steps, 0.03, 14.6))
        for rho in (0.5, 1.0, 2.5):
            _close(S.polyexponential(steps, 0.03, 14.6, rho), K.get_sigmas_polyexponential(steps, 0.03, 14.6, rho))
    finally:
        torch.set_default_dtype(old)


def test_registry_names_and_validation():
    for name in ("karras", "exponential", "polyexponential", "kl_optimal", "simple", "ddim_uniform", "sgm_uniform",
                 "beta", "linear_quadratic"):
        s = S.SCHEDULES.get(name)(6)
        assert s.dtype == torch.float64 and s[-1] == 0 and torch.all(s[1:] < s[:-1]), name
        S.check_sigmas(s)
    with pytest.raises(ValueError, match="schedule"):
        S.SCHEDULES.get("nope")
    with pytest.raises(ValueError, match="steps"):
        S.exponential(0)
    with pytest.raises(ValueError, match="table"):
        S.simple(4, torch.tensor([3.0, 2.0, 1.0]))
    assert torch.isinf(S.flow_t_to_sigma(S.linear_quadratic(4))[0])
