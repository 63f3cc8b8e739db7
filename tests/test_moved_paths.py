"""Library modules that moved in issue 34 keep their old import path for one release: it re-exports the same objects
and warns (DeprecationWarning) on import, or on access of a moved name where the old module lives on; the library
itself imports none of them, so only users of the old paths are warned."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

# old path -> (new module, names that must be the same objects)
MOVED = {
    "steerdiff.constrain.icnn": ("steerdiff.models.icnn", ("ICNNMap", "ConvICNNMap", "NEGATIVE_SLOPE")),
    "steerdiff.covariance.heads": ("steerdiff.models.ocm_heads", ("OCMHead", "InputHead", "TrunkHead", "PARAMS",
                                                                 "output_to_cov", "unet_trunk_head")),
    "steerdiff.control.style_dit": ("steerdiff.models.style_dit", ("StyleTokenDiT", "StyleTokenDenoiser",
                                                                  "no_style")),
    "steerdiff.temporal.sequence": ("steerdiff.models.sequence_attention", ("blocked_attention", "band_bias",
                                                                           "LOCAL_ATTENTION_FROM")),
    "steerdiff.io.registry": ("steerdiff.io.plugins", ("Registry",)),
}
# names that moved to a second new home
ALSO = {
    "steerdiff.covariance.heads": ("steerdiff.covariance.target", ("ocm_target", "hutchinson_diag")),
    "steerdiff.control.style_dit": ("steerdiff.control.styles", ("style_refs",)),
    "steerdiff.temporal.sequence": ("steerdiff.temporal", ("SequenceCond", "SequencePrecond", "SequenceTransformer",
                                                           "generate_sequence", "generate_autoregressive",
                                                           "sequence_model")),
}


def _import_fresh(name: str):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_path_warns_and_gives_the_same_objects(old):
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.") + " is deprecated"):
        module = _import_fresh(old)
    for new, names in (MOVED[old], ALSO.get(old, (None, ()))):
        if new is None:
            continue
        target = importlib.import_module(new)
        for n in names:
            assert getattr(module, n) is getattr(target, n), (old, n)


def test_the_library_imports_no_shim_and_warns_about_nothing():
    """Only users of the old paths are warned: a fresh ``import steerdiff`` (every package, the app too) raises no
    DeprecationWarning and loads none of the deprecated modules."""
    code = ("import sys, warnings; warnings.simplefilter('error', DeprecationWarning); import steerdiff, "
            "steerdiff.app.cli, steerdiff.app.demo, steerdiff.app.protocols, steerdiff.app.recipes; "
            f"print([m for m in {sorted(MOVED)!r} if m in sys.modules])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("name", ["LMS_MAX_ORDER", "lms_coefficients", "sample_lms"])
def test_lms_names_on_the_ancestral_module_warn_and_are_the_lms_module_s(name):
    """``core/ancestral.py`` keeps the Euler ancestral sampler; LMS moved to ``core/lms.py``."""
    import steerdiff.core.ancestral as ancestral
    import steerdiff.core.lms as lms

    with pytest.warns(DeprecationWarning, match=f"steerdiff.core.ancestral.{name} is deprecated"):
        got = getattr(ancestral, name)
    assert got is getattr(lms, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ancestral.nope  # noqa: B018 - an unknown name is still an AttributeError


def test_the_samplers_are_registered_from_their_modules():
    from steerdiff.core import SAMPLERS
    from steerdiff.core.ancestral import sample_euler_ancestral
    from steerdiff.core.lms import sample_lms

    assert SAMPLERS.get("lms").fn is sample_lms and SAMPLERS.get("euler_ancestral").fn is sample_euler_ancestral


@pytest.mark.parametrize("name,new", [("parse", "compose_expr"), ("Lit", "compose_expr"), ("satisfies", "compose_expr"),
                                      ("normalize_attributes", "compose_expr"), ("score_terms", "compose_expr"),
                                      ("compose_oracle", "compose_oracle"), ("load_composable", "composable"),
                                      ("ATTRIBUTES_FILE", "composable")])
def test_names_split_out_of_compose_warn_and_are_the_new_modules(name, new):
    """``guidance/compose.py`` keeps the guider; the expression language, the oracle and the loader moved out."""
    import steerdiff.guidance.compose as compose

    with pytest.warns(DeprecationWarning, match=f"steerdiff.guidance.compose.{name} is deprecated"):
        got = getattr(compose, name)
    assert got is getattr(importlib.import_module(f"steerdiff.guidance.{new}"), name)
    assert compose.Compose is sd_guidance().Compose  # the guider itself did not move: no warning


def sd_guidance():
    return importlib.import_module("steerdiff.guidance")
