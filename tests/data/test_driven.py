"""The driven-trajectory generator (steerdiff.data.driven) against the closed-form ODE solution and its contracts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from steerdiff.data.driven import DrivenSpring, driven_batch, driving_signal, simulate


def _closed_form(system: DrivenSpring, u: float, p0: float, v0: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p'' + p'/tau + omega^2 p = (gain/tau) u with p(0)=p0, p'(0)=v0, solved by hand (constant u)."""
    w2, tau = system.omega**2, system.tau
    p_ss = system.gain * u / (tau * w2)
    a0 = p0 - p_ss
    alpha = 1.0 / (2.0 * tau)
    if alpha**2 < w2:  # underdamped: p_ss + e^{-alpha t} (A cos wd t + B sin wd t)
        wd = math.sqrt(w2 - alpha**2)
        b0 = (v0 + alpha * a0) / wd
        e, c, s = np.exp(-alpha * t), np.cos(wd * t), np.sin(wd * t)
        p = p_ss + e * (a0 * c + b0 * s)
        v = e * ((-alpha * a0 + wd * b0) * c + (-alpha * b0 - wd * a0) * s)
        return p, v
    r1, r2 = -alpha + math.sqrt(alpha**2 - w2), -alpha - math.sqrt(alpha**2 - w2)  # overdamped: two real roots
    c1 = (v0 - r2 * a0) / (r1 - r2)
    c2 = a0 - c1
    return p_ss + c1 * np.exp(r1 * t) + c2 * np.exp(r2 * t), c1 * r1 * np.exp(r1 * t) + c2 * r2 * np.exp(r2 * t)


@pytest.mark.parametrize("system", [DrivenSpring(noise=0.0), DrivenSpring(period=60.0, tau=1.5, gain=0.3, noise=0.0)])
def test_noise_free_frames_match_the_closed_form_ode_solution(system):
    assert (system.tau * system.omega * 2 < 1) == (system.period == 60.0)  # one overdamped, one underdamped case
    steps, u = 40, np.array([0.7, -1.3])
    p0, v0 = np.array([0.2, -0.5]), np.array([0.05, 0.1])
    p, v = simulate(system, np.broadcast_to(u, (1, steps, 2)).copy(), p0[None], v0[None])
    t = np.arange(steps, dtype=np.float64)
    for axis in range(2):
        p_true, v_true = _closed_form(system, u[axis], p0[axis], v0[axis], t)
        np.testing.assert_allclose(p[0, :, axis], p_true, rtol=0, atol=1e-10)
        np.testing.assert_allclose(v[0, :, axis], v_true, rtol=0, atol=1e-10)


def test_piecewise_constant_signal_matches_a_numerical_ode_integration():
    system = DrivenSpring(noise=0.0)
    sig = driving_signal(1, 30, seed=3)
    p, v = simulate(system, sig, np.zeros((1, 2)), np.zeros((1, 2)))
    w2, tau, g = system.omega**2, system.tau, system.gain
    for axis in range(2):
        state = np.zeros(2)
        for t in range(29):  # integrate each frame with the signal held constant, independent of the matrix exponential
            u = sig[0, t, axis]
            sol = solve_ivp(lambda _, s, u=u: [s[1], -w2 * s[0] - s[1] / tau + g * u / tau], (0.0, 1.0), state,
                            rtol=1e-11, atol=1e-12)
            state = sol.y[:, -1]
            np.testing.assert_allclose([p[0, t + 1, axis], v[0, t + 1, axis]], state, atol=1e-8)


def test_signal_has_unit_variance_and_the_double_pole_autocorrelation():
    rho = 0.8
    sig = driving_signal(400, 300, seed=5, rho=rho)[:, 100:]  # past the filters' start-up
    assert abs(sig.var() - 1.0) < 0.05
    lag1 = float((sig[:, 1:] * sig[:, :-1]).mean() / sig.var())
    # AR(2) with a double pole at rho: autocorrelation rho^k (1 + k (1 - rho^2) / (1 + rho^2)).
    assert abs(lag1 - rho * (1 + (1 - rho**2) / (1 + rho**2))) < 0.01


def test_process_noise_enters_the_velocity_once_per_frame():
    system = DrivenSpring()
    batch = driven_batch(3000, 3, seed=2, context=4, system=system)
    dev = (batch.frames - batch.mean).double().numpy()
    assert np.abs(dev[:, :5]).max() < 1e-6  # context, and the first new frame (no noise on p before it) are exact
    alpha = 1.0 / (2.0 * system.tau)
    wd = math.sqrt(system.omega**2 - alpha**2)
    a01 = math.exp(-alpha) * math.sin(wd) / wd  # d p(1) / d v(0) of the homogeneous solution
    assert abs(dev[:, 5].std() / (system.noise * a01) - 1.0) < 0.05


def test_without_noise_the_trajectory_is_its_conditional_mean():
    batch = driven_batch(4, 20, seed=0, context=3, system=DrivenSpring(noise=0.0))
    np.testing.assert_allclose(batch.frames.numpy(), batch.mean.numpy(), atol=1e-5)


def test_samples_do_not_depend_on_batch_or_length():
    long = driven_batch(5, 40, seed=7, context=4)
    short = driven_batch(3, 20, seed=7, start=2, context=4)
    np.testing.assert_array_equal(short.frames.numpy(), long.frames[2:5, :24].numpy())
    np.testing.assert_array_equal(short.signal.numpy(), long.signal[2:5, :24].numpy())
    other = driven_batch(3, 20, seed=8, start=2, context=4)
    assert not np.allclose(other.frames.numpy(), short.frames.numpy())
    assert short.target.shape == (3, 20, 2) and short.past.shape == (3, 4, 2)
    assert short.target_signal.shape == (3, 20, 2)


@pytest.mark.parametrize("kwargs, word", [({"length": 0}, "length"), ({"seed": -1}, "seed"),
                                          ({"context": -2}, "context"), ({"n": 1.5}, "n")])
def test_bad_arguments_are_refused_by_name(kwargs, word):
    args = {"n": 2, "length": 8, **kwargs}
    with pytest.raises(ValueError, match=word):
        driven_batch(**args)


@pytest.mark.parametrize("field, value", [("period", 0.0), ("tau", -1.0), ("noise", -0.1), ("rho", 1.0),
                                          ("gain", float("nan")), ("anchor_std", -0.5),
                                          ("marker_noise", float("inf")), ("noise", "0.1"), ("gain", True)])
def test_bad_system_parameters_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        DrivenSpring(**{field: value})


def test_a_rest_point_shifts_the_positions_and_the_marker_jitters_about_it():
    """The displacement from the rest point is the default system's trajectory (same streams), the conditional mean
    shifts with it, and the marker channels are the rest point plus jitter of the asked std."""
    plain = driven_batch(64, 60, seed=3, context=4)
    system = DrivenSpring(anchor_std=0.7, marker_noise=0.1)
    batch = driven_batch(64, 60, seed=3, context=4, system=system)
    assert system.frame_dim == 4 and batch.frames.shape == (64, 64, 4) and batch.mean.shape == (64, 64, 4)
    anchor = batch.anchor.numpy()[:, None]
    np.testing.assert_allclose(batch.frames[..., :2].numpy() - anchor, plain.frames.numpy(), atol=1e-5)
    np.testing.assert_allclose(batch.mean[..., :2].numpy() - anchor, plain.mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(batch.mean[..., 2:].numpy(), np.broadcast_to(anchor, (64, 64, 2)), atol=1e-6)
    assert abs(batch.anchor.std().item() - 0.7) < 0.1  # 128 draws of N(0, 0.7^2)
    jitter = (batch.frames[..., 2:] - batch.anchor[:, None]).numpy()
    assert abs(jitter.std() - 0.1) < 0.005 and abs(jitter.mean()) < 0.005  # 8192 draws of N(0, 0.1^2)
    # The rest point is drawn once per trajectory: a longer or offset batch keeps it.
    part = driven_batch(3, 20, seed=3, start=5, context=4, system=system)
    np.testing.assert_array_equal(part.anchor.numpy(), batch.anchor[5:8].numpy())
    np.testing.assert_array_equal(part.frames.numpy(), batch.frames[5:8, :24].numpy())


def test_the_default_system_has_no_rest_point_keys_and_position_frames():
    system = DrivenSpring()
    assert "anchor_std" not in system.to_dict() and "marker_noise" not in system.to_dict()
    assert DrivenSpring(anchor_std=0.5).to_dict()["anchor_std"] == 0.5
    batch = driven_batch(2, 8, seed=0)
    assert system.frame_dim == 2 and batch.frames.shape[-1] == 2 and not batch.anchor.any()
