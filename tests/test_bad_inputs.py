"""Bad input to the public API ends in a clear error naming the argument, never a raw traceback.

Each row is an input a user could plausibly pass: the call must raise the given exception type with a message that
names the argument (a ``ValueError`` / ``TypeError`` subclass, ``CheckpointError`` included, or
``FloatingPointError`` for a model that returns NaN). The CLI's sweep is in ``tests/test_cli*.py``.
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import NFECounter, VPDenoiser
from steerdiff.io import CheckpointError
from steerdiff.train import TrainConfig

G = sd.models.builtin_mixture("gmm2d")
N2 = torch.zeros(4, 2, dtype=torch.float64)
K = sd.sigmas.karras(5)
ABAR = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)


def _two_arg(x, sigma):
    return x


CASES = [
    ("karras steps 0", lambda: sd.sigmas.karras(0), ValueError, "steps must be an integer"),
    ("karras sigma_min < 0", lambda: sd.sigmas.karras(3, -1.0, 80.0), ValueError, "sigma_min"),
    ("karras min > max", lambda: sd.sigmas.karras(3, 100.0, 1.0), ValueError, "sigma_min < sigma_max"),
    ("karras NaN", lambda: sd.sigmas.karras(3, math.nan, 80.0), ValueError, "sigma_min"),
    ("vp_linear 0 steps", lambda: sd.sigmas.vp_linear(0), ValueError, "steps must be an integer"),
    ("check_sigmas final", lambda: sd.sigmas.check_sigmas(K, final="x"), ValueError, "final must be one of"),
    ("sigmas increasing", lambda: sd.sample(G, N2, torch.tensor([0.0, 1.0, 2.0])), ValueError, "sigmas must end at 0"),
    ("sigmas 2-D", lambda: sd.sample(G, N2, K[None]), ValueError, "1-D"),
    ("sigmas None", lambda: sd.sample(G, N2, None), TypeError, "sigmas must be a 1-D tensor or a sequence"),
    ("sigmas a string", lambda: sd.sample(G, N2, "karras"), TypeError, "sigmas must be a 1-D tensor or a sequence"),
    ("noise integer", lambda: sd.sample(G, torch.zeros(4, 2, dtype=torch.long), K), ValueError, "floating-point"),
    ("noise 1-D", lambda: sd.sample(G, torch.zeros(4), K), ValueError, "noise must be a tensor"),
    ("noise numpy", lambda: sd.sample(G, N2.numpy(), K), ValueError, "noise must be a tensor"),
    ("noise wrong sample shape", lambda: sd.sample(G, torch.zeros(4, 3), K), ValueError, "noise has sample shape"),
    ("method unknown", lambda: sd.sample(G, N2, K, method="dpm"), ValueError, "method must be one of"),
    ("cond float", lambda: sd.sample(G, N2, K, cond=torch.zeros(4)), ValueError, "cond must be an integer tensor"),
    ("cond rows", lambda: sd.sample(G, N2, K, cond=torch.zeros(3, dtype=torch.long)), ValueError, "cond must have"),
    ("cond a list", lambda: sd.sample(G, N2, K, cond=[0, 1, 2, 3]), ValueError, "cond must be an integer tensor"),
    ("guidance without cond", lambda: sd.sample(G, N2, K, guidance=sd.guidance.CFG(2.0)), ValueError, "pass cond="),
    ("guidance an int", lambda: sd.sample(G, N2, K, cond=torch.zeros(4, dtype=torch.long), guidance=3), TypeError,
     "guidance must be"),
    ("eta out of range", lambda: sd.sample(G, N2, K, method="ddim", eta=2.0), ValueError, r"eta must lie in \[0, 1\]"),
    ("eta with heun", lambda: sd.sample(G, N2, K, method="heun", eta=0.5), ValueError, "eta applies to methods"),
    ("generator a string", lambda: sd.sample(G, N2, K, method="ddpm", generator="x"), TypeError, "generator must be"),
    ("generator count", lambda: sd.sample(G, N2, K, method="ddpm", generator=[1, 2]), ValueError, "2 seeds for 4"),
    ("denoiser not callable", lambda: sd.sample(3, N2, K), TypeError, "denoiser must be callable"),
    ("denoiser of two arguments", lambda: sd.sample(_two_arg, N2, K), TypeError, r"denoiser must accept \(x, sigma"),
    ("denoiser wrong output", lambda: sd.sample(lambda x, s, c=None: x[:, :1], N2, K), ValueError,
     "denoiser returned shape"),
    ("denoiser NaN", lambda: sd.sample(lambda x, s, c=None: x * math.nan, N2, K), FloatingPointError, "step 0"),
    ("x_start shape", lambda: sd.sample(G, N2, K, x_start=torch.zeros(2, 2)), ValueError, "x_start must be a tensor"),
    ("strength without x_start", lambda: sd.sample(G, N2, K, strength=0.5), ValueError, "strength applies with"),
    ("strength > 1", lambda: sd.sample(G, N2, K, x_start=N2, strength=2.0), ValueError, "strength must be"),
    ("schedule above a VP model's range", lambda: sd.sample(VPDenoiser(lambda x, t, c: x, ABAR), N2,
     sd.sigmas.karras(3, 0.02, 500.0)), ValueError, "above the denoiser's sigma_max"),
    ("randn shape a string", lambda: sd.randn("4,2", seeds=0), TypeError, "shape must be a sequence of ints"),
    ("randn integer dtype", lambda: sd.randn((4, 2), seeds=0, dtype=torch.long), TypeError, "floating-point"),
    ("randn empty dimension", lambda: sd.randn((4, 0), seeds=0), ValueError, "positive sizes"),
    ("randn no seeds", lambda: sd.randn((4, 2), seeds=None), ValueError, "seeds must be given"),
    ("NFECounter of a non-callable", lambda: NFECounter(3), TypeError, "denoiser must be callable"),
    ("mixture negative weights", lambda: sd.models.GaussianMixture([-1, 2], [[0, 0], [1, 1]], 0.1), ValueError,
     "weights"),
    ("mixture call wrong dim", lambda: G(torch.zeros(2, 3), torch.ones(2)), ValueError, r"x must be \[B, 2\]"),
    ("mixture sample 0", lambda: G.sample(0), ValueError, "n must be a positive integer"),
    ("unknown built-in mixture", lambda: sd.models.builtin_mixture("gmm9d"), ValueError, "built-in mixtures"),
    ("load an unknown model", lambda: sd.models.load("nope"), CheckpointError, "shipped models"),
    ("load None", lambda: sd.models.load(None), TypeError, "name_or_dir must be a shipped model's name"),
    ("load an int", lambda: sd.models.load(3), TypeError, "name_or_dir must be .* got int"),
    ("randn seed 2**64", lambda: sd.randn((4, 2), seeds=2**64), ValueError, r"seeds must lie in \[-2\*\*63"),
    ("randn seed past 2**64 - 1 on a later row", lambda: sd.randn((4, 2), seeds=2**64 - 2), ValueError,
     r"seed 18446744073709551614 \+ row 2"),
    ("randn seed list 2**64", lambda: sd.randn((2, 2), seeds=[0, 2**64]), ValueError, r"\(row 1\)"),
    ("randn seed below -2**63", lambda: sd.randn((2, 2), seeds=[0, -(2**63) - 1]), ValueError, "seeds must lie"),
    ("sample generator seed 2**64", lambda: sd.sample(G, N2, K, method="ddpm", generator=2**64), ValueError,
     "seeds must lie"),
    ("load an empty name", lambda: sd.models.load(""), CheckpointError, "name_or_dir is empty"),
    ("load a list", lambda: sd.models.load(["digits"]), TypeError, "name_or_dir must be .* got list"),
    ("randn seed a bool", lambda: sd.randn((2, 2), seeds=True), TypeError, "a seed must be an int, not a bool"),
    ("randn seeds with a bool", lambda: sd.randn((2, 2), seeds=[0, False]), TypeError, "not a bool"),
    ("randn empty seed list", lambda: sd.randn((2, 2), seeds=[]), ValueError, "got 0 generators for 2 samples"),
    ("randn seed a float", lambda: sd.randn((2, 2), seeds=1.5), TypeError, "generator must be"),
    ("randn device bogus", lambda: sd.randn((2, 2), seeds=0, device="bogus"), ValueError,
     "device must be a device such as"),
    ("sample allow_out_of_range a string", lambda: sd.sample(G, N2, K, allow_out_of_range="no"), TypeError,
     "allow_out_of_range must be True or False"),
    ("EDMPrecond sigma_data inf", lambda: sd.models.EDMPrecond(sd.models.MLP(dim=2, hidden=[4]), sigma_data=math.inf),
     ValueError, "sigma_data must be a positive finite number"),
    ("EDMPrecond sigma_data a string", lambda: sd.models.EDMPrecond(sd.models.MLP(dim=2, hidden=[4]),
     sigma_data="0.5"), TypeError, "sigma_data must be a positive finite number, got str"),
    ("EDMPrecond sigma_max negative", lambda: sd.models.EDMPrecond(sd.models.MLP(dim=2, hidden=[4]), sigma_max=-1),
     ValueError, "sigma_max must be a positive finite number"),
    ("EDMPrecond sigma_max a string", lambda: sd.models.EDMPrecond(sd.models.MLP(dim=2, hidden=[4]),
     sigma_max="80"), TypeError, "sigma_max must be a positive finite number, got str"),
    ("load a pickle", lambda: sd.models.load("x.pt"), CheckpointError, "only safetensors"),
    ("VP prediction type", lambda: VPDenoiser(lambda x, t, c: x, ABAR, "noise"), ValueError, "prediction_type"),
    ("VP alphas increasing", lambda: VPDenoiser(lambda x, t, c: x, ABAR.flip(0)), ValueError, "non-increasing"),
    ("sliced W dims", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 3)), ValueError,
     "same dimension"),
    ("sliced W NaN", lambda: sd.metrics.sliced_wasserstein(torch.full((3, 2), math.nan), torch.zeros(3, 2)),
     ValueError, "non-finite"),
    ("sliced W p", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 2), p=3), ValueError,
     "p must be 1 or 2"),
    ("sliced W empty x", lambda: sd.metrics.sliced_wasserstein(torch.zeros(0, 2), torch.zeros(3, 2)), ValueError,
     r"x is empty \(shape \(0, 2\)\)"),
    ("sliced W empty y", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(0, 2)), ValueError,
     "y is empty"),
    ("sliced W zero-dimensional samples", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 0), torch.zeros(3, 0)),
     ValueError, "x is empty"),
    ("mmd empty", lambda: sd.metrics.mmd_rbf(torch.zeros(0, 2), torch.zeros(5, 2)), ValueError, "x is empty"),
    ("sliced W 0 projections", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 2),
     n_projections=0), ValueError, "n_projections must be a positive integer"),
    ("sliced W 1.5 projections", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 2),
     n_projections=1.5), ValueError, "n_projections must be a positive integer"),
    ("sliced W negative seed", lambda: sd.metrics.sliced_wasserstein(torch.zeros(3, 2), torch.zeros(3, 2), seed=-1),
     ValueError, "seed must be a non-negative integer"),
    ("mmd bandwidth inf", lambda: sd.metrics.mmd_rbf(torch.randn(3, 2), torch.randn(3, 2), bandwidth=math.inf),
     ValueError, "bandwidth must be a positive finite number"),
    ("mmd bandwidth a string", lambda: sd.metrics.mmd_rbf(torch.randn(3, 2), torch.randn(3, 2), bandwidth="1"),
     ValueError, "bandwidth must be a positive finite number"),
    ("mode weight error without a mixture", lambda: sd.metrics.mode_weight_error(torch.zeros(4, 2), None), TypeError,
     "mixture must be a GaussianMixture"),
    ("mode weight error empty", lambda: sd.metrics.mode_weight_error(torch.zeros(0, 2), G), ValueError,
     "samples is empty"),
    ("mmd one sample", lambda: sd.metrics.mmd_rbf(torch.zeros(1, 2), torch.zeros(5, 2)), ValueError, "at least 2"),
    ("digits split", lambda: sd.data.digits.load_digits("val"), ValueError, "split must be one of"),
    ("shapes split", lambda: sd.data.shapes.generate(4, "nope", "train"), ValueError, "split must be one of"),
    ("train lr 0", lambda: TrainConfig(lr=0.0), ValueError, "lr must be a positive finite number"),
    ("train lr NaN", lambda: TrainConfig(lr=math.nan), ValueError, "lr must be a positive finite number"),
    ("train ema decay 2", lambda: TrainConfig(ema_decay=2.0), ValueError, r"ema_decay must be in \[0, 1\)"),
    ("train negative warm-up", lambda: TrainConfig(warmup_steps=-1), ValueError, "warmup_steps"),
    ("train betas", lambda: TrainConfig(betas=(0.9, 1.5)), ValueError, "betas must be two numbers"),
    ("train p_std 0", lambda: TrainConfig(p_std=0.0), ValueError, "p_std positive"),
    ("train unknown key", lambda: TrainConfig.from_dict({"stepz": 3}), ValueError, "unknown training config keys"),
    ("das alpha 0", lambda: sd.align.das(G, lambda x: x.sum(1), torch.zeros(8, 2), K, alpha=0.0, particles=4),
     ValueError, "alpha must be a positive"),
    ("das rows not a multiple", lambda: sd.align.das(G, lambda x: x.sum(1), torch.zeros(8, 2), K, alpha=1.0,
     particles=3), ValueError, "multiple of particles=3"),
    ("das reward shape", lambda: sd.align.das(G, lambda x: x, torch.zeros(8, 2, dtype=torch.float64), K, alpha=1.0,
     particles=4), ValueError, r"reward must return shape \[B\]"),
    ("covariance an int", lambda: sd.covariance.as_covariance(3), TypeError, "covariance must be"),
]


def test_numpy_integer_seeds_are_seeds():
    """A numpy integer seed (a row of np.arange) is the same seed as the Python int: same noise."""
    import numpy as np

    assert torch.equal(sd.randn((3, 2), seeds=np.int64(5)), sd.randn((3, 2), seeds=5))
    assert torch.equal(sd.randn((2, 2), seeds=list(np.arange(2))), sd.randn((2, 2), seeds=[0, 1]))


@pytest.mark.parametrize("name, call, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_edm_model_refuses_a_schedule_above_its_training_range(tmp_path):
    """A trained EDM model declares the top of its noise range (160 unless its config says otherwise); a schedule
    above it is refused naming sigma_max, and the shipped models' default schedules (Karras to 80, vp_linear to
    157.4) still run."""
    from steerdiff.models import MLP, EDMPrecond

    model = sd.models.load("digits_mlp")
    assert model.sigma_range == (0.0, 160.0)
    noise = sd.randn((2, *model.sample_shape), seeds=0)
    with torch.no_grad():
        with pytest.raises(ValueError, match="above the denoiser's sigma_max 160"):
            sd.sample(model, noise, sd.sigmas.karras(3, 0.002, 1e6))
        with pytest.warns(RuntimeWarning, match="sigma_max 160"):
            sd.sample(model, noise, sd.sigmas.karras(2, 0.002, 1e6), allow_out_of_range=True)
        x = sd.sample(model, noise, sd.sigmas.karras(2, 0.002, 80.0))
        y = sd.sample(model, noise, sd.sigmas.vp_linear(2), method="ddim")
    assert torch.isfinite(x).all() and torch.isfinite(y).all()
    small = EDMPrecond(MLP(dim=2, hidden=[8]), sigma_max=10.0)
    sd.models.save(small, tmp_path / "m")
    assert sd.models.load(tmp_path / "m").sigma_range == (0.0, 10.0)
    with pytest.raises(ValueError, match="sigma_max must be a positive finite number"):
        EDMPrecond(MLP(dim=2, hidden=[8]), sigma_max=math.inf)


def test_guidance_far_past_where_it_steers_warns():
    """CFG(1e9) on digits gives samples of about 1e6 for data in [-1, 1]: a RuntimeWarning naming the guidance and
    its scale; a usual scale gives none, and the samples are the same with or without the check."""
    import warnings

    model = sd.models.load("digits")
    noise, cond = sd.randn((4, 1, 8, 8), seeds=0), torch.arange(4)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match=r"guided samples reach .* \(CFG, scale 1e\+09\)"):
            x = sd.sample(model, noise, sd.sigmas.karras(4), cond=cond, guidance=sd.guidance.CFG(1e9))
        assert x.abs().max() > 5e3  # what the warning is about: far outside [-1, 1]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = sd.sample(model, noise, sd.sigmas.karras(12), cond=cond, guidance=sd.guidance.CFG(3.0))
    assert y.abs().max() < 2
