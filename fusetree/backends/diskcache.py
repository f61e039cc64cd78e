"""The disk cache of compiled PTX: JSON (PTX text, entry name, parameter format) per kernel key in a
per-user directory (mode 0700), written atomically, checksummed, never unpickled."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

from .. import config


def disk_cache_dir() -> str:
    d = os.environ.get("FUSETREE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fusetree"
    )
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def read_disk_cache(d: str, key: str) -> dict | None:
    path = os.path.join(d, f"{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        body = {k: entry[k] for k in ("ptx", "entry", "fmt")}
        if entry.get("sha256") != _digest(body) or entry.get("version") != config.CODEGEN_VERSION:
            raise ValueError("checksum or version mismatch")
        return body
    except FileNotFoundError:
        return None
    except Exception:
        try:  # corrupted or foreign entry: drop it and rebuild
            os.unlink(path)
        except OSError:
            pass
        return None


def write_disk_cache(d: str, key: str, body: dict) -> None:
    entry = dict(body, sha256=_digest(body), version=config.CODEGEN_VERSION)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, os.path.join(d, f"{key}.json"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save_source(spec: Any, source: str) -> str:
    d = os.path.join(disk_cache_dir(), "failed")
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, f"{spec.name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path
