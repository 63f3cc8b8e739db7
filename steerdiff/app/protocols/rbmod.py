"""The RB-Modulation digits protocol: task, methods and measurements (RB-Modulation, Rout et al., ICLR 2025;
docs/methods/rb_modulation.md "The digits protocol"). ``benchmarks/rbmod.py``, the demo section and
the slow tests run it.

Task: 10 classes x ``n_per_class`` samples of the shipped ``digits_styles`` generator (fixed seed), EDM-DDIM
(eta = 0), 20 steps of ``karras(0.002, 40, rho 7)``, no CFG; style reference = the first label-0 digit in sklearn's
order, dilated (``thick``). Methods: plain sampling, RB-Modulation (:class:`~steerdiff.control.RBModulation` as the
sampler's ``x0_corrector``) and plain gradient guidance (:func:`~steerdiff.control.style_guidance`), each with the
primary (thickness) or secondary (CNN) descriptor. Measurements by independent judges (pixel logistic regressions
for class and style), ink = mean((x+1)/2), the CNN style distance to the reference, leakage (share of samples of
classes other than the reference's that are classified as the reference's class), and the number of backward passes
through the denoiser (a backward hook on it).

Subject mode (the content term of docs/methods/rb_modulation.md "The content/subject mode";
``benchmarks/rbmod.py --part content``): :func:`run_content` samples null-class digits with the thick style reference
and a subject image of class k (:func:`subject_image`), the style CNN's content head as the content descriptor;
:func:`evaluate_content` reports the share the independent judge (and the content head itself) calls class k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ...control.descriptors import Evaluators, StyleCNN, ThicknessDescriptor, fit_evaluators
from ...control.rbm import RBModulation, style_guidance
from ...control.styles import reference_image
from ...core import randn, sample
from ...core import sigmas as sigma_schedules

REFERENCE_STYLE, REFERENCE_CLASS = "thick", 0
THICK = 1  # index of "thick" in STYLES
SEED_STRIDE = 100_000  # run seed s draws row i's noise from seed s * SEED_STRIDE + i: disjoint rows
DESCRIPTOR_COSTS = {"thickness": "squared", "cnn": "cosine"}


@dataclass
class DigitsTask:
    """Everything a run of the protocol needs (see the module docstring)."""

    model: nn.Module
    cnn: StyleCNN
    thickness: ThicknessDescriptor
    evaluators: Evaluators
    reference: Tensor
    cond: Tensor
    noise: Tensor
    sigmas: Tensor

    def descriptor(self, name: str) -> nn.Module:
        if name not in DESCRIPTOR_COSTS:
            raise ValueError(f"descriptor must be one of {sorted(DESCRIPTOR_COSTS)}, got {name!r}")
        return self.thickness if name == "thickness" else self.cnn


def load_task(n_per_class: int = 30, seed: int = 0, steps: int = 20) -> DigitsTask:
    """The protocol's task with the shipped models (``digits_styles``, ``digits_styles_cnn``); row ``i`` of run seed
    ``seed`` starts from the noise of seed ``seed * 100000 + i`` (so two run seeds share no row)."""
    from ...models.io import load

    model = load("digits_styles").eval()
    cnn = load("digits_styles_cnn").eval()
    for p in list(model.parameters()) + list(cnn.parameters()):
        p.requires_grad_(False)
    cond = torch.arange(10).repeat_interleave(n_per_class)
    return DigitsTask(model=model, cnn=cnn, thickness=ThicknessDescriptor(), evaluators=fit_evaluators(),
                      reference=reference_image(REFERENCE_STYLE, REFERENCE_CLASS), cond=cond,
                      noise=randn((cond.shape[0], 1, 8, 8), seeds=seed * SEED_STRIDE),
                      sigmas=sigma_schedules.karras(steps, 0.002, 40.0))


class BackwardCounter:
    """Counts backward passes through a module (a full backward hook), for the "zero denoiser backward" check."""

    def __init__(self, module: nn.Module):
        self.count = 0
        self._handle = module.register_full_backward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def run_method(task: DigitsTask, method: str, descriptor: str = "thickness", *, denoiser=None,
               module: nn.Module | None = None, **params) -> tuple[Tensor, dict]:
    """One method on the task: ``"plain"``, ``"rbmod"`` (params of :class:`RBModulation`: ``M``, ``eta``,
    ``lam_style``, ``lam_prox``, ``tau``) or ``"guidance"`` (``w``). Returns the samples and the run's cost
    (wall time, NFE per sample, denoiser backward passes). ``denoiser`` replaces the task's model (then ``module``
    is the network whose backward passes are counted)."""
    psi = task.descriptor(descriptor)
    cost = DESCRIPTOR_COSTS[descriptor]
    kwargs: dict = {}
    if method == "rbmod":
        kwargs["x0_corrector"] = RBModulation(psi, None, reference=task.reference, cost=cost, **params)
    elif method == "guidance":
        kwargs["guidance"] = style_guidance(psi, params.pop("w"), reference=task.reference, cost=cost)
        if params:
            raise ValueError(f"guidance takes w= only, got {sorted(params)}")
    elif method != "plain":
        raise ValueError(f"method must be 'plain', 'rbmod' or 'guidance', got {method!r}")
    counter = BackwardCounter(module if module is not None else task.model)
    start = time.perf_counter()
    try:
        x, stats = sample(task.model if denoiser is None else denoiser, task.noise, task.sigmas, method="ddim",
                          cond=task.cond, return_stats=True, **kwargs)
    finally:
        counter.remove()
    return x.detach(), {"wall_s": time.perf_counter() - start, "nfe": stats.nfe,
                        "denoiser_backward_passes": counter.count}


def evaluate(task: DigitsTask, x: Tensor) -> dict:
    """Class accuracy, thick success, ink, CNN style distance and leakage of samples ``x`` (clamped to [-1, 1])."""
    x = x.clamp(-1, 1)
    cond = task.cond.numpy()
    digit, style = task.evaluators.digit(x), task.evaluators.style(x)
    with torch.no_grad():
        e, ref = task.cnn(x), task.cnn(task.reference)
    other = cond != REFERENCE_CLASS
    return {"class_acc": float(np.mean(digit == cond)), "thick": float(np.mean(style == THICK)),
            "ink": float(((x + 1) / 2).mean()), "cnn_style_dist": float((e - ref).norm(dim=1).mean()),
            "leakage": float(np.mean(digit[other] == REFERENCE_CLASS))}


def per_class(task: DigitsTask, x: Tensor) -> dict:
    """Class accuracy and ink of samples ``x`` (clamped to [-1, 1]) for each digit class: lists of 10."""
    x = x.clamp(-1, 1)
    cond = task.cond.numpy()
    digit = task.evaluators.digit(x)
    ink = ((x + 1) / 2).flatten(1).mean(1).numpy()
    return {"class_acc": [float(np.mean(digit[cond == c] == c)) for c in range(10)],
            "ink": [float(ink[cond == c].mean()) for c in range(10)]}


class CorrectedDenoiser(nn.Module):
    """A diagnostic, *not* the official code's controller: the denoiser followed by the corrector, so that the sampler
    sees ``u`` as its whole prediction and forms ``eps-hat`` from ``u`` too (for DDIM
    ``x' = u + (sigma'/sigma)(x - u)``; the official code keeps ``eps-hat`` of the uncorrected ``D``). The step index is
    looked up from sigma in the run's schedule. Used by ``benchmarks/rbmod.py --part seeds`` to show which re-entry
    reproduces the calibration the protocol's thresholds came from (docs/methods/rb_modulation.md "The class-accuracy
    gap: what was checked")."""

    def __init__(self, model: nn.Module, corrector: RBModulation, sigmas: Tensor):
        super().__init__()
        self.model, self.corrector = model, corrector
        self.schedule = [float(s) for s in sigmas]
        corrector.begin(self.schedule)

    def forward(self, x: Tensor, sigma: Tensor, cond=None) -> Tensor:
        s = float(sigma.reshape(-1)[0])
        i = min(range(len(self.schedule) - 1), key=lambda j: abs(self.schedule[j] - s))
        return self.corrector(self.model(x, sigma, cond), x, s, i)


def run_eps_from_u(task: DigitsTask, **params) -> Tensor:
    """RB-Mod (thickness descriptor, ``params`` of :class:`RBModulation`) with ``eps-hat`` formed from the corrected
    estimate (:class:`CorrectedDenoiser`): the diagnostic re-entry, not the official code's."""
    rbm = RBModulation(task.thickness, None, reference=task.reference, cost=DESCRIPTOR_COSTS["thickness"], **params)
    return run_method(task, "plain", denoiser=CorrectedDenoiser(task.model, rbm, task.sigmas),
                      module=task.model)[0]


def reference_metrics(task: DigitsTask) -> dict:
    """Ink of the reference image (the target of the ink gap)."""
    return {"ink": float(((task.reference + 1) / 2).mean())}


def criteria(plain: dict, rbmod: dict, guidance: dict[float, dict], ref_ink: float) -> dict:
    """The protocol's pass criteria (primary descriptor; docs/methods/rb_modulation.md "The digits protocol"): a dict
    ``name -> {"value", "threshold", "pass"}``."""
    out: dict = {}

    def check(name, value, threshold, ok):
        out[name] = {"value": value, "threshold": threshold, "pass": bool(ok)}

    check("thick_success", rbmod["thick"], ">= 0.85", rbmod["thick"] >= 0.85)
    drop = 1 - rbmod["cnn_style_dist"] / plain["cnn_style_dist"]
    check("cnn_style_dist_drop", drop, ">= 0.60", drop >= 0.60)
    closed = (rbmod["ink"] - plain["ink"]) / (ref_ink - plain["ink"])
    check("ink_gap_closed", closed, ">= 0.60", closed >= 0.60)
    check("class_acc", rbmod["class_acc"], f">= max(0.90, unguided - 0.04 = {plain['class_acc'] - 0.04:.3f})",
          rbmod["class_acc"] >= 0.90 and rbmod["class_acc"] >= plain["class_acc"] - 0.04 - 1e-12)
    check("leakage", rbmod["leakage"], f"<= unguided + 0.03 = {plain['leakage'] + 0.03:.3f}",
          rbmod["leakage"] <= plain["leakage"] + 0.03 + 1e-12)
    check("denoiser_backward_passes", rbmod["denoiser_backward_passes"], "== 0",
          rbmod["denoiser_backward_passes"] == 0)
    eligible = [w for w in sorted(guidance) if guidance[w]["thick"] >= rbmod["thick"] - 0.02 - 1e-12]
    if eligible:
        w_star = eligible[0]
        acc = guidance[w_star]["class_acc"]
        check("vs_guidance", {"w_star": w_star, "acc_w_star": acc, "rbmod_acc": rbmod["class_acc"]},
              "rbmod acc >= acc(w*) - 0.02", rbmod["class_acc"] >= acc - 0.02 - 1e-12)
    else:
        check("vs_guidance", {"w_star": None}, "no w reaches RB-Mod's thick success - 2 points: RB-Mod dominates",
              True)
    return out


def afa_runs(task: DigitsTask, soc: dict | None = None) -> dict[str, tuple[Tensor, dict]]:
    """The functional AFA test (test (d) of docs/methods/rb_modulation.md "Attention feature aggregation") on the
    shipped style-token DiT ``digits_styles_dit``: plain, SOC alone (no style tokens + RB-Mod), AFA alone and AFA + SOC
    (the class token as text ``T``, the default, and as the pooled slot ``P``), and the trained joint-attention tokens
    with and without SOC; the reference's style-CNN embedding feeds the style tokens."""
    from ...models.io import load
    from ...models.style_dit import StyleTokenDenoiser, no_style

    model = load("digits_styles_dit").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        emb = task.cnn(task.reference)
    soc = dict(soc or {"M": 3, "eta": 0.2, "lam_prox": 1.0})
    plain_d, afa_d, joint_d = no_style(model), StyleTokenDenoiser(model, emb, afa=True), \
        StyleTokenDenoiser(model, emb, afa=False)
    afa_p = StyleTokenDenoiser(model, emb, afa=True, pooled_cond=True)
    out = {}
    for name, den, method in [("plain", plain_d, "plain"), ("SOC alone", plain_d, "rbmod"),
                              ("AFA alone", afa_d, "plain"), ("AFA + SOC", afa_d, "rbmod"),
                              ("AFA (class as P) alone", afa_p, "plain"), ("AFA (class as P) + SOC", afa_p, "rbmod"),
                              ("joint tokens alone", joint_d, "plain"), ("joint tokens + SOC", joint_d, "rbmod")]:
        out[name] = run_method(task, method, "thickness", denoiser=den, module=model,
                               **(soc if method == "rbmod" else {}))
    return out


# ------------------------------------------------------------------------------------------ the subject mode
def subject_image(label: int, style: str = "normal") -> Tensor:
    """The subject of class ``label`` for the content mode: the *second* image of that class in sklearn's order (so
    the class-0 subject is not the style reference's own glyph), in ``style``, ``[1, 1, 8, 8]``."""
    from ...control.styles import stylize_images
    from ...data.digits import load_digits

    x, y = load_digits("all")
    idx = int(torch.nonzero(torch.as_tensor(y) == label)[1])
    return stylize_images(torch.as_tensor(x[idx: idx + 1], dtype=torch.float32), style)


def run_content(task: DigitsTask, subject: int, n: int, *, lam_content: float, style: bool = True,
                seed: int = 0, conditional: bool = False, **params) -> tuple[Tensor, dict]:
    """The subject mode on the digits task: ``n`` null-class samples (no class condition) of ``task.model`` with
    RB-Mod (thickness style descriptor towards ``task.reference``, ``params`` of :class:`RBModulation`) plus the
    content term of the style CNN's 10-way content head towards :func:`subject_image` ``(subject)``
    (``lam_content``; 0: the style mode). ``style=False`` runs plain sampling (no corrector); ``conditional=True``
    conditions every sample on class ``subject`` instead (the reference point: the label itself). Noise rows
    ``seed * SEED_STRIDE + subject * n + i``. Returns the samples and the run's cost (wall time, NFE per sample,
    denoiser backward passes)."""
    noise = randn((n, 1, 8, 8), seeds=seed * SEED_STRIDE + subject * n)
    kwargs: dict = {}
    if style:
        kwargs["x0_corrector"] = RBModulation(task.thickness, None, reference=task.reference,
                                              cost=DESCRIPTOR_COSTS["thickness"], lam_content=lam_content,
                                              content_descriptor=task.cnn.content_logits,
                                              content_reference=subject_image(subject), **params)
    counter = BackwardCounter(task.model)
    start = time.perf_counter()
    try:
        cond = torch.full((n,), subject) if conditional else None
        x, stats = sample(task.model, noise, task.sigmas, method="ddim", cond=cond, return_stats=True, **kwargs)
    finally:
        counter.remove()
    return x.detach(), {"wall_s": time.perf_counter() - start, "nfe": stats.nfe,
                        "denoiser_backward_passes": counter.count}


def evaluate_content(task: DigitsTask, x: Tensor, subject: int) -> dict:
    """Subject-mode measurements of samples ``x`` (clamped): the share the independent pixel judge calls the
    subject's class, the share the style CNN's content head (the optimised descriptor) calls it, thick success, ink
    and the share judged the style reference's class (class 0; None for subject 0)."""
    x = x.clamp(-1, 1)
    digit, style = task.evaluators.digit(x), task.evaluators.style(x)
    with torch.no_grad():
        head = task.cnn.content_logits(x).argmax(1).numpy()
    return {"subject_share": float(np.mean(digit == subject)), "head_share": float(np.mean(head == subject)),
            "thick": float(np.mean(style == THICK)), "ink": float(((x + 1) / 2).mean()),
            "ref_class_share": None if subject == REFERENCE_CLASS else float(np.mean(digit == REFERENCE_CLASS))}
