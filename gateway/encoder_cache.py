"""Serialized encoder graphs, kept between processes (gateway/minilm_onnx.py `EncoderSession`).

Writing the encoder's graph out needs the onnx package, whose import costs a process 1.1-1.5 s
of CPU, more than the rest of building its session. The graph is a pure function of what it
was written from, so a process keeps its serialized bytes (tens of KB: the weights are not in
them, the session takes those from memory) under a name the caller derives from all of that
(`_Encoder.fingerprint`), and a later process on the same filesystem reads them instead.

The folder: `PARLEY_CACHE_DIR`, else `$XDG_CACHE_HOME/parley`, else `~/.cache/parley`, with
`encoders/` under it. Each file starts with the SHA-256 of its graph, checked on every read:
a file cut short or altered is deleted and written again, never handed to onnxruntime. A
folder that cannot be found, made or written costs only what the cache saves.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
HEADER = b"parley-encoder-graph sha256="


def cache_dir() -> Path | None:
    """The folder encoder graphs are kept in, or None where there is no home to put it."""
    base = os.environ.get("PARLEY_CACHE_DIR")
    if not base:
        try:
            root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no passwd entry for this uid
            return None
        base = str(Path(root) / "parley")
    return Path(base) / "encoders"


def cached(key: str, write: Callable[[], bytes], *, fresh: bool = False) -> tuple[bytes, bool]:
    """The graph kept under `key`, or `write()`'s, then kept; and whether it was read from
    the cache. `fresh`: what the cache holds (a graph onnxruntime refused) is dropped first,
    so that it is gone even where the new one cannot be kept."""
    folder = cache_dir()
    if folder is None:
        return write(), False
    path = folder / f"minilm-{key}.onnx"
    if fresh:
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        found = _read(path)
        if found is not None:
            return found, True
    data = write()
    _keep(path, data)
    return data, False


def _head(data: bytes) -> bytes:
    """A kept file's first line: the SHA-256 of the graph after it."""
    return HEADER + hashlib.sha256(data).hexdigest().encode()


def _read(path: Path) -> bytes | None:
    try:
        stored = path.read_bytes()
    except OSError:
        return None
    head, _, data = stored.partition(b"\n")
    if head == _head(data):
        return data
    log.warning("the cached encoder graph %s is damaged; writing it again", path.name)
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _keep(path: Path, data: bytes) -> None:
    """Written whole or not at all (a file of its own, renamed over the name), whoever else
    writes the same graph meanwhile."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=path.name, suffix=".partial", delete=False
        )
    except OSError as exc:
        log.debug("the encoder's graph is not cached: %s", exc)
        return
    try:
        with partial:
            partial.write(_head(data) + b"\n" + data)
        os.replace(partial.name, path)
    except OSError as exc:
        log.debug("the encoder's graph is not cached: %s", exc)
        with contextlib.suppress(OSError):
            os.unlink(partial.name)
