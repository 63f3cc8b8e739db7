"""``--schedule``: a registered schedule (:data:`steerdiff.core.sigmas.SCHEDULES`), ``auto`` or ``flow``, and the
options each takes.

The registry is the list: a schedule registered by a plugin is offered with no change here. A schedule's options are
the parameters of its function: ``--sigma-min``, ``--sigma-max`` and ``--rho`` fill those named so, ``--schedule-option
KEY=VALUE`` any other (``beta``'s ``alpha`` and ``beta``, ``linear_quadratic``'s ``threshold_noise``, ...); a flag the
chosen schedule does not read is refused, naming it. A schedule over the model's discrete table (``table``: ComfyUI's
``simple``, ``ddim_uniform``, ``sgm_uniform``, ``beta``) gets the model's own per-timestep sigmas (a VP model's
``sigmas``); for a model without one, ComfyUI's tables: a continuous (EDM) model's 1000 levels log-uniform from
``--sigma-min`` to ``--sigma-max`` (its ``ModelSamplingContinuousEDM``), a flow model's 1000 shifted times
``t_k = s u / (1 + (s - 1) u)``, ``u = k / 1000`` with ``s = --shift`` (its ``ModelSamplingDiscreteFlow``), the
schedule computed in ``t`` and converted to ``sigma = t / (1 - t)``. ``linear_quadratic`` is in ComfyUI's sigma: the
flow time for a flow model (top ``t = 1``, converted), else the model's sigma up to ``--sigma-max``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import click
import torch

from ... import core
from ...core.sigmas import SCHEDULES, flow_t_to_sigma
from ._common import RegistryChoice, check_sigma_in_range, karras_schedule
from ._pipelines import reject_options

BUILTIN = ("auto", "flow")  # not registry entries: auto picks flow or karras by the model; flow is FLUX's grid
FLAG_PARAMS = ("sigma_min", "sigma_max", "rho")  # schedule parameters with their own command-line flag
COMFY_TABLE_SIZE = 1000  # ComfyUI's continuous-EDM and discrete-flow model samplings tabulate 1000 levels


class ScheduleChoice(RegistryChoice):
    """``auto``, ``flow`` and every registered schedule, read when the command parses its options."""

    def __init__(self):
        super().__init__(SCHEDULES)

    @property
    def choices(self) -> tuple[str, ...]:
        return BUILTIN + RegistryChoice.choices.fget(self)

    @choices.setter
    def choices(self, _value) -> None:
        pass

    def convert(self, value, param, ctx):
        if value in BUILTIN:
            return value
        return super().convert(value, param, ctx)


SCHEDULE_CHOICE = ScheduleChoice()


def schedule_params(name: str) -> dict[str, inspect.Parameter]:
    """The options of registered schedule ``name``: its function's keyword parameters but ``steps``."""
    params = inspect.signature(SCHEDULES.get(name)).parameters
    return {k: p for k, p in params.items() if k != "steps" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def parse_schedule_options(values: tuple[str, ...]) -> dict[str, float | int]:
    """``--schedule-option KEY=VALUE`` (repeatable): numbers, integers kept integral."""
    out: dict[str, float | int] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--schedule-option")
        if key in out:
            raise click.BadParameter(f"{key} given twice", param_hint="--schedule-option")
        try:
            value: float | int = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise click.BadParameter(f"{key}={raw!r}: the value must be a number",
                                         param_hint="--schedule-option") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise click.BadParameter(f"{key}={raw}: the value must be finite", param_hint="--schedule-option")
        out[key] = value
    return out


def _table(model: Any, sigma_min: float, sigma_max: float, shift: float) -> tuple[torch.Tensor, bool]:
    """The model's increasing per-timestep sigmas (ComfyUI's ``model_sampling.sigmas``) and whether they are flow
    times ``t`` (to be converted after the schedule)."""
    own = getattr(model, "sigmas", None)
    if isinstance(own, torch.Tensor) and own.ndim == 1:
        return own.detach().to("cpu", torch.float64), False
    if isinstance(model, core.FlowDenoiser):
        u = torch.arange(1, COMFY_TABLE_SIZE + 1, dtype=torch.float64) / COMFY_TABLE_SIZE
        return shift * u / (1 + (shift - 1) * u), True
    return torch.linspace(math.log(sigma_min), math.log(sigma_max), COMFY_TABLE_SIZE,
                          dtype=torch.float64).exp(), False


def registry_schedule(ctx: click.Context, name: str, model: Any, model_name: str, steps: int, sigma_min: float,
                      sigma_max: float, rho: float, shift: float, extra: tuple[str, ...]) -> tuple[torch.Tensor, dict]:
    """The sigmas of registered schedule ``name`` for ``steps`` steps on ``model``, and the record for
    ``metrics.json`` (``{"kind": name, **options}``). Flags the schedule does not read are refused, naming them."""
    params = schedule_params(name)
    options = parse_schedule_options(extra)
    flow_model = isinstance(model, core.FlowDenoiser)
    own_table = isinstance(getattr(model, "sigmas", None), torch.Tensor)
    uses_table = "table" in params
    flags = {"sigma_min": sigma_min, "sigma_max": sigma_max, "rho": rho}
    if uses_table:  # the flags shape the table where the model has none
        takes = () if own_table else (("shift",) if flow_model else ("sigma_min", "sigma_max"))
    elif name == "linear_quadratic" and flow_model:
        takes = ()  # in the flow time, from t = 1
    else:
        takes = tuple(k for k in FLAG_PARAMS if k in params)
    why = (f"--schedule {name} does not read it" + (" (it runs on the model's own table)" if uses_table and own_table
                                                    else ""))
    reject_options(ctx, tuple(k for k in (*FLAG_PARAMS, "shift") if k not in takes), why)
    for key in options:
        if key in FLAG_PARAMS or key in ("table", "shift"):
            raise click.BadParameter(f"{key}: give it as its own flag (--{key.replace('_', '-')})",
                                     param_hint="--schedule-option")
        if key not in params:
            rest = sorted(k for k in params if k not in (*FLAG_PARAMS, "table"))
            raise click.BadParameter(f"--schedule {name} has no option {key!r}; its options: "
                                     f"{', '.join(rest) or 'none'}", param_hint="--schedule-option")
    if "sigma_max" in takes:
        check_sigma_in_range(model, sigma_max, model_name, "--sigma-max")
    # --rho's default (7) is Karras's exponent: another schedule with a rho (polyexponential, default 1) keeps its
    # own default unless --rho is given.
    rho_given = ctx.get_parameter_source("rho") not in (None, click.core.ParameterSource.DEFAULT)
    kwargs: dict[str, Any] = {k: flags[k] for k in takes if k in FLAG_PARAMS and k in params
                              and (k != "rho" or rho_given or name == "karras")}
    kwargs.update(options)
    record: dict[str, Any] = {"kind": name, **kwargs}
    if name == "karras":  # the CLI's Karras: refuses levels that collapse in float64, naming the flag
        return karras_schedule(steps, sigma_min, sigma_max, rho), record
    in_t = name == "linear_quadratic" and flow_model
    if uses_table:
        table, in_t = _table(model, sigma_min, sigma_max, shift)
        kwargs["table"] = table
        if "shift" in takes:
            record["shift"] = shift
    try:
        sigmas = SCHEDULES.get(name)(steps, **kwargs)
    except ValueError as err:
        raise click.BadParameter(f"--schedule {name}: {err}", param_hint="--schedule-option" if options
                                 else "--schedule") from err
    if in_t:
        sigmas = flow_t_to_sigma(sigmas)
        record["space"] = "flow time t, converted to sigma = t / (1 - t)"
    return sigmas, record
