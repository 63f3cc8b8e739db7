"""Fixtures the RB-Modulation tests share: the shipped three-style digits generator (frozen), the thickness
descriptor and the thick reference of C.7."""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.control.descriptors import ThicknessDescriptor
from steerdiff.control.styles import reference_image


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = sd.models.load("digits_styles").eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@pytest.fixture(scope="module")
def psi() -> ThicknessDescriptor:
    return ThicknessDescriptor()


@pytest.fixture(scope="module")
def ref() -> torch.Tensor:
    return reference_image("thick", 0)
