"""API keys: loading, constant-time identification, scopes and fingerprints.

Used by the engine's gRPC interceptor and by the REST bridge's middleware, so
both check a key the same way. Keys are configured as JSON, from the file
named by MILLM_API_KEYS_FILE or inline in MILLM_API_KEYS:

    {"keys": [
      {"name": "svc-search", "scopes": ["inference"], "sha256": "<hex of sha256(key)>",
       "requests_per_minute": 600},
      {"name": "ops", "scopes": ["admin"], "key": "<the key itself>"}
    ]}

"sha256" keeps only a digest at rest (`python -m common.api_keys hash KEY`
prints it); "key" is hashed on load. `admin` includes `inference`. Keys are
never logged: logs carry `fingerprint()`, the first 8 hex digits of the
digest, which is stable and useless for guessing the key.

Nothing here imports torch: the bridge imports this file.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import pathlib
import sys
from dataclasses import dataclass

INFERENCE, ADMIN = "inference", "admin"
SCOPES = frozenset({INFERENCE, ADMIN})


class KeyConfigError(ValueError):
    pass


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def fingerprint(key_digest: bytes) -> str:
    return "key-" + key_digest.hex()[:8]


@dataclass(frozen=True)
class ApiKey:
    name: str
    sha256: bytes
    scopes: frozenset[str]
    requests_per_minute: int | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.sha256)


class KeyRing:
    def __init__(self, keys: list[ApiKey]):
        if not keys:
            raise KeyConfigError("the key configuration lists no keys")
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise KeyConfigError("key names must be unique")
        self.keys = tuple(keys)

    def identify(self, presented: str | None) -> ApiKey | None:
        """The key `presented` is, or None. Every stored digest is compared, in
        constant time each, so timing says nothing about which one matched."""
        if not presented:
            return None
        wanted = digest(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.sha256, wanted):
                found = key
        return found


def _parse(text: str, source: str) -> KeyRing:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KeyConfigError(f"{source} is not JSON: {exc}") from None
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise KeyConfigError(f'{source} must be {{"keys": [...]}}')
    keys = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise KeyConfigError(f"{source}: keys[{i}] needs a name")
        scopes = entry.get("scopes")
        if not isinstance(scopes, list) or not scopes or not set(scopes) <= SCOPES:
            raise KeyConfigError(f"{source}: keys[{i}].scopes must list inference and/or admin")
        if isinstance(entry.get("sha256"), str):
            try:
                sha = bytes.fromhex(entry["sha256"])
            except ValueError:
                raise KeyConfigError(f"{source}: keys[{i}].sha256 is not hex") from None
            if len(sha) != 32:
                raise KeyConfigError(f"{source}: keys[{i}].sha256 must be 64 hex digits")
        elif isinstance(entry.get("key"), str) and len(entry["key"]) >= 16:
            sha = digest(entry["key"])
        else:
            raise KeyConfigError(f"{source}: keys[{i}] needs sha256, or a key of 16+ characters")
        rpm = entry.get("requests_per_minute")
        if rpm is not None and (not isinstance(rpm, int) or isinstance(rpm, bool) or rpm < 1):
            raise KeyConfigError(f"{source}: keys[{i}].requests_per_minute must be >= 1")
        keys.append(ApiKey(entry["name"], sha, frozenset(scopes), rpm))
    return KeyRing(keys)


def from_env(env=None) -> KeyRing | None:
    """The configured keys, or None when none are configured."""
    env = os.environ if env is None else env
    path = env.get("MILLM_API_KEYS_FILE")
    if path:
        try:
            text = pathlib.Path(path).read_text()
        except OSError as exc:
            raise KeyConfigError(f"cannot read MILLM_API_KEYS_FILE: {exc}") from None
        return _parse(text, "MILLM_API_KEYS_FILE")
    inline = env.get("MILLM_API_KEYS")
    if inline:
        return _parse(inline, "MILLM_API_KEYS")
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(keys: KeyRing | None, host: str, env=None) -> str | None:
    """Refuse to listen beyond loopback without keys, unless told to; returns a
    warning to log when running unauthenticated on purpose."""
    env = os.environ if env is None else env
    if keys is not None or is_loopback(host):
        return None
    if env.get("MILLM_ALLOW_UNAUTHENTICATED") == "1":
        return (f"listening on {host} with no API keys (MILLM_ALLOW_UNAUTHENTICATED=1): "
                "anyone who can reach it can use it")
    raise KeyConfigError(f"refusing to listen on {host} without API keys: configure "
                         "MILLM_API_KEYS_FILE, listen on a loopback address, or set "
                         "MILLM_ALLOW_UNAUTHENTICATED=1")


def load_for_listener(host: str, log) -> KeyRing | None:
    """The configured keys, once it is safe to listen on `host` with them (a
    process's start: raises KeyConfigError to refuse, logs the warning when
    running unauthenticated on purpose)."""
    keys = from_env()
    warning = check_exposure(keys, host)
    if warning:
        log.warning("%s", warning)
    return keys


def bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "hash":
        print(digest(sys.argv[2]).hex())
        raise SystemExit(0)
    print("usage: python -m common.api_keys hash KEY", file=sys.stderr)
    raise SystemExit(2)
