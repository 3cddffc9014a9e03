"""What the registry finds in a models dir, and how names resolve: on copies of
the demo model's files, arranged the ways people drop GGUF files in."""

from __future__ import annotations

import os
import shutil

import pytest

from service.errors import EngineError
from service.models.registry import ModelRegistry
from tests import harness


@pytest.fixture
def models(tmp_path):
    source = harness.models_dir()
    f32 = source / "millm-tiny-gguf" / "millm-tiny-gguf-F32.gguf"
    q8 = source / "millm-tiny-gguf" / "millm-tiny-gguf-Q8_0.gguf"
    os.symlink(source / "millm-tiny", tmp_path / "millm-tiny")
    shutil.copy(q8, tmp_path / "solo-Q8_0.gguf")  # a lone file: its repository is its name
    shutil.copy(f32, tmp_path / "untagged.gguf")  # no tag in the name: the metadata says F32
    (tmp_path / "twins").mkdir()  # one quantization twice: one id
    shutil.copy(f32, tmp_path / "twins" / "a.gguf")
    shutil.copy(f32, tmp_path / "twins" / "b.gguf")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "damaged-Q4_0.gguf").write_bytes(b"GGUF but not really")
    (tmp_path / ".hidden").mkdir()
    shutil.copy(q8, tmp_path / ".hidden" / "x.gguf")
    return ModelRegistry(tmp_path)


def test_every_arrangement_gets_an_id(models):
    found = {e.id: e for e in models.scan()}
    assert set(found) == {"millm-tiny", "solo:Q8_0", "untagged:F32", "twins:F32",
                          "damaged:Q4_0"}
    assert found["millm-tiny"].engine == "transformers"
    assert (found["solo:Q8_0"].repo, found["solo:Q8_0"].quantization) == ("solo", "Q8_0")
    assert found["twins:F32"].path.name == "a.gguf"  # the first by name
    # A damaged file is listed (its tag from its name); loading it is what fails.
    assert found["damaged:Q4_0"].unsupported == ""


def test_names_resolve_to_one_model(models):
    assert models.resolve("solo").id == "solo:Q8_0"  # one quantization: the bare name works
    assert models.resolve("untagged:F32").path.name == "untagged.gguf"
    with pytest.raises(EngineError) as caught:
        models.resolve("../millm-tiny")
    assert caught.value.code == "model_not_found"


def test_a_bare_name_with_several_quantizations_is_ambiguous():
    source = harness.models_dir()
    registry = ModelRegistry(source)
    with pytest.raises(EngineError) as caught:
        registry.resolve("millm-tiny-gguf")
    error = caught.value
    assert (error.code, error.param) == ("AMBIGUOUS_MODEL_NAME", "model")
    assert "'millm-tiny-gguf:F32'" in error.message and "'millm-tiny-gguf:Q8_0'" in error.message
    assert error.to_status().code.name == "INVALID_ARGUMENT"
