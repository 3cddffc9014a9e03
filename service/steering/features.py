"""What an SAE's features fire on, as recorded beside it (features.json), read
for the management API.

The file is written when an SAE is trained (service/demo_model/features.py
says how); an SAE without one is served all the same, and its features are
then listed as not recorded. The file is read on demand and kept while its
modification time does not change, so a retrained SAE is seen at once.
"""

from __future__ import annotations

import json
import pathlib
import threading
from dataclasses import dataclass

from service.errors import invalid_parameter
from service.steering.sae import SaeInfo

FILE = "features.json"
FORMAT = "millm.sae_features.v1"
MAX_LIMIT = 256
DEFAULT_LIMIT = 32
MAX_QUERY = 64


def check_page(offset: int, limit: int | None) -> int:
    """A page of features (the record's list, a search's matches): the page
    size asked for, checked."""
    if offset < 0:
        raise invalid_parameter("offset", "'offset' must not be negative.")
    limit = DEFAULT_LIMIT if limit is None else limit
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_parameter("limit", f"'limit' must be from 1 to {MAX_LIMIT}.")
    return limit


@dataclass(frozen=True)
class FeaturePage:
    recorded: bool
    total: int  # features matching the query
    tokens_read: int
    features: tuple[dict, ...]


class FeatureRecords:
    """features.json of each SAE, parsed once per version of the file."""

    def __init__(self):
        self._cache: dict[pathlib.Path, tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def _load(self, info: SaeInfo) -> dict | None:
        path = info.path / FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached[0] == mtime:
                return cached[1]
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return None
        with self._lock:
            self._cache[path] = (mtime, document)
        return document

    def document(self, info: SaeInfo) -> dict | None:
        """The parsed record of `info`, or None when it has none."""
        return self._load(info)

    def page(self, info: SaeInfo, query: str, offset: int, limit: int | None) -> FeaturePage:
        """Features of `info` whose top tokens contain `query` (case and
        surrounding spaces ignored; empty: all), from `offset`."""
        if len(query) > MAX_QUERY:
            raise invalid_parameter("query", f"'query' is at most {MAX_QUERY} characters.")
        limit = check_page(offset, limit)
        document = self._load(info)
        if document is None:
            return FeaturePage(False, 0, 0, ())
        features = [f for f in document.get("features", ())
                    if isinstance(f, dict) and 0 <= f.get("index", -1) < info.d_sae]
        needle = query.strip().lower()
        if needle:
            features = [f for f in features
                        if any(needle in str(t.get("token", "")).strip().lower()
                               for t in f.get("top_tokens", ()))]
        return FeaturePage(True, len(features), int(document.get("tokens_read", 0)),
                           tuple(features[offset:offset + limit]))
