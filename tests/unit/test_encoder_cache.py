"""The encoder's graph, kept between processes (gateway/encoder_cache.py): a worker that starts
where one has started before builds its session without importing onnx (1.1-1.5 s of CPU a
start) and gets the same vectors; a kept graph that is damaged, or that onnxruntime refuses,
is written again; no folder to keep it in costs only the saving."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parley.gateway import encoder_cache
from parley.gateway.minilm import MiniLMEmbedder
from parley.gateway.minilm_onnx import EncoderSession

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


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder of the test's own."""
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "encoders"


def _session(minilm: MiniLMEmbedder, *, quantized: bool = True) -> EncoderSession:
    shape = {"layers": minilm._layers, "heads": minilm._heads, "eps": minilm._eps}
    return EncoderSession(minilm._w, **shape, quantized=quantized)


def _states(minilm: MiniLMEmbedder, encoder: EncoderSession) -> np.ndarray:
    return encoder.hidden(*minilm._padded(minilm._tokenizer.encode_batch(TEXTS)))


def _kept(cache: Path) -> list[Path]:
    return sorted(cache.glob("minilm-*.onnx"))


def _written_again(
    minilm: MiniLMEmbedder,
    graph: Path,
    whole: bytes,
    want: np.ndarray,
    caplog: pytest.LogCaptureFixture,
    said: str,
    *,
    quantized: bool = True,
) -> None:
    """The next session, over the spoilt `graph`: it says `said`, writes the graph `whole`
    again and gives the states `want`."""
    with caplog.at_level(logging.WARNING):
        again = _states(minilm, _session(minilm, quantized=quantized))
    assert said in caplog.text
    assert graph.read_bytes() == whole
    assert np.array_equal(again, want)


def test_a_start_after_another_reads_its_graph_and_imports_no_onnx(
    minilm: MiniLMEmbedder, cache: Path
) -> None:
    int8 = MiniLMEmbedder(int8=True)  # this process writes the graph (it has onnx loaded)
    [graph] = _kept(cache)
    written = graph.read_bytes()
    started = subprocess.run(
        [sys.executable, "-c", STARTED, json.dumps(TEXTS)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(started.stdout.splitlines()[-1])
    assert answer["onnx"] is False and answer["precision"] == "int8"
    assert np.allclose(answer["vectors"], int8.embed(TEXTS), atol=1e-6)
    assert _kept(cache) == [graph] and graph.read_bytes() == written


@pytest.mark.parametrize("damage", ["cut short", "one byte changed"])
def test_a_damaged_graph_is_written_again_not_run(
    minilm: MiniLMEmbedder, cache: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    want = _states(minilm, _session(minilm))
    [graph] = _kept(cache)
    whole = graph.read_bytes()
    if damage == "cut short":
        graph.write_bytes(whole[: len(whole) // 2])
    else:  # a constant's bytes, near the end: the file still parses as a graph
        at = len(whole) - 100
        graph.write_bytes(whole[:at] + bytes([whole[at] ^ 0x40]) + whole[at + 1 :])

    _written_again(minilm, graph, whole, want, caplog, "is damaged; writing it again")


def test_a_kept_graph_onnxruntime_refuses_is_written_again(
    minilm: MiniLMEmbedder, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A whole file holding what this onnxruntime cannot load (another version wrote it)."""
    want = _states(minilm, _session(minilm, quantized=False))
    [graph] = _kept(cache)
    whole = graph.read_bytes()
    key = graph.name.removeprefix("minilm-").removesuffix(".onnx")
    encoder_cache.cached(key, lambda: b"not a graph", fresh=True)
    refused = "onnxruntime refused the cached encoder graph"
    _written_again(minilm, graph, whole, want, caplog, refused, quantized=False)


def test_without_a_folder_to_keep_it_every_start_writes_the_graph(
    minilm: MiniLMEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No home (no HOME, no passwd entry), or a file where the folder would go: a session
    all the same, as before there was a cache."""
    for name in ("PARLEY_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert encoder_cache.cache_dir() is None
    want = _states(minilm, _session(minilm, quantized=False))

    blocked = tmp_path / "in-the-way"
    blocked.write_text("a file where the cache's folder would go")
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(blocked))
    assert np.array_equal(_states(minilm, _session(minilm, quantized=False)), want)
    assert blocked.read_text() == "a file where the cache's folder would go"
