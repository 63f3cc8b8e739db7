"""What several subcommands share: ``--out`` checks, ``metrics.json``, checked option types, ``--device``,
loading ``--model``, and plots.

Subcommand modules import this module and library packages only, never the group (:mod:`steerdiff.app.cli`), so the
command line has no import cycle. Every value is checked here, at parse time or before any expensive work, so a bad
option is a click error that names it rather than a traceback from inside a sampler.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import torch

from ...io import MARKER_NAME, Registry, check_save_target, inside_package, save_tensors, write_json
from ...models.gmm import BUILTIN_MIXTURES
from ._models import ModelKind, available, describe, load_kind, load_model, name_kind, samplable_kinds

__all__ = ["FINITE", "POSITIVE", "SEED", "RegistryChoice", "available", "check_class", "check_out", "check_output_size",
           "check_sigma_in_range", "check_sigmas", "karras_schedule", "refuse_given",
           "cli_spelling", "DTYPES", "device_option", "dtype_name", "dtype_option", "model_to_dtype", "refuse_dtype",
           "dtype_refused", "finite_range", "load_denoiser", "load_model", "parse_device", "plot",
           "plot_samples", "prepare_out", "start_outputs", "write_metrics",
           "write_samples"]


# ----------------------------------------------------------------------------------------------- option types
class FiniteFloat(click.ParamType):
    """A finite float: click's FLOAT lets ``nan`` and ``inf`` through, which no option of steerdiff means."""

    name = "float"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (``nan`` passes every comparison in click's)."""

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def finite_range(min: float | None = None, max: float | None = None, min_open: bool = False,
                 max_open: bool = False) -> FiniteRange:
    """A finite float in the given range (click's notation: ``0<x``, ``0<=x<=1``)."""
    return FiniteRange(min, max, min_open=min_open, max_open=max_open)


class RegistryChoice(click.Choice):
    """A choice among a registry's entries, read when the command parses its options (so entries a plugin
    registered after this option was declared are offered too).

    Each entry is offered under its command-line spelling: the name with ``_`` written ``-`` when that spelling is
    registered as an alias (``cfg_rescale`` -> ``cfg-rescale``), else the name. Any name or alias of an offered
    entry is accepted and returned as typed. ``offered(name, entry)`` leaves out entries the command cannot run
    (e.g. samplers that need an input the command has no option for).
    """

    def __init__(self, registry: Registry, offered: Callable[[str, Any], bool] | None = None):
        self.registry = registry
        self.offered = offered
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(cli_spelling(self.registry, name) for name, entry in self.registry.items()
                     if self.offered is None or self.offered(name, entry))

    @choices.setter
    def choices(self, _value) -> None:  # click.Choice.__init__ assigns it; the registry is the list
        pass

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value in self.registry:
            entry = self.registry.get(value)
            name = next(n for n, e in self.registry.items() if e is entry)
            if self.offered is None or self.offered(name, entry):
                return value
        return super().convert(value, param, ctx)


def cli_spelling(registry: Registry, name: str) -> str:
    """A registry name as the command line spells it: ``-`` for ``_`` when that alias is registered."""
    dashed = name.replace("_", "-")
    return dashed if dashed != name and dashed in registry and registry.get(dashed) is registry.get(name) else name


FINITE = FiniteFloat()
POSITIVE = finite_range(0, min_open=True)
# Seeds as numpy and EDM take them; row i uses seed + i (plus fixed offsets below 2**31), all within int64.
SEED = click.IntRange(0, 2**32 - 1)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_output_size(n: int, row_bytes: int, param_hint: str = "--n", what: str = "the output") -> None:
    """Refuse ``n`` rows of ``row_bytes`` bytes each that cannot fit in this machine's memory, before any work.

    The output is held in memory whole (and written as one file), so its size is a hard bound; without it a huge
    ``--n`` ends in a ``MemoryError`` traceback, or in swapping, long after the run started."""
    total = physical_memory()
    if total is None or n * row_bytes <= total:
        return
    raise click.BadParameter(f"{n} rows of {what} take {n * row_bytes / 2**30:.3g} GiB, more than this machine's "
                             f"{total / 2**30:.3g} GiB of memory; at most {total // row_bytes} fit",
                             param_hint=param_hint)


def refuse_given(ctx: click.Context, names: tuple[str, ...], reason: str) -> None:
    """An error naming the first of the options ``names`` (Python names) given on the command line, where the run
    would ignore it (``reason`` says why), as ``--ddim-eta`` with heun is refused."""
    for name in names:
        if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT):
            flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
            raise click.BadParameter(f"{flag} does not apply: {reason}", param_hint=flag)


def check_sigmas(sigma_min: float, sigma_max: float | None) -> None:
    """``--sigma-min`` below ``--sigma-max`` (each already a positive finite number)."""
    if sigma_max is not None and not sigma_min < sigma_max:
        raise click.BadParameter(f"--sigma-min ({sigma_min:g}) must be below --sigma-max ({sigma_max:g})",
                                 param_hint="'--sigma-min' / '--sigma-max'")


def karras_schedule(steps: int, sigma_min: float, sigma_max: float, rho: float) -> torch.Tensor:
    """``core.sigmas.karras(steps, sigma_min, sigma_max, rho)``, refused with an error naming ``--sigma-max`` where
    float64 cannot hold it: ``sigma_max ** (1 / rho)`` then ``** rho`` overflows to inf, or the levels collapse to
    equal values (``--sigma-max 1e300``: the schedule's lower levels underflow to 0), which the sampler would report as
    an unrelated "sigmas must be strictly decreasing"."""
    from ... import core

    sig = core.sigmas.karras(steps, sigma_min, sigma_max, rho)
    levels = sig[:-1]
    if not torch.isfinite(levels).all() or not (levels > 0).all() or not (levels[1:] < levels[:-1]).all():
        raise click.BadParameter(f"{sigma_max:g}: the Karras schedule from --sigma-max {sigma_max:g} to --sigma-min "
                                 f"{sigma_min:g} (--rho {rho:g}, {steps} steps) is not representable in float64 (its "
                                 "levels overflow or lose their precision: a level rounds to 0); trained models cover "
                                 "noise levels up to about 80-160 (the model's sigma_max): use a --sigma-max of that "
                                 "order",
                                 param_hint="--sigma-max")
    return sig


def check_sigma_in_range(model, value: float, model_name: str, param_hint: str) -> None:
    """A noise level option (``--sigma-max``, ``--sigma``) within the model's ``sigma_range`` (the levels it was
    trained for; :func:`steerdiff.core.sampling.check_schedule_range` applies the same rule to whole schedules)."""
    rng = getattr(model, "sigma_range", None)
    if rng is not None and value > float(rng[1]) * (1 + 1e-3):
        raise click.BadParameter(f"{value:g} is above {model_name}'s sigma_max {float(rng[1]):g}, the top of the "
                                 "noise range it was trained for", param_hint=param_hint)


# ----------------------------------------------------------------------------------------------- --device
def parse_device(value: str | torch.device) -> torch.device:
    """``--device``: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, available on this machine."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as err:
        raise click.BadParameter(f"{value!r} is not a device; use cpu, cuda, cuda:N or mps",
                                 param_hint="--device") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise click.BadParameter(f"{value!r}: CUDA is not available here (torch.cuda.is_available() is False); "
                                     "use --device cpu", param_hint="--device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise click.BadParameter(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)",
                                     param_hint="--device")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise click.BadParameter(f"{value!r}: MPS is not available here; use --device cpu", param_hint="--device")
    elif device.type != "cpu":
        raise click.BadParameter(f"{value!r}: unsupported device type; use cpu, cuda, cuda:N or mps",
                                 param_hint="--device")
    return device


def device_option(func: Callable) -> Callable:
    """The ``--device`` option (default cpu), parsed and checked to :class:`torch.device`."""
    return click.option("--device", default="cpu", show_default=True, metavar="DEVICE",
                        callback=lambda _ctx, _param, value: parse_device(value),
                        help="Where models, noise and data go: cpu, cuda, cuda:N or mps.")(func)


# ----------------------------------------------------------------------------------------------- --dtype
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""``--dtype``'s values: the precision a command's model runs in."""


def dtype_option(func: Callable) -> Callable:
    """The ``--dtype`` option (default float32), parsed to :class:`torch.dtype`."""
    return click.option("--dtype", type=click.Choice(list(DTYPES)), default="float32", show_default=True,
                        callback=lambda _ctx, _param, value: DTYPES[value],
                        help="Precision the model runs in (it is moved to it; noise and samples follow): float32, "
                             "float16 or bfloat16.")(func)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16`` (as ``--dtype`` spells it, and as metrics.json records it)."""
    return str(dtype).removeprefix("torch.")


def refuse_dtype(dtype: torch.dtype, command: str, why: str) -> None:
    """A command (or one of its paths) that runs in its own precision: any ``--dtype`` but float32 is an error
    naming the command, the option and ``why``."""
    if dtype != torch.float32:
        raise click.BadParameter(f"steerdiff {command} does not run in {dtype_name(dtype)}: {why}; use --dtype "
                                 "float32 (the default)", param_hint="--dtype")


def dtype_refused(command: str, why: str) -> Callable:
    """``--dtype`` for a command that runs in its own precision: offered (every command that runs a model takes it)
    and refused at parse time for anything but float32, naming the command, the option and ``why``."""
    def check(_ctx, _param, value):
        refuse_dtype(DTYPES[value], command, why)
        return DTYPES[value]

    return click.option("--dtype", type=click.Choice(list(DTYPES)), default="float32", show_default=True,
                        expose_value=False, callback=check, help=f"float32 only: {why}.")


def model_to_dtype(model, dtype: torch.dtype, command: str, name: str):
    """``model`` (an ``nn.Module``) moved to ``dtype`` (float32: as loaded); a model that is not a module, or that
    holds no floating-point weights to move, is refused for any other dtype, naming the command and option."""
    if dtype == torch.float32:
        return model
    if not isinstance(model, torch.nn.Module):
        refuse_dtype(dtype, command, f"{name} is not a network (nothing to move to {dtype_name(dtype)})")
    return model.to(dtype)


def auto_progress(value: bool | None) -> bool:
    """``--progress/--no-progress`` as given, else on exactly when stderr (where the bars go) is a terminal."""
    if value is not None:
        return value
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


PROGRESS_HELP = "Progress bars on stderr [default: on when stderr is a terminal]."


def _progress_settings(help: str) -> dict:
    """The keyword settings of the ``--progress/--no-progress`` option (one place for both forms below)."""
    return {"default": None, "help": help, "callback": lambda _ctx, _param, value: auto_progress(value)}


def progress_param(help: str = PROGRESS_HELP) -> click.Option:
    """The ``--progress/--no-progress`` option: on by default on a terminal, off in pipes, logs and tests."""
    return click.Option(["--progress/--no-progress"], **_progress_settings(help))


def progress_option(func: Callable | None = None, *, help: str = PROGRESS_HELP) -> Callable:
    """Decorator form of :func:`progress_param`: ``@progress_option`` or ``@progress_option(help=...)``."""
    def decorate(f: Callable) -> Callable:
        return click.option("--progress/--no-progress", **_progress_settings(help))(f)
    return decorate(func) if func is not None else decorate


# ----------------------------------------------------------------------------------------------- --out, metrics
def check_out(out: str, checkpoint: bool = False, move_aside: bool = False) -> Path:
    """``--out`` as a path; an existing non-directory, an empty path or one inside the installed package is an error
    (checked before any expensive work).

    ``checkpoint``: ``--out`` is a checkpoint directory the command replaces as a whole, so it must be new, empty,
    or a checkpoint steerdiff wrote (:func:`steerdiff.io.check_save_target`): a user's files are never deleted. An
    existing directory that is none of these is refused with the ways forward, or, with ``move_aside``, accepted: the
    command renames it (:func:`move_aside`) just before it writes.
    """
    if out == "":
        raise click.BadParameter("'' is an empty path; give the output directory", param_hint="--out")
    path = Path(out)
    package = inside_package(path)
    if package is not None:
        raise click.BadParameter(f"{out} lies inside the installed steerdiff package ({package}), which is never "
                                 "written to; choose a directory outside it", param_hint="--out")
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    probe = path
    for parent in path.parents:  # a file on the way (out/x where out is a file) cannot become a directory
        if parent.exists():
            if not parent.is_dir():
                raise click.BadParameter(f"{parent} exists and is not a directory", param_hint="--out")
            probe = path if path.exists() else parent
            break
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{out}: cannot write {'in' if probe == path else 'under'} {probe} (permission "
                                 "denied); choose a writable directory", param_hint="--out")
    if checkpoint:
        try:
            check_save_target(path)
        except ValueError as err:
            reason = str(err).removeprefix("directory: ")
            if not (path.is_dir() and not path.is_symlink()):  # a package path, a link, a file: no way around
                raise click.BadParameter(reason, param_hint="--out") from err
            if move_aside:
                return path
            if _unmarked_checkpoint(path):
                reason = (f"{out} looks like a checkpoint of an earlier steerdiff (a config.json, without the "
                          f"{MARKER_NAME} marker that steerdiff now writes), so steerdiff cannot prove it holds "
                          "nothing of yours and will not replace it")
            raise click.BadParameter(f"{reason}. Ways forward: --move-aside renames it to {aside_name(path)} "
                                     "(nothing is deleted) and writes a new one; or move or delete it yourself; or "
                                     "choose another --out", param_hint="--out") from err
    return path


def _unmarked_checkpoint(path: Path) -> bool:
    """``path`` looks like a checkpoint an earlier steerdiff wrote: no marker, a ``model.safetensors`` and a
    ``config.json`` naming a ``class`` (a user's own ``config.json`` is not taken for one)."""
    import json

    if (path / MARKER_NAME).exists() or not (path / "model.safetensors").is_file():
        return False
    try:
        spec = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(spec, dict) and isinstance(spec.get("class"), str)


def aside_name(path: Path) -> Path:
    """The first free ``<path>.old``, ``<path>.old-2``, ... beside ``path``: where ``--move-aside`` puts it."""
    candidate, k = path.with_name(path.name + ".old"), 2
    while candidate.exists() or candidate.is_symlink():
        candidate, k = path.with_name(f"{path.name}.old-{k}"), k + 1
    return candidate


def move_aside(path: Path) -> Path | None:
    """Rename the directory ``path`` to :func:`aside_name` when a save would refuse to replace it (``--move-aside``):
    nothing is deleted. Returns the new name, or None when ``path`` is absent or replaceable as it is."""
    try:
        check_save_target(path)
        return None
    except ValueError:
        pass
    target = aside_name(path)
    try:
        path.rename(target)
    except OSError as err:
        raise click.BadParameter(f"cannot rename {path} to {target}: {err.strerror or err}",
                                 param_hint="--move-aside") from err
    return target


def prepare_out(out: str) -> Path:
    """Create the ``--out`` directory (and its parents); it must be a writable directory."""
    path = check_out(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a read-only file system, a permission the check above could not see, a full disk
        raise click.BadParameter(f"cannot create {out}: {err.strerror or err}", param_hint="--out") from err
    if not os.access(path, os.W_OK):
        raise click.BadParameter(f"{out} is not writable", param_hint="--out")
    return path


def start_outputs(out_dir: Path) -> Path:
    """Remove the ``metrics.json`` of an earlier run before a command writes its first output into ``out_dir``.

    Every command writes its summary, ``metrics.json``, last (:func:`write_metrics`): a failure between two writes
    then leaves no summary at all, never one that describes other (or missing) samples and images.
    """
    (out_dir / "metrics.json").unlink(missing_ok=True)
    return out_dir


def write_metrics(out_dir: Path, result: dict) -> Path:
    """Atomically write ``out_dir/metrics.json`` (numpy scalars and 0-d tensors written as floats); call it after
    every other output is written (:func:`start_outputs`), so that a complete-looking result is a complete one."""
    path = out_dir / "metrics.json"
    write_json(path, result, default=float)
    return path


def write_samples(out_dir: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, object]) -> Path:
    """Atomically write ``out_dir/samples.safetensors``: the tensors, and ``metadata`` as the file's string metadata
    (strings as they are, anything else as JSON), beside ``format: pt`` and ``steerdiff: samples``.

    Read it back with ``safetensors.safe_open(path, "pt").metadata()`` (or ``steerdiff.io.load_tensors`` for the
    tensors alone)."""
    import json

    meta = {"steerdiff": "samples"}
    meta |= {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str) for k, v in metadata.items()}
    path = out_dir / "samples.safetensors"
    save_tensors(tensors, path, metadata=meta)
    return path


# ----------------------------------------------------------------------------------------------- models
def load_denoiser(name: str, device: torch.device | str = "cpu"):
    """``(model, is_mixture)``: a built-in Gaussian mixture (exact denoiser), or a model of a samplable kind loaded
    by name or path (steerdiff/app/cli/_models.py: the model kinds).

    A mixture evaluates on the CPU in float64 and returns its output on the input's device, so it needs no move.
    """
    kind = name_kind(name)
    if kind is not None:
        if kind not in samplable_kinds():
            raise click.BadParameter(f"{describe(name, ModelKind(kind))}. Available: "
                                     f"{available(samplable_kinds(), sorted(BUILTIN_MIXTURES))}", param_hint="--model")
        return load_kind(name, kind, device=device), kind == "mixture"
    return load_model(name, extra=sorted(BUILTIN_MIXTURES), device=device), False


def check_class(class_: int | None, num_classes, name: str) -> None:
    """``--class`` in ``[0, K - 1]`` for a one-slot conditional model; an error for an unconditional one."""
    if class_ is None:
        return
    classes = tuple(num_classes or ())
    if not classes:
        raise click.BadParameter(f"{name} is unconditional", param_hint="--class")
    if len(classes) == 1 and not 0 <= class_ < classes[0]:
        raise click.BadParameter(f"must be in [0, {classes[0] - 1}] for {name}, got {class_}", param_hint="--class")


# ----------------------------------------------------------------------------------------------- plots
def plot(draw: Callable, path: Path) -> None:
    """``draw(steerdiff.viz)``, which writes ``path``; without matplotlib, warn and skip the plot."""
    try:
        from ... import viz

        draw(viz)
    except ImportError as err:
        click.echo(f"warning: {err}; skipped {path.name}", err=True)


def plot_samples(samples: torch.Tensor, path: Path, title: str = "", reference: torch.Tensor | None = None,
                 max_images: int | None = None) -> None:
    """An image grid of ``[N, C, H, W]`` samples (the first ``max_images``), else a scatter over ``reference``."""
    samples = samples.detach().cpu()
    if samples.ndim == 4:
        plot(lambda viz: viz.image_grid(samples[:max_images], path), path)
    else:
        plot(lambda viz: viz.scatter(samples, path, reference=reference, title=title), path)
