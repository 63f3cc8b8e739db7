"""The shipped pipeline's measurement harness (steerdiff.app.protocols.shapes_pipeline), without the pipeline itself.

Independent truths: the composition algebra (under conditionally independent attributes the composed terms must
add up to one unit of the requested shape and one of the requested colour, nothing else), the band split's
definition, and the classifier on canvas images made from data whose labels are known.
"""

import pytest
import torch

from steerdiff.app.protocols import shapes_pipeline as sp
from steerdiff.data import shapes


@pytest.mark.parametrize("pair", shapes.split_combos("band", "test"))
def test_parallelogram_composes_every_held_out_pair_from_seen_captions(pair):
    terms = sp.parallelogram(pair)
    seen = set(sp.train_pairs())
    assert set(terms) <= seen and pair not in seen and len(terms) == 3
    shape_units = torch.zeros(len(shapes.SHAPES))
    colour_units = torch.zeros(len(shapes.COLOURS))
    for (s, c), w in terms.items():
        shape_units[s] += w
        colour_units[c] += w
    want_s = torch.zeros_like(shape_units)
    want_s[pair[0]] = 1
    want_c = torch.zeros_like(colour_units)
    want_c[pair[1]] = 1
    assert torch.equal(shape_units, want_s) and torch.equal(colour_units, want_c)
    assert sum(terms.values()) == 1.0  # one net term: the composition's null coefficient is 1 - scale


def test_parallelogram_refuses_pairs_it_cannot_build():
    with pytest.raises(ValueError, match="compose"):
        sp.parallelogram((1, 3), seen=[(0, 0)])


def test_judge_reads_canvas_images_of_known_labels():
    pairs = sp.train_pairs()
    images = sp.data_images(pairs, 12, seed=5)
    assert images.shape == (96, 3, 32, 32)
    labels = sp.pair_labels(pairs, 12)
    assert sp.conformity(sp.classify(sp.load_judge(), images), labels) >= 0.95


def test_image_scores_on_data_have_no_excess():
    pairs = sp.train_pairs()
    images = sp.data_images(pairs, 4, seed=0)
    scores = sp.image_scores(images, sp.pair_labels(pairs, 4), sp.load_judge(), images)
    assert scores["saturation_excess"] == 0.0
    assert 0 <= scores["clipped"] < 0.01
    boosted = sp.image_scores((images * 1.5).clamp(-1, 1), sp.pair_labels(pairs, 4), sp.load_judge(), images)
    assert boosted["saturation_excess"] > 0 and boosted["clipped"] > scores["clipped"]
