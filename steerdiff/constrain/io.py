"""Save / load a NAMM map pair, optionally with its mirror-space model (safetensors + JSON; errors as in
docs/methods/conventions.md, "Errors").

Layout of a NAMM directory::

    namm.json             {"format": "steerdiff-namm", "version": 1, "distance": {...}, "fingerprint": ...,
                           "config": {...}, "history": [...], "mirror_model": null | {"dir": "mirror",
                           "forward_fingerprint": ...}}
    forward/, inverse/    each config.json + model.safetensors (steerdiff.models.io.save)
    mirror/               the mirror-space diffusion model (optional), config.json + model.safetensors

Only safetensors are read (never pickle). The fingerprint (a hash of the forward map's weights) ties the mirror model
to the map it was trained on: loading a bundle whose model was trained on a different map is a CheckpointError.

A bundle is more than one model (two maps, a distance, an optional mirror model), so :func:`steerdiff.models.save`
and :func:`steerdiff.models.load` refuse it (the checkpoint format ``namm`` registered here, marked by ``namm.json``),
pointing to :func:`save_namm` / :func:`load_namm`.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..io import CONFIG_NAME, CheckpointError, atomic_dir, check_save_target, read_json, register_format, write_json
from ..models.io import ASSETS_DIR, load, save
from .distances import HeatResidual, TotalBrightness, unit_circle_distance
from .namm import NAMM

FORMAT = "steerdiff-namm"
META = "namm.json"


def distance_spec(distance) -> dict:
    """A JSON description of a shipped distance (``{"name": "custom"}`` for any other callable)."""
    if distance is unit_circle_distance:
        return {"name": "unit_circle"}
    if isinstance(distance, TotalBrightness):
        return {"name": "total_brightness", "total": distance.total}
    if isinstance(distance, HeatResidual):
        return {"name": "heat_residual", "r": distance.r}
    return {"name": "custom", "repr": repr(distance)[:200]}


def distance_from_spec(spec: dict):
    """Rebuild a shipped distance from :func:`distance_spec`'s JSON."""
    name = spec.get("name") if isinstance(spec, dict) else None
    if name == "unit_circle":
        return unit_circle_distance
    if name == "total_brightness":
        return TotalBrightness(float(spec["total"]))
    if name == "heat_residual":
        return HeatResidual(float(spec["r"]))
    raise CheckpointError(f"distance {spec!r} is not a shipped distance: pass distance= to load_namm")


def save_namm(namm: NAMM, directory: str | os.PathLike, mirror_model: nn.Module | None = None,
              extra: dict | None = None) -> Path:
    """Write ``namm`` (and the mirror-space model trained on its ``g``, if given) to ``directory`` atomically."""
    meta = {"format": FORMAT, "version": 1, "distance": distance_spec(namm.distance), "fingerprint": namm.fingerprint,
            "config": namm.config, "history": namm.history, "mirror_model": None, **(extra or {})}
    if mirror_model is not None:
        trained_on = getattr(mirror_model, "namm_fingerprint", None)
        if trained_on != namm.fingerprint:
            raise ValueError(f"mirror_model was trained on forward map {trained_on!r}, not on this NAMM's "
                             f"{namm.fingerprint!r}: train it with train_mirror_model(namm, ...)")
        meta["mirror_model"] = {"dir": "mirror", "forward_fingerprint": trained_on}
    check_save_target(directory)
    with atomic_dir(directory) as tmp:
        save(namm.forward_map, tmp / "forward")
        save(namm.inverse_map, tmp / "inverse")
        if mirror_model is not None:
            save(mirror_model, tmp / "mirror")
        write_json(tmp / META, meta)
    return Path(directory)


def _resolve(name_or_dir) -> Path:
    p = Path(name_or_dir)
    if (p / META).is_file():
        return p
    if isinstance(name_or_dir, str) and "/" not in name_or_dir and (ASSETS_DIR / name_or_dir / META).is_file():
        return ASSETS_DIR / name_or_dir
    if p.is_dir() and (p / CONFIG_NAME).is_file():
        raise CheckpointError(f"{p} is a plain model checkpoint, not a NAMM directory (no {META}): a model "
                                  "trained without a mirror map cannot be decoded by one")
    raise CheckpointError(f"{name_or_dir}: no NAMM directory ({META} not found)")


def load_namm(name_or_dir: str | os.PathLike, distance=None, device: str = "cpu") -> tuple[NAMM, nn.Module | None]:
    """Load a NAMM directory (or a shipped one by name, e.g. ``"digits_namm"``).

    Returns:
        ``(namm, mirror_model or None)``; the mirror model carries ``namm_fingerprint``.

    Raises:
        CheckpointError: not a NAMM directory, bad format, a mirror model whose recorded forward map differs from
            the loaded one, or an unknown distance when ``distance`` is not given.
    """
    from ..models import icnn  # noqa: F401  (registers the forward-map classes)
    from . import inverse_net  # noqa: F401  (registers the inverse-map class)

    directory = _resolve(name_or_dir)
    meta = read_json(directory / META)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{directory / META}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    dist = distance if distance is not None else distance_from_spec(meta.get("distance"))
    namm = NAMM(load(directory / "forward", device), load(directory / "inverse", device), dist)
    namm.config, namm.history = meta.get("config", {}), meta.get("history", [])
    if namm.fingerprint != meta.get("fingerprint"):
        raise CheckpointError(f"{directory}: forward-map weights do not match the recorded fingerprint")
    mirror = None
    if meta.get("mirror_model"):
        rec = meta["mirror_model"]
        if rec.get("forward_fingerprint") != namm.fingerprint:
            raise CheckpointError(f"{directory}: the mirror model was trained on forward map "
                                      f"{rec.get('forward_fingerprint')!r}, not on the stored {namm.fingerprint!r}")
        mirror = load(directory / rec.get("dir", "mirror"), device)
        mirror.namm_fingerprint = namm.fingerprint
    return namm.eval(), mirror


def _refuse_save(namm, directory) -> Path:
    raise TypeError("model is a NAMM (a pair of maps with its distance), not one model: save it with "
                    "steerdiff.constrain.io.save_namm(namm, directory, mirror_model=None) and load it with "
                    "steerdiff.constrain.io.load_namm(directory)")


@register_format("namm", config_class=None, marker=META, save=_refuse_save, handles=lambda obj: isinstance(obj, NAMM),
                 loadable=False)
def _refuse_load(directory: Path, spec: dict, device="cpu"):
    """``steerdiff.models.load`` of a NAMM directory: refused, since it returns a map pair and a mirror model."""
    raise CheckpointError(f"{directory} is a NAMM bundle ({META}), not one model: load it with "
                          "steerdiff.constrain.io.load_namm(directory), which returns (namm, mirror_model)")
