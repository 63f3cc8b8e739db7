"""The result every alignment sampler returns: samples, log-weights, ESS per step, NFE (docs/methods/das.md,
"Cost in NFE").

Costs are counted per *group*: one SMC population (DAS, TDS), one best-of-N / SIR pool, or one chain (reward
guidance, whose groups have one member). ``nfe`` counts denoiser forward rows and ``nfe_grad`` counts backward
passes through the denoiser and the reward (one vector-Jacobian product each), so a comparison "at equal NFE" can
weigh a VJP by its measured cost ``c_b`` (``docs/methods/das.md``, "Cost in NFE"): ``cost(c_b) = nfe + c_b *
nfe_grad``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def particles_at_cost(gradient_particles: int, *, gradient: bool, c_b: float = 2.0) -> int:
    """Particles (or chains) per output that cost what ``gradient_particles`` reward-gradient particles cost.

    A gradient particle costs one denoiser call plus one VJP (``1 + c_b`` forward-pass units) per step, a
    gradient-free particle or a best-of-N chain one unit: equal cost is ``round(gradient_particles * (1 + c_b))``
    particles without gradients, ``gradient_particles`` with them.
    """
    if gradient_particles < 1:
        raise ValueError(f"gradient_particles must be >= 1, got {gradient_particles}")
    return int(gradient_particles) if gradient else int(round(gradient_particles * (1 + c_b)))


@dataclass
class AlignResult:
    """Samples and diagnostics of one alignment run.

    Attributes:
        samples: the output (its layout depends on the method and ``output``; see the sampler's docstring).
        rewards: final reward of each returned sample, float64 (NaN where the reward was not finite).
        method: ``"das"``, ``"tds"``, ``"best_of_n"``, ``"sir"`` or ``"reward_guidance"``.
        groups, particles: number of groups and members per group.
        nfe: denoiser forward evaluations per group.
        nfe_grad: reward-gradient evaluations (VJPs through the denoiser) per group.
        reward_evals: reward forward evaluations per group.
        log_weights: final normalised log-weights ``[G, P]`` (SMC methods), ``-inf`` for killed particles.
        particles_final: all final particles ``[G * P, *shape]`` (SMC methods).
        ess: effective sample size (in particles, ``1 / sum W^2``) ``[steps + 1, G]`` after each weight update and
            before resampling; row ``steps`` is the final weight. NaN where no weighting happened.
        lambdas: tempering level ``[steps + 1, G]`` used by the twist at each step (``lambdas[steps] = 1``).
        resampled: ``[steps, G]`` bool, whether the group was resampled at step ``i``.
        log_evidence: ``[G]`` estimate of ``log E_p[exp(r(x_N) / alpha)]`` under the model chain.
        nonfinite: ``[steps + 1, G]`` number of particles killed (non-finite state, denoised value, reward or
            weight) at each step; they get log-weight ``-inf`` and are replaced at the next resampling.
        nonfinite_reward: ``[steps + 1, G]`` how many particles had a reward of NaN or +-inf at each step (SMC
            methods); they are among those counted in ``nonfinite``, and the sampler warns when any was dropped.
        wall_time: seconds for the whole run; model_time: seconds inside the denoiser, reward and their VJPs;
            smc_time: seconds of SMC bookkeeping (weights, ESS, tempering, resampling and reindexing);
            verifier_time: seconds inside the reward's (verifier's) forward calls, a part of ``model_time`` (a
            backward pass through the reward is part of its VJP, counted in ``model_time`` only). Times are this
            process's host clock: on an accelerator they hold what the host waited for (a verifier built with
            ``synchronize=True``, :class:`steerdiff.align.verifiers.Verifier`, waits for its device).
        extras: method-specific traces (e.g. mean reward per step).
    """

    samples: Tensor
    rewards: Tensor
    method: str
    groups: int
    particles: int
    nfe: float
    nfe_grad: float
    reward_evals: float
    log_weights: Tensor | None = None
    particles_final: Tensor | None = None
    ess: Tensor | None = None
    lambdas: Tensor | None = None
    resampled: Tensor | None = None
    log_evidence: Tensor | None = None
    nonfinite: Tensor | None = None
    nonfinite_reward: Tensor | None = None
    wall_time: float = 0.0
    model_time: float = 0.0
    smc_time: float = 0.0
    verifier_time: float = 0.0
    extras: dict = field(default_factory=dict)

    def cost(self, c_b: float = 2.0) -> float:
        """Cost per group in forward-pass units: ``nfe + c_b * nfe_grad`` (c_b = 2 for networks, 1 for the GMM)."""
        return self.nfe + c_b * self.nfe_grad

    @property
    def denoiser_time(self) -> float:
        """Seconds in the denoiser and the VJPs: ``model_time - verifier_time``."""
        return self.model_time - self.verifier_time

    def cost_axes(self, c_b: float = 2.0) -> dict:
        """The three cost axes of a search comparison (``docs/methods/search.md``, "Cost"), per group: ``nfe``
        (denoiser rows), ``nfe_vjp`` (:meth:`cost`: ``nfe + c_b * nfe_grad``) and ``wall_time`` (seconds of the
        whole run, the verifier's included), with ``verifier_time`` and ``reward_evals`` beside them."""
        return {"nfe": self.nfe, "nfe_vjp": self.cost(c_b), "wall_time": self.wall_time,
                "verifier_time": self.verifier_time, "reward_evals": self.reward_evals}

    @property
    def overhead(self) -> float:
        """Share of the wall time spent outside the denoiser, reward and VJP calls (sampler math + bookkeeping)."""
        return 1.0 - self.model_time / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def smc_overhead(self) -> float:
        """Share of the wall time spent in SMC bookkeeping (weights, ESS, tempering, resampling)."""
        return self.smc_time / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def resample_steps(self) -> list[list[int]]:
        """For each group, the steps at which it was resampled."""
        if self.resampled is None:
            return [[] for _ in range(self.groups)]
        return [torch.nonzero(self.resampled[:, g]).flatten().tolist() for g in range(self.groups)]

    @property
    def n_nonfinite(self) -> int:
        """Total number of particles killed for non-finite values."""
        return 0 if self.nonfinite is None else int(self.nonfinite.sum())

    @property
    def n_nonfinite_reward(self) -> int:
        """Total number of particles whose reward was NaN or +-inf (all of them killed, counted in ``n_nonfinite``)."""
        return 0 if self.nonfinite_reward is None else int(self.nonfinite_reward.sum())

    def summary(self) -> dict:
        """JSON-ready scalars: costs, reward statistics, ESS and resampling counts."""
        r = self.rewards[torch.isfinite(self.rewards)]
        out = {
            "method": self.method, "groups": self.groups, "particles": self.particles, "nfe": self.nfe,
            "nfe_grad": self.nfe_grad, "reward_evals": self.reward_evals,
            "reward_mean": float(r.mean()) if r.numel() else float("nan"),
            "reward_std": float(r.std()) if r.numel() > 1 else float("nan"),
            "n_nonfinite": self.n_nonfinite, "n_nonfinite_reward": self.n_nonfinite_reward,
            "wall_time_s": self.wall_time, "model_time_s": self.model_time,
            "smc_time_s": self.smc_time, "verifier_time_s": self.verifier_time,
        }
        if self.ess is not None:
            ess = self.ess[torch.isfinite(self.ess)]
            out["ess_mean_frac"] = float(ess.mean() / self.particles) if ess.numel() else float("nan")
            out["ess_min_frac"] = float(ess.min() / self.particles) if ess.numel() else float("nan")
        if self.resampled is not None:
            out["resamples_per_group"] = float(self.resampled.double().sum(0).mean())
        return out
