"""Saving and loading OCM (Ou et al., ICLR 2025) covariance heads with the fingerprint of the denoiser they belong to: a
head is the Jacobian diagonal of exactly one network, so using it with another must be an error, not silently wrong
covariances (docs/methods/ocm.md, "Where steerdiff differs"; docs/methods/conventions.md, "Errors").

A head directory holds ``config.json`` (``{"class", "config"}`` of the head, plus ``"denoiser"``: the name it was
trained for, ``"denoiser_fingerprint"``, and optionally ``"sampling": {"last_step_var_max": v}``, the head's default
last-step variance bound for images, "Clamps and clips" in docs/methods/ocm.md) and ``model.safetensors``. The
fingerprint is a SHA-256 over the denoiser's config (``{"class", "config"}``) *and* its weights, so a retrained denoiser
with the same config is also told apart. :func:`load_head` refuses a head whose stored fingerprint differs from the
given denoiser's.

Because a head means nothing without its denoiser, :func:`steerdiff.models.save` and :func:`steerdiff.models.load`
refuse heads (the checkpoint format ``ocm_head`` registered here), pointing to :func:`save_head` / :func:`load_head`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn

from ..io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    __version__,
    atomic_dir,
    check_save_target,
    load_state_strict,
    load_tensors,
    read_json,
    register_format,
    save_tensors,
    write_json,
)
from ..models.gmm import GaussianMixture
from ..models.io import ASSETS_DIR, build_model, load, model_spec
from ..models.ocm_heads import OCMHead

HEAD_SUFFIX = "_ocm"


def denoiser_fingerprint(denoiser) -> str:
    """SHA-256 hex digest of a denoiser's config and weights.

    Supported: registered models (``EDMPrecond`` ...; config + state dict) and :class:`GaussianMixture` (weights,
    means, covariances, labels). Other callables have no stable identity: pass ``fingerprint=`` yourself.
    """
    h = hashlib.sha256()
    if isinstance(denoiser, GaussianMixture):
        h.update(b"GaussianMixture")
        parts = [denoiser.weights, denoiser.means, denoiser.covs]
        if denoiser.labels is not None:
            parts.append(denoiser.labels)
        for t in parts:
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()
    if isinstance(denoiser, nn.Module):
        try:
            spec = model_spec(denoiser)
        except TypeError as e:
            raise TypeError(f"denoiser: cannot fingerprint an unregistered module ({e}); pass fingerprint=") from e
        h.update(json.dumps(spec, sort_keys=True).encode())
        for name, t in sorted(denoiser.state_dict().items()):
            h.update(name.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().cpu().contiguous().to(torch.float32).numpy().tobytes())
        return h.hexdigest()
    raise TypeError(
        f"denoiser: cannot fingerprint a {type(denoiser).__name__} (only registered models and GaussianMixture); "
        "pass fingerprint= explicitly"
    )


def save_head(head: OCMHead, directory: str | os.PathLike, denoiser=None, fingerprint: str | None = None,
              denoiser_name: str | None = None) -> Path:
    """Save ``head`` with the fingerprint of ``denoiser`` (or an explicit ``fingerprint``), atomically."""
    if not isinstance(head, OCMHead):
        raise TypeError(f"head must be an OCMHead, got {type(head).__name__}")
    if fingerprint is None:
        if denoiser is None:
            raise ValueError("save_head needs the denoiser the head belongs to (or fingerprint=)")
        fingerprint = denoiser_fingerprint(denoiser)
    spec = model_spec(head)
    spec.update({"denoiser": denoiser_name, "denoiser_fingerprint": fingerprint, "steerdiff_version": __version__})
    if getattr(head, "last_step_var_max", None) is not None:
        spec["sampling"] = {"last_step_var_max": float(head.last_step_var_max)}
    check_save_target(directory)  # an existing file or a folder of other things is never replaced
    with atomic_dir(directory) as tmp:
        write_json(tmp / CONFIG_NAME, spec)
        save_tensors(head.state_dict(), tmp / WEIGHTS_NAME)
    return Path(directory)


def load_head(directory: str | os.PathLike, denoiser=None, fingerprint: str | None = None,
              check: bool = True) -> OCMHead:
    """Load a head saved by :func:`save_head`; with ``check`` (default) verify it belongs to ``denoiser``.

    Raises:
        CheckpointError: unreadable files, not a head, or (``check``) a fingerprint that does not match: the head
            was trained for a different denoiser and its covariances would be wrong.
        ValueError: ``check`` without a denoiser or fingerprint to check against.
    """
    path = Path(directory)
    if path.is_file():
        path = path.parent
    spec = read_json(path / CONFIG_NAME)
    stored = spec.get("denoiser_fingerprint")
    if not isinstance(stored, str):
        raise CheckpointError(f"{path}: not a covariance head (config.json has no denoiser_fingerprint)")
    head = build_model({"class": spec.get("class"), "config": spec.get("config", {})})
    if not isinstance(head, OCMHead):
        raise CheckpointError(f"{path}: class {spec.get('class')!r} is not a covariance head")
    if check:
        if fingerprint is None:
            if denoiser is None:
                raise ValueError("load_head: pass the denoiser the head will be used with (or check=False)")
            fingerprint = denoiser_fingerprint(denoiser)
        if fingerprint != stored:
            raise CheckpointError(
                f"{path}: this covariance head was trained for a different denoiser "
                f"({spec.get('denoiser') or 'unnamed'}, fingerprint {stored[:12]}...; the given denoiser has "
                f"{fingerprint[:12]}...). A head is the Jacobian diagonal of one network: retrain it with "
                "steerdiff.covariance.train_ocm for this denoiser"
            )
    load_state_strict(head, load_tensors(path / WEIGHTS_NAME), str(path / WEIGHTS_NAME))
    head.denoiser_fingerprint = stored
    sampling = spec.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise CheckpointError(f"{path}: 'sampling' in config.json must be a JSON object")
    bound = sampling.get("last_step_var_max")
    if bound is not None and not (isinstance(bound, int | float) and bound > 0):
        raise CheckpointError(f"{path}: sampling.last_step_var_max must be a positive number, got {bound!r}")
    head.last_step_var_max = None if bound is None else float(bound)
    return head.eval()


def load_head_for(model_name: str, denoiser=None) -> OCMHead:
    """The shipped head of a shipped model: ``steerdiff/assets/<model_name>_ocm`` (for ``--covariance ocm``).

    Args:
        model_name: a shipped model name (``digits``) or a model directory; its head is ``<name>_ocm`` beside it.
        denoiser: the loaded denoiser to check the head against (loaded from ``model_name`` if None).

    Raises:
        CheckpointError: no head ships for this model, or the head belongs to a different denoiser.
    """
    base = Path(model_name)
    if base.exists():
        head_dir = base.parent / f"{base.name.rstrip('/')}{HEAD_SUFFIX}"
    else:
        head_dir = ASSETS_DIR / f"{model_name}{HEAD_SUFFIX}"
    if not (head_dir / CONFIG_NAME).is_file():
        heads = sorted(p.name for p in ASSETS_DIR.iterdir() if p.name.endswith(HEAD_SUFFIX)) \
            if ASSETS_DIR.is_dir() else []
        raise CheckpointError(
            f"no covariance head for model {model_name!r} (looked for {head_dir}); shipped heads: {heads or 'none'}. "
            "Train one with steerdiff.covariance.train_ocm"
        )
    if denoiser is None:
        denoiser = load(model_name)
    return load_head(head_dir, denoiser)


def _refuse_save(head, directory) -> Path:
    raise TypeError("model is an OCM covariance head, which belongs to the denoiser it was trained for: save it with "
                    "steerdiff.covariance.save_head(head, directory, denoiser) and load it with "
                    "steerdiff.covariance.load_head(directory, denoiser)")


@register_format("ocm_head", config_class=None, matches=lambda spec: "denoiser_fingerprint" in spec,
                 save=_refuse_save, handles=lambda obj: isinstance(obj, OCMHead), loadable=False)
def _refuse_load(directory: Path, spec: dict, device="cpu"):
    """``steerdiff.models.load`` of a head directory: refused, since the head must be checked against its denoiser."""
    raise CheckpointError(
        f"{directory} is an OCM covariance head (trained for denoiser {spec.get('denoiser') or 'unnamed'}), not a "
        "model: load it with steerdiff.covariance.load_head(directory, denoiser), which checks that it belongs to "
        "that denoiser (or load_head_for(model_name) for a shipped model's head)")
