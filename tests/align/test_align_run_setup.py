"""steerdiff.align.run_setup (the shared setup of an alignment run, formerly steerdiff.align.sampler) on core's model
call, and the deprecation shim of the old path."""

import importlib
import subprocess
import sys
import warnings

import pytest
import torch

import steerdiff as sd
from steerdiff.align import run_setup as run
from steerdiff.align.rewards import Linear
from steerdiff.core.calls import ModelCall
from steerdiff.models import GaussianMixture

GMM = GaussianMixture([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.5]], 0.3)


def _forget_old_module():
    sys.modules.pop("steerdiff.align.sampler", None)
    sd.align.__dict__.pop("sampler", None)  # an import sets the package attribute too


def test_the_old_path_warns_and_gives_the_same_objects():
    _forget_old_module()
    with pytest.warns(DeprecationWarning, match=r"steerdiff\.align\.run"):
        old = importlib.import_module("steerdiff.align.sampler")
    for name in ("prepare", "AlignRun", "step_info", "CALLBACK_KEYS", "check_common", "expand_cond", "RewardCalls"):
        assert getattr(old, name) is getattr(run, name)
    assert old.ModelCalls is run.RewardCalls
    _forget_old_module()
    with pytest.warns(DeprecationWarning):
        assert sd.align.sampler.prepare is run.prepare  # the package attribute imports it on first use


def test_importing_the_package_does_not_warn():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning); import steerdiff, steerdiff.align; "
            "import steerdiff.align.run_setup")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reward_calls_are_core_model_calls():
    calls = run.RewardCalls(GMM, Linear([1.0, 0.0]), batch_size=3)
    assert isinstance(calls, ModelCall) and calls.finite is False  # SMC kills non-finite particles itself
    x = sd.randn((7, 2), seeds=0, dtype=torch.float64)
    d = calls.denoise(x, 0.5, None, 2)
    assert torch.equal(d, GMM(x, torch.full((7,), 0.5, dtype=torch.float64), None))
    assert calls.denoiser.calls == 3 and calls.denoiser.rows == 7
    d2, rho, g = calls.twist(x, 0.5, None, True, 2)
    assert torch.equal(d2, d) and torch.equal(rho, d[:, 0]) and g.shape == x.shape
    assert calls.grad_rows == 7 and calls.reward_rows == 7
    # A denoiser of the wrong shape is named with the step (core's check).
    bad = run.RewardCalls(lambda z, s, c: z[:, :1], Linear([1.0, 0.0]), batch_size=None)
    with pytest.raises(ValueError, match="expected the input's shape .* at step 4"):
        bad.denoise(x, 0.5, None, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nan = run.RewardCalls(lambda z, s, c: z * float("nan"), Linear([1.0, 0.0]), batch_size=None)
        assert nan.denoise(x, 0.5, None, 0).isnan().all()
