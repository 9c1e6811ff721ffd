"""The encoder's graph, kept between processes (gateway/minilm_onnx.py `graph_bytes`): a worker
that starts where one has started before builds its session without importing onnx (1.1-1.5 s
of CPU a start), and gets the same vectors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parley.gateway.minilm import MiniLMEmbedder
from parley.gateway.minilm_onnx import EncoderSession, cache_dir

TEXTS = ["Where is my order?", "I'd like to return the hiking boots I bought in May."]

# A new process: the embedder as a worker builds it, then what it imported and embedded.
STARTED = """
import json, sys
from parley.gateway.minilm import MiniLMEmbedder
embedder = MiniLMEmbedder(int8=True)
vectors = embedder.embed(json.loads(sys.argv[1]))
print(json.dumps({"onnx": "onnx" in sys.modules, "precision": embedder.precision,
                  "vectors": vectors}))
"""


def _start(cache: Path) -> dict[str, object]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", STARTED, json.dumps(TEXTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def _graphs(cache: Path) -> list[Path]:
    return sorted((cache / "parley" / "encoders").glob("minilm-*.onnx"))


def test_a_second_start_reads_the_graph_the_first_wrote_and_imports_no_onnx(
    tmp_path: Path,
) -> None:
    first = _start(tmp_path)
    assert first["onnx"] is True and first["precision"] == "int8"
    [graph] = _graphs(tmp_path)
    written = graph.read_bytes()

    second = _start(tmp_path)
    assert second["onnx"] is False and second["precision"] == "int8"
    assert second["vectors"] == first["vectors"]
    assert _graphs(tmp_path) == [graph] and graph.read_bytes() == written


def test_a_graph_cut_short_in_the_cache_is_written_again(
    minilm: MiniLMEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "parley" / "encoders"
    shape = {"layers": minilm._layers, "heads": minilm._heads, "eps": minilm._eps}
    EncoderSession(minilm._w, **shape, quantized=True)
    [graph] = _graphs(tmp_path)
    whole = graph.read_bytes()
    graph.write_bytes(whole[: len(whole) // 2])

    again = EncoderSession(minilm._w, **shape, quantized=True)
    assert graph.read_bytes() == whole
    fresh = MiniLMEmbedder(int8=True)
    ids, types, mask = fresh._padded(fresh._tokenizer.encode_batch(TEXTS))
    assert (again.hidden(ids, types, mask) == fresh._session.hidden(ids, types, mask)).all()


def test_a_cache_that_cannot_be_written_still_gives_a_session(
    minilm: MiniLMEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only home (a locked-down container): every start writes the graph out again,
    as before the cache, and embeds."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache's folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    shape = {"layers": minilm._layers, "heads": minilm._heads, "eps": minilm._eps}
    encoder = EncoderSession(minilm._w, **shape, quantized=False)
    ids, types, mask = minilm._padded(minilm._tokenizer.encode_batch(TEXTS))
    assert encoder.hidden(ids, types, mask).shape[:2] == ids.shape
