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
format ``quantized`` with its loader and its saver, so :func:`steerdiff.models.save` writes a quantized model in it
and :func:`steerdiff.models.load` reads it back (for a base steerdiff can rebuild; a diffusers or plain-module base
needs :func:`load` with ``template=``).
"""

from __future__ import annotations

import copy
import json
import os
import struct
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
from ..models.io import build_model, check_device, model_spec
from .kernels import W4A16Layer, W8A8Layer
from .layers import FACTOR_DTYPES, K_LAYOUTS, SVDQLayer, layer_geometry, padded_k
from .mapping import denoiser_root, set_module
from .registry import QUANTIZERS

QUANT_CLASS = "QuantizedModel"
LAYER_TYPES = {"SVDQLayer": SVDQLayer, "W4A16Layer": W4A16Layer, "W8A8Layer": W8A8Layer}
QUANT_LAYERS = tuple(LAYER_TYPES.values())
GEOMETRY = ("kind", "in_channels", "out_channels", "kernel", "stride", "padding")


def is_quantized_config(spec: dict) -> bool:
    return isinstance(spec, dict) and spec.get("class") == QUANT_CLASS


def is_quantized_model(obj) -> bool:
    """Whether ``obj`` is a quantized model: it carries a ``steerdiff_quant`` record or holds a quantized layer."""
    try:
        root = denoiser_root(obj)
    except TypeError:
        return False
    if getattr(root, "steerdiff_quant", None) is not None:
        return True
    return any(isinstance(m, QUANT_LAYERS) for m in root.modules())


def save(model, directory: str | os.PathLike) -> Path:
    """Save a model returned by :func:`steerdiff.quant.quantize` (atomically; see the module docstring).

    Raises:
        ValueError: ``model`` is not quantized, or ``directory`` is an existing file, lies inside the installed
            package, or is a non-empty folder that is not a checkpoint steerdiff wrote (saving replaces the folder
            as a whole; :func:`steerdiff.io.check_save_target`).
    """
    from .api import quant_info

    check_save_target(directory)
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


def _bad(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"config.json: layer {path!r} has an invalid spec: {why}")


def _check_layer_spec(path: str, spec) -> None:
    """The JSON of one quantized layer: types and ranges (a corrupt value is an error, never a huge allocation)."""
    if not isinstance(spec, dict) or spec.get("type") not in LAYER_TYPES:
        raise CheckpointError(f"config.json: layer {path!r} has no valid 'type' (one of {sorted(LAYER_TYPES)})")

    def integer(key: str, low: int) -> None:
        v = spec.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _bad(path, f"{key!r} must be an integer >= {low}, got {v!r}")

    def pair(key: str, low: int) -> None:
        v = spec.get(key)
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(e, int) and not isinstance(e, bool)
                                                             and e >= low for e in v)):
            raise _bad(path, f"{key!r} must be a list of two integers >= {low}, got {v!r}")

    if spec.get("kind") not in ("linear", "conv2d"):
        raise _bad(path, f"'kind' must be 'linear' or 'conv2d', got {spec.get('kind')!r}")
    integer("in_channels", 1)
    integer("out_channels", 1)
    pair("kernel", 1)
    pair("stride", 1)
    pair("padding", 0)
    if spec["kind"] == "linear" and (spec["kernel"] != [1, 1] or spec["stride"] != [1, 1] or spec["padding"] != [0, 0]):
        raise _bad(path, "a linear layer has kernel [1, 1], stride [1, 1] and padding [0, 0]")
    if spec["type"] == "SVDQLayer":
        integer("group", 2)
        integer("rank", 0)
        if spec["group"] % 2:
            raise _bad(path, f"'group' must be even (codes are packed two per byte), got {spec['group']}")
        for key, allowed in (("wfmt", ("int4", "nvfp4", "none")), ("afmt", ("int4", "nvfp4", "int8", "none")),
                             ("factor_dtype", tuple(FACTOR_DTYPES)), ("k_layout", K_LAYOUTS)):
            if key in spec or key in ("wfmt", "afmt"):
                if spec.get(key) not in allowed:
                    raise _bad(path, f"{key!r} must be one of {list(allowed)}, got {spec.get(key)!r}")
        shift = spec.get("shift", 0.0)
        if isinstance(shift, bool) or not isinstance(shift, (int, float)):
            raise _bad(path, f"'shift' must be a number, got {shift!r}")
    elif spec["type"] == "W4A16Layer":
        integer("group", 2)
        if spec["group"] % 2:
            raise _bad(path, f"'group' must be even (codes are packed two per byte), got {spec['group']}")


def _layer_from_spec(path: str, spec: dict, tensors: dict, source: str) -> nn.Module:
    """An empty quantized layer built from its JSON, after checking that the file's tensors fit it (built on the
    meta device first, so a spec that disagrees with the file allocates nothing)."""
    try:
        with torch.device("meta"):
            layer = LAYER_TYPES[spec["type"]]({k: v for k, v in spec.items() if k != "type"})
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"config.json: layer {path!r} has an invalid spec: {e!r}") from e
    prefix = f"{path}." if path else ""
    wrong = []
    for name, t in layer.state_dict().items():
        f = tensors.get(prefix + name)
        if f is None:
            wrong.append(f"{prefix + name}: missing from the file")
        elif f.shape != t.shape or f.dtype != t.dtype:
            wrong.append(f"{prefix + name}: file {tuple(f.shape)} {f.dtype} vs expected {tuple(t.shape)} {t.dtype}")
    if wrong:
        raise CheckpointError(f"{source}: tensors of layer {path!r} disagree with config.json: {wrong[:10]}")
    return layer.to_empty(device="cpu")  # every buffer is then filled from the file (strict load)


def _geometry(module: nn.Module) -> dict | None:
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        try:
            return layer_geometry(module)
        except ValueError:
            return None
    if isinstance(module, QUANT_LAYERS):
        return {k: module.spec[k] for k in GEOMETRY}
    return None


def _describe(geo: dict) -> str:
    kernel = "" if geo["kind"] == "linear" else f" kernel {geo['kernel']} stride {geo['stride']} pad {geo['padding']}"
    return f"{geo['kind']} {geo['in_channels']}->{geo['out_channels']}{kernel}"


def _check_replaces(root: nn.Module, path: str, spec: dict) -> None:
    """The module a quantized layer replaces must exist and have the layer's geometry (same model as the base)."""
    try:
        module = root.get_submodule(path)
    except AttributeError as e:
        raise CheckpointError(f"config.json: layer {path!r} does not exist in the base model") from e
    geo = _geometry(module)
    want = {k: spec[k] for k in GEOMETRY}
    if geo is None:
        raise CheckpointError(f"config.json: layer {path!r} replaces a {type(module).__name__} in the base model, "
                              "not an nn.Linear or nn.Conv2d (is the template the unquantized model?)")
    if geo != want:
        raise CheckpointError(f"config.json: layer {path!r} is {_describe(want)} but the base model's layer there is "
                              f"{_describe(geo)} (a template of a different model?)")


def load(directory: str | os.PathLike, template: nn.Module | None = None, device: str = "cpu"):
    """Load a quantized directory written by :func:`save`; returned in eval mode.

    Args:
        directory: the checkpoint directory.
        template: the unquantized model to rebuild into (needed when ``base`` is null, e.g. diffusers); it is
            copied, not modified.
        device: where to put the model (checked to exist before any file is read).

    Raises:
        CheckpointError: not a quantized checkpoint, missing files, a corrupt layer description, layers the base
            model (or ``template``) does not have or has in another geometry, JSON and tensors that disagree in
            names, shapes or dtypes.
        TypeError: ``template`` is not an ``nn.Module`` or a ``from_diffusers`` denoiser.
        ValueError: ``device`` is not a device name, or names one this machine lacks.
    """

    check_device(device)
    directory = Path(directory)
    if directory.is_file():
        directory = directory.parent
    spec = read_json(directory / CONFIG_NAME)
    if not is_quantized_config(spec):
        raise CheckpointError(f"{directory}: config.json is not a quantized model (class != {QUANT_CLASS!r})")
    q = spec.get("quantization")
    if not isinstance(q, dict) or not isinstance(q.get("layers"), dict) or not q["layers"]:
        raise CheckpointError(f"{directory}/config.json: 'quantization.layers' must be a non-empty object")
    if q.get("method") not in QUANTIZERS:
        raise CheckpointError(f"{directory}/config.json: 'quantization.method' must be one of {QUANTIZERS.names()} "
                              f"(the registered quantizers: import a plugin's module before loading its checkpoints), "
                              f"got {q.get('method')!r}")
    if q.get("fmt") not in ("int4", "nvfp4", None):
        raise CheckpointError(f"{directory}/config.json: 'quantization.fmt' must be 'int4', 'nvfp4' or null, "
                              f"got {q.get('fmt')!r}")
    if "" in q["layers"] and len(q["layers"]) > 1:
        raise CheckpointError(f"{directory}/config.json: layer '' (the whole model is one layer) cannot come with "
                              "other layers")
    if template is not None:
        try:
            denoiser_root(template)
        except TypeError as e:
            raise TypeError(f"template must be the unquantized model (an nn.Module or a from_diffusers denoiser), "
                            f"got {type(template).__name__}") from e
        model = copy.deepcopy(template)
    elif spec.get("base") is not None:
        model = build_model(spec["base"])
    else:
        raise CheckpointError(f"{directory}: the base model is not a registered steerdiff model (config.json has "
                              "base: null): load it with steerdiff.quant.load(directory, template=<the unquantized "
                              "model>)")
    root = denoiser_root(model)
    tensors = load_tensors(directory / WEIGHTS_NAME)
    for path, lspec in q["layers"].items():
        _check_layer_spec(path, lspec)
        _check_replaces(root, path, lspec)
        layer = _layer_from_spec(path, lspec, tensors, str(directory))
        if path == "":  # a bare quantized layer (quantize(nn.Linear)): the model is the layer itself
            model = root = layer
        else:
            set_module(root, path, layer)
    load_state_strict(root, tensors, str(directory), check_dtype=True, mismatch="disagree with config.json")
    root.steerdiff_quant = {"method": q.get("method"), "fmt": q.get("fmt"), "layers": q["layers"], "report": []}
    out = model.to(device) if isinstance(model, nn.Module) else model
    if isinstance(out, nn.Module):
        out.eval()
    return out


def _save_format(model, directory: str | os.PathLike) -> Path:
    """``steerdiff.models.save`` of a quantized model: only one whose base ``steerdiff.models.load`` can rebuild."""
    from .api import quant_info

    quant_info(model)
    try:
        model_spec(model)
    except TypeError as e:
        raise TypeError(
            f"model is quantized from a {type(model).__name__}, which steerdiff.models.load cannot rebuild from a "
            "directory (not a registered steerdiff model: a diffusers UNet or a plain nn.Module): save it with "
            "steerdiff.quant.save(model, directory) and load it with steerdiff.quant.load(directory, "
            "template=<the unquantized model>)") from e
    return save(model, directory)


@register_format("quantized", config_class=QUANT_CLASS, save=_save_format, handles=is_quantized_model)
def _load_format(directory: Path, spec: dict, device: str = "cpu"):
    if spec.get("base") is None:
        raise CheckpointError(f"{directory}: this model was quantized from a model steerdiff cannot rebuild (a "
                              "diffusers UNet or a plain nn.Module; config.json has base: null): load it with "
                              "steerdiff.quant.load(directory, template=<the unquantized model>)")
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
