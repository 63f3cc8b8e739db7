"""Count host synchronisations (device -> host reads) on CPU, where ``torch.cuda.set_sync_debug_mode`` cannot run.

Every host read of a tensor value (``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, ``if t:``) goes through the
ATen op ``aten::_local_scalar_dense`` (``bool`` through ``aten::is_nonzero``, which calls it); ``.tolist()`` and
``.cpu()`` / ``.numpy()`` copy instead. On a GPU each of these is a device synchronisation. A dispatch mode sees
every ATen call, so counting those ops on CPU tensors counts the synchronisations the same code would make on CUDA.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

_READS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::allclose"}


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as c: ...`` then ``c.reads`` (value reads) and ``c.by_op`` (a Counter).

    ``c.reads`` counts ``_local_scalar_dense`` (``.item()``, ``float``/``int``/``bool`` of a tensor) and
    ``aten::equal``. Not seen: ``.tolist()`` and ``.numpy()`` of a CPU tensor (they read memory without an ATen
    op), so code that must not sync should also be run on a non-CPU device double (``meta``) where they fail.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter = Counter()
        self.stacks: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in _READS:
            self.by_op[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def reads(self) -> int:
        return self.by_op["aten::_local_scalar_dense"] + self.by_op["aten::equal"]


def count_host_reads(fn, *args, **kwargs) -> tuple[object, int]:
    """Run ``fn(*args, **kwargs)`` and return ``(result, number of host reads)``."""
    with HostSyncCounter() as c:
        out = fn(*args, **kwargs)
    return out, c.reads
