"""benchmarks/frontier.py's bookkeeping: honest NFE (independent truth: the registry's NFE of each sampler, e.g. Heun
with N steps evaluates 2N - 1 times) and valid schedules for every schedule name on the EDM range and the flow time."""

import math

import pytest
import torch
from script_modules import load_script

import steerdiff as sd


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/frontier.py")


def test_steps_spend_at_most_the_target_nfe_and_no_fewer_than_needed(bench):
    for name in sd.core.SAMPLERS:
        for target in bench.NFES:
            steps = bench.steps_for(name, target)
            assert sd.core.nfe_of(name, steps) <= target or steps == 1
            assert sd.core.nfe_of(name, steps + 1) > target
    assert bench.steps_for("heun", 10) == 5  # 2 * 5 - 1 = 9 <= 10 < 11
    assert bench.steps_for("dpmpp_2m", 10) == 10


@pytest.mark.parametrize("flow_model", [False, True])
def test_every_schedule_is_a_valid_sampler_schedule(bench, flow_model):
    for name in bench.SCHEDULE_NAMES:
        for steps in (2, 3, 5, 10, 20):
            sig = sd.sigmas.check_sigmas(bench.schedule(name, steps, flow_model))
            assert 2 <= sig.numel() <= steps + 1, (name, steps)
            if flow_model and name != "ddim_uniform":  # ComfyUI's ddim_uniform starts below the top
                assert math.isinf(sig[0]), name  # t = 1: pure noise
            elif not flow_model and name in ("karras", "exponential", "kl_optimal"):
                assert torch.isclose(sig[0], torch.tensor(80.0, dtype=torch.float64)) and sig[-2] == pytest.approx(
                    0.002)
