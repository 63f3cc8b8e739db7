"""Structured conditions: a pipeline's encoded prompts (docs/methods/pipelines.md, "Text conditions").

Conditions are integer labels (docs/methods/conventions.md, "Conditions"); pipelines add structured conditions, a
mapping of tensors with a batch axis whose null (the empty or negative prompt) the pipeline builds.
:class:`TextCond` is that type. It carries its null counterpart, so that
:func:`steerdiff.core.denoiser.null_cond_like` and :func:`steerdiff.core.guided.cond_and_null` stack a condition
and its null as one doubled batch, as they do for integer labels, and every guider works on a pipeline unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor


class TextCond(Mapping):
    """A frozen mapping ``name -> tensor [B, ...]`` (one row per sample), with its null counterpart.

    Args:
        fields: the tensors, all with the same first dimension ``B >= 1`` (e.g. ``prompt_embeds [B, seq, dim]``,
            ``pooled [B, dim]``, ``time_ids [B, 6]``).
        null: the null condition of the same structure (names and shapes), e.g. the negative or empty prompt's
            encoding, row ``i`` the null of row ``i``; None for a condition that is itself a null.

    Raises:
        TypeError: a field is not a tensor, or ``null`` is not a TextCond.
        ValueError: no fields, fields with different batch sizes, or a ``null`` of another structure.
    """

    is_structured_cond = True  # what steerdiff.core recognises (core cannot import this layer)

    def __init__(self, fields: Mapping[str, Tensor], null: TextCond | None = None):
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError("TextCond needs a non-empty mapping of name -> tensor [B, ...]")
        items = dict(fields)
        for name, value in items.items():
            if not isinstance(name, str) or not isinstance(value, Tensor) or value.ndim < 1:
                got = type(value).__name__ if not isinstance(value, Tensor) else f"a {value.ndim}-d tensor"
                raise TypeError(f"TextCond field {name!r} must be a tensor [B, ...], got {got}")
        sizes = {name: v.shape[0] for name, v in items.items()}
        if len(set(sizes.values())) != 1 or min(sizes.values()) < 1:
            raise ValueError(f"TextCond fields must share one batch size B >= 1, got {sizes}")
        if null is not None:
            if not isinstance(null, TextCond):
                raise TypeError(f"null must be a TextCond, got {type(null).__name__}")
            if null.structure() != {k: tuple(v.shape) for k, v in items.items()}:
                raise ValueError(f"null must have the condition's structure {self._structure_of(items)}, got "
                                 f"{null.structure()}")
        self._fields = items
        self._null = null
        # A read-only view of the fields: ``fields[name]`` is a C-level lookup, where ``self[name]`` runs
        # __getitem__ (a Python call per field per denoiser call: the families' call reads it every step).
        self.fields: Mapping[str, Tensor] = MappingProxyType(items)

    @staticmethod
    def _structure_of(items: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in items.items()}

    def structure(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of the fields."""
        return self._structure_of(self._fields)

    # --- Mapping ----------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __contains__(self, name: object) -> bool:
        # Mapping's default tries __getitem__ and catches the KeyError: an exception per denoiser call
        # (the pipeline's per-step "inpaint_channels" test).
        return name in self._fields

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"TextCond({self.structure()}, null={'yes' if self._null is not None else 'no'})"

    # --- rows -------------------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """The number of rows ``B``."""
        return next(iter(self._fields.values())).shape[0]

    @property
    def null(self) -> TextCond | None:
        """The null counterpart (None when this condition is a null itself)."""
        return self._null

    def null_like(self) -> TextCond:
        """The null condition of the same rows (what guiders evaluate as the unconditional branch)."""
        if self._null is None:
            raise ValueError("this TextCond has no null counterpart (it is a null, or was built without one): build "
                             "conditions with Pipeline.encode, which encodes the negative or empty prompt")
        return self._null

    def _map(self, fn) -> TextCond:
        null = None if self._null is None else self._null._map(fn)
        return TextCond({k: fn(v) for k, v in self._fields.items()}, null)

    def index(self, rows: Tensor | Sequence[int]) -> TextCond:
        """The rows ``rows`` (an integer tensor or list, repeats allowed) of the condition and of its null."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        if rows.ndim != 1:
            raise ValueError(f"rows must be a 1-d integer tensor, got shape {tuple(rows.shape)}")
        b = self.batch_size
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= b):
            raise ValueError(f"rows must lie in [0, {b}), got {rows.tolist()}")
        return self._map(lambda v: v[rows.to(v.device)])

    def gather(self, rows: Tensor) -> TextCond:
        """The rows ``rows`` (an integer tensor, on any device) gathered on each field's device, without the range
        check of :meth:`index` (no host read: the per-step path of a guider's labels on an accelerator)."""
        return self._map(lambda v: v.index_select(0, rows.to(v.device)))

    def repeat(self, n: int) -> TextCond:
        """The ``B`` rows tiled ``n`` times (row ``j`` is row ``j mod B``), as ``x.repeat(n, ...)`` tiles samples."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return self._map(lambda v: v.repeat((n,) + (1,) * (v.ndim - 1)))

    def repeat_interleave(self, n: int) -> TextCond:
        """Each row repeated ``n`` times in place (``n`` samples per prompt: diffusers' ``num_images_per_prompt``)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return self._map(lambda v: v.repeat_interleave(n, dim=0))

    def to(self, *args, keep: Collection[str] = (), **kwargs) -> TextCond:
        """Every tensor moved / cast as ``Tensor.to(*args, **kwargs)`` (integer fields keep their dtype on a float
        cast, and so do the fields named in ``keep``: moved only, e.g. FLUX's float32 ``guidance``)."""
        def move(name: str, v: Tensor) -> Tensor:
            if not v.is_floating_point() or name in keep:
                return v.to(*[a for a in args if not isinstance(a, torch.dtype)],
                            **{k: a for k, a in kwargs.items() if k != "dtype"})
            return v.to(*args, **kwargs)
        null = None if self._null is None else self._null.to(*args, keep=keep, **kwargs)
        return TextCond({k: move(k, v) for k, v in self._fields.items()}, null)

    def is_on(self, device: torch.device | str, dtype: torch.dtype, keep: Collection[str] = ()) -> bool:
        """Whether every tensor (and the null's) is on ``device`` and every floating-point one not named in
        ``keep`` has ``dtype``."""
        key = (device, dtype, tuple(keep))
        cached = self.__dict__.get("_on")  # the last answer: asked once per denoiser call, with the same arguments
        if cached is not None and cached[0] == key:
            return cached[1]
        device = torch.device(device)
        ok = all(v.device == device and (not v.is_floating_point() or k in keep or v.dtype == dtype)
                 for k, v in self._fields.items())
        ok = ok and (self._null is None or self._null.is_on(device, dtype, keep))
        self._on = (key, ok)  # the tensors of a TextCond are fixed, so is where they are
        return ok

    @classmethod
    def cat(cls, conds: Sequence[TextCond]) -> TextCond:
        """Rows of several conditions of one structure stacked in order (their nulls likewise)."""
        conds = list(conds)
        if len(conds) == 2 and isinstance(conds[0], TextCond) and conds[1] is conds[0].null:
            # A guider's doubled batch [cond, null], built every step: computed once per condition.
            cached = conds[0].__dict__.get("_with_null")
            if cached is None:
                cached = conds[0]._with_null = cls._cat(conds)
            return cached
        return cls._cat(conds)

    @classmethod
    def _cat(cls, conds: list) -> TextCond:
        if not conds or not all(isinstance(c, TextCond) for c in conds):
            raise TypeError("TextCond.cat needs a non-empty list of TextCond")
        names = list(conds[0])
        for c in conds[1:]:
            if list(c) != names or any(c[k].shape[1:] != conds[0][k].shape[1:] for k in names):
                raise ValueError(f"TextCond.cat needs conditions of one structure, got {conds[0].structure()} and "
                                 f"{c.structure()}")
        nulls = [c.null for c in conds]
        null = cls.cat(nulls) if all(n is not None for n in nulls) else None
        return cls({k: torch.cat([c[k] for c in conds]) for k in names}, null)
