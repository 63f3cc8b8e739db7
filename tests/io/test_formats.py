"""The checkpoint-format registry's saving side: a format registers its saver with a test of the objects it writes,
``save_object`` (what ``steerdiff.models.save`` calls) dispatches on that test the way loading dispatches on
``config.json``, and a save never destroys something that is not a checkpoint."""

from pathlib import Path

import pytest

from steerdiff.io import (
    FORMATS,
    CheckpointError,
    atomic_dir,
    check_save_target,
    find_format,
    find_marked_format,
    find_saver,
    read_json,
    register_format,
    save_object,
    write_json,
)
from steerdiff.models import MLP, EDMPrecond, load


class Widget:
    """An object only the test format knows how to write."""

    def __init__(self, payload: int):
        self.payload = payload


def _save_widget(obj: Widget, directory) -> Path:
    with atomic_dir(directory) as tmp:  # as savers do: it marks the directory as a checkpoint steerdiff wrote
        write_json(tmp / "config.json", {"class": "TestWidget", "payload": obj.payload})
        (tmp / "model.safetensors").write_bytes(b"")
    return Path(directory)


@pytest.fixture
def widget_format():
    @register_format("test_widget", config_class="TestWidget", save=_save_widget,
                     handles=lambda obj: isinstance(obj, Widget))
    def _load_widget(directory, spec, device="cpu"):
        return Widget(spec["payload"])

    yield
    FORMATS.remove("test_widget")


def test_save_dispatches_on_the_object_and_load_reads_it_back(tmp_path, widget_format):
    assert find_saver(Widget(3)).name == "test_widget"
    assert find_saver(EDMPrecond(MLP(dim=2, hidden=[8]))).name == "model"  # not handled: the default format
    save_object(Widget(7), tmp_path / "w")
    assert read_json(tmp_path / "w" / "config.json")["payload"] == 7
    back = load(tmp_path / "w")  # steerdiff.models.load dispatches to the same format's loader
    assert isinstance(back, Widget) and back.payload == 7


def test_two_formats_claiming_one_object_is_an_error(widget_format):
    @register_format("test_widget_2", config_class="TestWidget2", save=_save_widget,
                     handles=lambda obj: isinstance(obj, Widget))
    def _load(directory, spec, device="cpu"):
        return None

    try:
        with pytest.raises(LookupError, match=r"\['test_widget', 'test_widget_2'\] all claim a Widget"):
            find_saver(Widget(1))
    finally:
        FORMATS.remove("test_widget_2")


def test_save_and_handles_go_together_and_the_default_handles_nothing():
    with pytest.raises(ValueError, match="save= and handles= go together"):
        register_format("test_half", config_class="Half", save=_save_widget)
    with pytest.raises(ValueError, match="save= and handles= go together"):
        register_format("test_half", config_class="Half", handles=lambda obj: True)
    with pytest.raises(ValueError, match="no handles="):
        register_format("test_default", config_class=None, save=_save_widget, handles=lambda obj: True)
    assert "test_half" not in FORMATS and "test_default" not in FORMATS


def test_matches_and_marker_recognise_directories(tmp_path):
    @register_format("test_tagged", config_class=None, matches=lambda spec: "tag" in spec, loadable=False)
    def _load_tagged(directory, spec, device="cpu"):
        raise CheckpointError("tagged")

    @register_format("test_marked", config_class=None, marker="widget.json")
    def _load_marked(directory, spec, device="cpu"):
        return "marked"

    try:
        assert find_format({"class": "EDMPrecond", "tag": 1}).name == "test_tagged"
        assert find_format({"class": "EDMPrecond"}).name == "model"  # neither test: the default
        assert not find_format({"tag": 1}).loadable
        (tmp_path / "b").mkdir()
        assert find_marked_format(tmp_path / "b") is None
        (tmp_path / "b" / "widget.json").write_text("{}")
        assert find_marked_format(tmp_path / "b").name == "test_marked"
        assert load(tmp_path / "b") == "marked"  # a directory without config.json, told by its marker
    finally:
        FORMATS.remove("test_tagged")
        FORMATS.remove("test_marked")


def test_a_save_target_that_holds_no_checkpoint_is_refused_and_kept(tmp_path, widget_format):
    note = tmp_path / "notes.txt"
    note.write_text("keep")
    with pytest.raises(ValueError, match="is an existing file"):
        save_object(Widget(1), note)
    assert note.read_text() == "keep"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "thesis.tex").write_text("keep")
    with pytest.raises(ValueError, match="non-empty directory that holds no checkpoint"):
        save_object(Widget(1), tmp_path / "work")
    assert (tmp_path / "work" / "thesis.tex").read_text() == "keep"
    with pytest.raises(ValueError, match="lies under .*notes.txt, an existing file"):
        save_object(Widget(1), note / "sub")
    with pytest.raises(TypeError, match="directory must be a path"):
        check_save_target(3)
    # New, empty and existing checkpoint directories are fine.
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "new", tmp_path / "empty"):
        assert check_save_target(target) == target
    save_object(Widget(1), tmp_path / "ckpt")
    assert check_save_target(tmp_path / "ckpt") == tmp_path / "ckpt"
