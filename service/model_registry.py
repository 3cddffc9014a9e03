"""The models on disk: every directory under the models dir holding an HF
checkpoint (a config.json) is a model whose id is the directory name."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

# Written beside a checkpoint by the project's own builders (the demo model).
METADATA_FILE = "millm_model.json"


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: pathlib.Path
    created: int
    owned_by: str
    # A content revision recorded at build time; None when nobody recorded one.
    revision: str | None
    # The engine that serves it; every checkpoint directory is a transformers one.
    engine: str = "transformers"


def _entry(path: pathlib.Path) -> ModelEntry:
    meta: dict = {}
    meta_file = path / METADATA_FILE
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            meta = {}
    created = meta.get("created")
    if not isinstance(created, int):
        created = int((path / "config.json").stat().st_mtime)
    return ModelEntry(
        id=path.name,
        path=path,
        created=created,
        owned_by=str(meta.get("owned_by") or "local"),
        revision=str(meta["revision"]) if meta.get("revision") else None,
    )


class ModelRegistry:
    def __init__(self, models_dir: pathlib.Path):
        self.models_dir = models_dir

    def scan(self) -> list[ModelEntry]:
        if not self.models_dir.is_dir():
            return []
        entries = [
            _entry(child)
            for child in self.models_dir.iterdir()
            if child.is_dir()
            and not child.name.startswith(".")
            and (child / "config.json").is_file()
        ]
        return sorted(entries, key=lambda e: e.id)

    def get(self, model_id: str) -> ModelEntry | None:
        # Look the id up among scanned entries rather than joining it onto a
        # path, so a request can never name something outside the models dir.
        return next((e for e in self.scan() if e.id == model_id), None)
