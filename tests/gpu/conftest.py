"""GPU tests: marked ``gpu`` (deselected by default, as ``slow``: run with ``-m gpu``), skipped without CUDA.

``STEERDIFF_GPU_TEST_DEVICE=cpu`` runs them on the CPU instead (to debug the tests themselves without a GPU): there
:func:`no_host_sync` counts host reads of tensor values (``tests/host_sync.py``) where CUDA would raise from
``torch.cuda.set_sync_debug_mode("error")``.
"""

import contextlib
import os

import pytest
import torch
from host_sync import HostSyncCounter

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from tiny_pipelines import TinyPipelines  # noqa: E402

_DEVICE = os.environ.get("STEERDIFF_GPU_TEST_DEVICE", "cuda")


@pytest.fixture(scope="session")
def device() -> torch.device:
    if _DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available (torch.cuda.is_available() is False)")
    return torch.device(_DEVICE)


@pytest.fixture(autouse=True)
def _needs_the_device(device):
    """Every test here is skipped without CUDA (through ``device``)."""


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip_tokenizer")
    write_clip_tokenizer(d)
    return TinyPipelines(d)


@pytest.fixture
def no_sync(device):
    """``with no_sync(): ...``: :func:`no_host_sync` on the test device."""
    return lambda: no_host_sync(device)


@contextlib.contextmanager
def no_host_sync(device: torch.device):
    """Fail on any device -> host synchronisation inside: CUDA's sync debug mode "error" (the first sync raises),
    or on the CPU the count of host reads of tensor values, asserted to be 0 at the end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return
    with HostSyncCounter() as counter:
        yield
    assert counter.reads == 0, f"{counter.reads} host reads: {dict(counter.by_op)}"
