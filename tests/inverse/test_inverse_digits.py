"""8x8 digits (the digits protocol of docs/methods/inverse.md): HR, DR and tuned DPS on centre inpainting and 2x
super-resolution, sigma_y 0.05, 8 chains, 100 levels, lam 0.25, v 1, lr 0.1, beta 0.2. HR's gate is taken on prior
(b), the analytic surrogate (20-component mixture fit on our 1438-image train split; exact posterior references),
and on the shipped UNet. On prior (a), the shipped tiny MLP ``digits_mlp``, the required behaviour is the warning
and the measured noise-feedback gain (docs/methods/inverse.md, "Findings and amendments").

The gate rules are slow (the UNet part takes ~10 minutes on a loaded 2-core CPU); ``benchmarks/inverse.py`` runs the
full tables. Measured there on 100 images: every rule passes under the surrogate; under the UNet, HR is 1.7 dB
(inpainting) and 1.1 dB (SR) below tuned DPS (rule: within 0.75 dB), and its inpainting diversity is 0.089 vs DR's
0.093. Under the MLP prior HR diverges (12.7 / 14.0 dB, below the zero-fill baseline + 3 dB): the predicted noise it
re-uses grows from level to level below sigma ~ 1 (rms 1.4 at sigma 1.2, > 500 at 0.5), while DR and DPS stay sane
(``V.predicted_noise_rms``); the loop gain ``sqrt(1 - beta) ||I - dD/dx||_2`` of the MLP exceeds 1.
"""

import functools

import pytest
import torch

from steerdiff.app.protocols import inverse as V

CASES = {"gmm": 100, "unet": 30}  # images per prior (the surrogate's rules are marginal on fewer images)
KNOWN_FAILURES = {  # (prior, task, rule), measured to fail; strict xfails, so a fix shows up as an XPASS failure
    ("unet", "inpaint-center", "HR PSNR >= max(DR, DPS-best) - 0.75 dB"),
    ("unet", "sr2", "HR PSNR >= max(DR, DPS-best) - 0.75 dB"),
    ("unet", "inpaint-center", "HR diversity >= DR diversity"),  # 0.089 vs 0.093: small, but on the wrong side
}


@functools.cache
def _rows(kind: str, task: str) -> dict:
    prior = V.digits_prior(kind)
    dtype = torch.float64 if kind == "gmm" else torch.float32
    op, x, y = V.digits_problem(task, CASES[kind], dtype=dtype)
    rows = V.digits_references(prior, op, x, y)
    _, xt, yt = V.digits_problem(task, 10, offset=200, dtype=dtype)
    best = max((0.6, 1.0, 2.0), key=lambda s: V.digits_run(prior, op, xt, yt, "dps", scale=s)["psnr"])
    rows["dr"] = V.digits_run(prior, op, x, y, "dr")
    rows["hr"] = V.digits_run(prior, op, x, y, "hr")
    rows["dps"] = V.digits_run(prior, op, x, y, "dps", scale=best)
    rows["timing"] = {"time_ratio_hr_dps": rows["hr"]["wall_time_s"] / rows["dps"]["wall_time_s"]}
    return V.digits_criteria(rows, task)


def _cases():
    for kind in CASES:
        for task in V.DIGITS_TASKS:
            rules = [f"HR SSIM >= {V.DIGITS_SSIM_MIN[task]}", "HR PSNR >= baseline + 3 dB",
                     "HR PSNR >= max(DR, DPS-best) - 0.75 dB", "HR diversity >= DR diversity",
                     "HR wall time < DPS wall time"] + (["HR PSNR >= exact posterior sample - 1 dB"] if kind == "gmm"
                                                        else [])
            for rule in rules:
                known = (kind, task, rule) in KNOWN_FAILURES
                marks = [pytest.mark.xfail(strict=True, reason="measured; see docstring")] if known else []
                yield pytest.param(kind, task, rule, marks=marks, id=f"{kind}-{task}-{rule}")


@pytest.mark.slow
@pytest.mark.parametrize("kind, task, rule", list(_cases()))
def test_digits_rule(kind, task, rule):
    value, bound, ok = _rows(kind, task)[rule]
    assert ok, f"{rule}: {value:.4g} vs {bound:.4g}"


@pytest.mark.parametrize("task", V.DIGITS_TASKS)
def test_prior_a_hr_warns_and_its_measured_noise_feedback_gain_exceeds_one(task):
    """Prior (a): HR must warn that the denoiser amplifies its re-used noise, and the measured loop gain
    ``sqrt(1 - beta) ||I - dD/dx||_2`` at HR's levels must exceed 1 (the mechanism of the divergence)."""
    prior = V.digits_prior("mlp")
    op, x, y = V.digits_problem(task, 4)
    with pytest.warns(RuntimeWarning, match="amplifies its own noise estimate"):
        V.digits_run(prior, op, x, y, "hr", chains=2)
    gain = [max(V.noise_feedback_gain(prior, x.double(), s)["loop_gain"]) for s in (1.2, 0.5)]
    assert max(gain) > 1, gain
