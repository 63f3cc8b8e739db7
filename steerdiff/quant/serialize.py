"""Quantized checkpoints of SVDQuant (Li et al., ICLR 2025) and its baselines: plain tensors in
``model.safetensors`` + a JSON description (docs/methods/svdquant.md, "Storage and bits per weight"; checked by
T5 there).

Layout of a quantized directory::

    config.json        {"class": "QuantizedModel", "base": {"class": "EDMPrecond", "config": {...}} | null,
                        "quantization": {"method", "fmt", "layers": {path: layer spec}}, "steerdiff_version"}
    model.safetensors  the fp tensors of the untouched layers + per quantized layer:
                       codes (uint8, two 4-bit codes per byte, low nibble = even input index), scales
                       (fp16, or E4M3 for NVFP4, + a float32 tensor_scale), smooth_factor (fp16),
                       lora_down / lora_up (fp16), bias (fp32)

Nothing is pickled. On load the model is rebuilt from ``base`` (or from a caller-given unquantized template,
e.g. a diffusers UNet), every listed layer is replaced by an empty quantized layer built from its JSON spec,
and each file tensor must match the expected name, shape **and dtype** (a JSON/tensor disagreement is a
:class:`~steerdiff.io.CheckpointError`). Loading is bit-exact. The layout is registered as the checkpoint
format ``quantized``, so :func:`steerdiff.models.load` reads it too.
"""

from __future__ import annotations

import copy
import json
import os
import struct
from pathlib import Path

from torch import nn

from ..io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    __version__,
    atomic_dir,
    load_state_strict,
    load_tensors,
    read_json,
    register_format,
    save_tensors,
    write_json,
)
from ..models.io import build_model, model_spec
from .kernels import W4A16Layer, W8A8Layer
from .layers import SVDQLayer, padded_k
from .mapping import denoiser_root, set_module

QUANT_CLASS = "QuantizedModel"
LAYER_TYPES = {"SVDQLayer": SVDQLayer, "W4A16Layer": W4A16Layer, "W8A8Layer": W8A8Layer}


def is_quantized_config(spec: dict) -> bool:
    return isinstance(spec, dict) and spec.get("class") == QUANT_CLASS


def save(model, directory: str | os.PathLike) -> Path:
    """Save a model returned by :func:`steerdiff.quant.quantize` (atomically; see the module docstring)."""
    from .api import quant_info

    info = quant_info(model)
    root = denoiser_root(model)
    try:
        base = model_spec(model)
    except TypeError:
        base = None  # e.g. a diffusers UNet: load with steerdiff.quant.load(dir, template=unquantized model)
    spec = {"class": QUANT_CLASS, "base": base,
            "quantization": {k: info[k] for k in ("method", "fmt", "layers")},
            "steerdiff_version": __version__}
    with atomic_dir(directory) as tmp:
        write_json(tmp / CONFIG_NAME, spec)
        save_tensors(root.state_dict(), tmp / WEIGHTS_NAME)
    return Path(directory)


def _layer_from_spec(path: str, spec: dict) -> nn.Module:
    if not isinstance(spec, dict) or spec.get("type") not in LAYER_TYPES:
        raise CheckpointError(f"config.json: layer {path!r} has no valid 'type' (one of {sorted(LAYER_TYPES)})")
    try:
        return LAYER_TYPES[spec["type"]]({k: v for k, v in spec.items() if k != "type"})
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json: layer {path!r} has an invalid spec: {e!r}") from e


def load(directory: str | os.PathLike, template: nn.Module | None = None, device: str = "cpu"):
    """Load a quantized directory written by :func:`save`; returned in eval mode.

    Args:
        directory: the checkpoint directory.
        template: the unquantized model to rebuild into (needed when ``base`` is null, e.g. diffusers); it is
            copied, not modified.

    Raises:
        CheckpointError: not a quantized checkpoint, missing files, JSON and tensors that disagree in names,
            shapes or dtypes.
    """
    directory = Path(directory)
    spec = read_json(directory / CONFIG_NAME)
    if not is_quantized_config(spec):
        raise CheckpointError(f"{directory}: config.json is not a quantized model (class != {QUANT_CLASS!r})")
    q = spec.get("quantization")
    if not isinstance(q, dict) or not isinstance(q.get("layers"), dict) or not q["layers"]:
        raise CheckpointError(f"{directory}/config.json: 'quantization.layers' must be a non-empty object")
    if template is not None:
        model = copy.deepcopy(template)
    elif spec.get("base") is not None:
        model = build_model(spec["base"])
    else:
        raise CheckpointError(f"{directory}: the base model is not a registered steerdiff model; pass template=")
    root = denoiser_root(model)
    for path, lspec in q["layers"].items():
        try:
            root.get_submodule(path)
        except AttributeError as e:
            raise CheckpointError(f"config.json: layer {path!r} does not exist in the base model") from e
        set_module(root, path, _layer_from_spec(path, lspec))
    load_state_strict(root, load_tensors(directory / WEIGHTS_NAME), str(directory), check_dtype=True,
                      mismatch="disagree with config.json")
    root.steerdiff_quant = {"method": q.get("method"), "fmt": q.get("fmt"), "layers": q["layers"], "report": []}
    out = model.to(device) if isinstance(model, nn.Module) else model
    if isinstance(out, nn.Module):
        out.eval()
    return out


@register_format("quantized", config_class=QUANT_CLASS)
def _load_format(directory: Path, spec: dict, device: str = "cpu"):
    return load(directory, device=device)


def tensor_bytes(directory: str | os.PathLike) -> dict[str, int]:
    """Bytes of each tensor's data in a safetensors file, read from its header (no tensor is loaded)."""
    path = Path(directory) / WEIGHTS_NAME
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def formula_bytes(spec: dict) -> int:
    """Stored bytes (the T5 formula): ``n m/2 + 2 n m/g + 2 r (n + m) + 2 m_lambda + 4 n`` (INT4; fp16
    scales/factors, fp32 bias).

    ``m`` counts the padded K for codes and scales (:func:`~steerdiff.quant.layers.padded_k`), the true
    ``cin * kh * kw`` for the low-rank factors, and ``cin`` for lambda. NVFP4 scales take 1 byte each plus a 4-byte
    tensor scale.
    """
    n, cin = spec["out_channels"], spec["in_channels"]
    kh, kw = spec["kernel"]
    g, r = spec["group"], spec["rank"]
    mp = padded_k(spec)
    fb = {"float16": 2, "bfloat16": 2, "float32": 4}[spec.get("factor_dtype", "float16")]
    scales = 2 * n * mp // g if spec["wfmt"] == "int4" else n * mp // g + 4
    total = n * mp // 2 + scales + fb * r * (n + cin * kh * kw)
    total += fb * cin if spec.get("smooth") else 0
    total += 4 * n if spec.get("bias", True) else 0
    return total
