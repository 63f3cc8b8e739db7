"""Fixtures of the tiny random-weight diffusers pipelines (the builders live in ``tests/tiny_pipelines.py``).

The builders are re-exported here (``tests/test_cli_pipeline.py`` loads this file for ``make_sd``).
"""

import pytest

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from tiny_pipelines import (  # noqa: E402, F401
    HIDDEN,
    MAX_TOKENS,
    TinyPipelines,
    make_flux,
    make_sd,
    make_sd3,
    make_sdxl,
    make_t5_encoder,
    make_t5_tokenizer,
    make_text_encoder,
    make_tokenizer,
    make_vae,
    sd_scheduler,
)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip_tokenizer")
    write_clip_tokenizer(d)  # a byte-level vocabulary: any prompt tokenizes
    return d


@pytest.fixture(scope="session")
def tiny(tokenizer_dir):
    return TinyPipelines(tokenizer_dir)
