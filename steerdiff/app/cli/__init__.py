"""The ``steerdiff`` command line: one click group, a module per subcommand.

    steerdiff sample     samples of a built-in mixture or a trained model, unguided or guided
    steerdiff train      train a model from a JSON recipe
    steerdiff align      reward-aligned sampling (DAS and baselines)
    steerdiff restore    image inverse problems (DPS, DR, CR, HR)
    steerdiff constrain  constrained sampling with neural approximate mirror maps (NAMM)
    steerdiff quantize   4-bit post-training quantization (SVDQuant and baselines)
    steerdiff forecast   ensemble forecasts of a Dynamical Diffusion model (DyDiff and its baseline)
    steerdiff schedule   a schedule optimised for a model and a sampler (JSON for sample --sigmas)
    steerdiff geometry   local geometry descriptors (psi, nu, delta) of a model's samples
    steerdiff stylize    reference-style samples by RB-Modulation's optimal control (and its baselines)
    steerdiff motion     new motions (BVH) from a MotionDreamer model of one motion; temporal editing
    steerdiff demo       an HTML report of every method beside its baselines

Every subcommand takes ``--device`` (default ``cpu``; checked to exist on this machine) and ``--dtype`` (float32,
float16 or bfloat16): the inference commands (sample, align, quantize, restore, forecast, stylize, constrain sample)
run their network in it and keep the sampler's state in float32; ``train`` takes bfloat16 as mixed precision
(autocast; float32 weights) and refuses float16 (it needs loss scaling); geometry, demo and constrain train refuse
half precision, naming themselves and why. Subcommand modules share
their helpers through :mod:`steerdiff.app.cli._common` (option types, ``--out``, ``--device``), ``_models`` (what a
``--model`` is: the model-kind registry), ``_guiders`` (``--guidance`` and the guider flags, from the guider registry)
and ``_inputs`` (images and tensors given on the command line), and never import this module, so the command line
has no import cycle. ``python -m steerdiff.app.cli`` runs the group.

Plugins (:mod:`steerdiff.io.plugin_loader`): the modules named in ``STEERDIFF_PLUGINS`` and the ``steerdiff.plugins``
entry points are imported here, before the subcommand modules build their options, so a guider, sampler, solver or
inverse task a plugin registers is offered and run like the shipped ones (CONTRIBUTING.md, "Plugins"); a plugin may
also register a ``--model`` kind (:func:`register_model_kind`, from this package). A plugin that fails to load makes
every command fail with a message naming it, before anything runs.

Errors: a bad option is a click error naming it (exit code 2). What the library raises for a run that cannot go on
is an ``Error: ...`` line with exit code 1, never a traceback (:class:`_Group`): ``FloatingPointError`` (the model
returned NaN or inf, e.g. a huge ``--scale`` or a model with NaN weights; the message names the step and sigma),
``OSError`` (a directory that cannot be written, a full disk) and ``MemoryError``. Anything else is a bug and keeps
its traceback. The library's ``RuntimeWarning``s (a schedule past the model's range, guidance far past where it
steers, dropped particles) are printed as ``warning: ...`` lines on stderr, without the file and line of the call.
"""

from __future__ import annotations

import errno
import warnings

import click

from ...io.plugin_loader import PluginError, load_plugins
from ._models import MODEL_KINDS, register_model_kind  # before the plugins load: a plugin may register a kind

try:
    load_plugins()
    _PLUGIN_ERROR: PluginError | None = None
except PluginError as _err:  # reported by the group when a command runs: a click error, not an import traceback
    _PLUGIN_ERROR = _err

from .align import align_cmd
from .constrain import constrain_cmd
from .demo import demo_cmd
from .forecast import forecast_cmd
from .geometry import geometry_cmd
from .motion import motion_cmd
from .quantize import quantize_cmd
from .restore import restore_cmd
from .sample import sample_cmd
from .schedule import schedule_cmd
from .segment import segment_cmd
from .stylize import stylize_cmd
from .train import train_cmd


def _describe(err: BaseException) -> str:
    """One line for an error the library raised: what failed, and what to change where that is known."""
    if isinstance(err, FloatingPointError):
        return (f"{err} (usual causes: a guidance --scale too large, or a model with NaN or inf weights; lower the "
                "scale, or check the model)")
    if isinstance(err, MemoryError):
        detail = f": {err}" if str(err) else ""
        return f"out of memory{detail} (use a smaller --n or --batch)"
    if err.errno == errno.ENOSPC:
        where = f" writing {err.filename}" if err.filename else ""
        return f"no space left on the device{where} (free space, or choose another --out)"
    if isinstance(err, PermissionError):
        where = f" for {err.filename}" if err.filename else ""
        return f"permission denied{where} (choose an --out you can write)"
    return f"{err.strerror or err}{': ' + str(err.filename) if err.filename else ''}"


class _Group(click.Group):
    """The group: the library's run-time errors end as ``Error: ...`` (exit code 1), not as tracebacks.

    Only these types are caught: a ``ValueError`` of bad input is turned into a click error where the option is
    known (in the subcommands), and any other exception is a bug whose traceback must show.
    """

    def invoke(self, ctx: click.Context):
        with warnings.catch_warnings():  # restores the display below on the way out
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, RuntimeWarning):
                    click.echo(f"warning: {message}", err=True)
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            try:
                return super().invoke(ctx)
            except (FloatingPointError, MemoryError, OSError) as err:
                raise click.ClickException(_describe(err)) from err


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="steerdiff")
def main() -> None:
    """Steer diffusion models at sampling time."""
    if _PLUGIN_ERROR is not None:
        raise click.ClickException(str(_PLUGIN_ERROR))


for _command in (sample_cmd, train_cmd, align_cmd, constrain_cmd, demo_cmd, quantize_cmd, restore_cmd, forecast_cmd,
                 geometry_cmd, stylize_cmd, schedule_cmd, motion_cmd, segment_cmd):
    main.add_command(_command)

__all__ = ["MODEL_KINDS", "main", "register_model_kind"]
