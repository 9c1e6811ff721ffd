"""MiniLM's encoder as an ONNX graph built in memory, run by onnxruntime.

The NumPy pass of gateway/minilm.py is the reference; this is the same BERT encoder over the
same weights (the tensors the embedder has already loaded), described node by node and
written out with `onnx.helper`: no exported file, no torch, no network. The written graph
(weights apart: those go to the session from memory) is kept in a cache folder, named by
what it was written from (gateway/encoder_cache.py), so a process that starts where one has
run before skips the onnx package's import, which cost more CPU than all the rest of a
session's build.
Why onnxruntime: the encoder's products are a few rows tall (one message is a dozen tokens),
where NumPy's BLAS is slow; onnxruntime's kernels did one (14 x 384) @ (384 x 1536) product
in 0.18 ms against NumPy's 1.3-2.4 ms. A short message's vector takes 2 to 2.8 times less
CPU, a batch of LoCoMo's messages 1.6 times less (docs/benchmarks-results.md).

The graph takes token ids, token types and the padding mask, batch and length both dynamic,
and gives the last layer's states; pooling and normalisation stay with the caller, as for the
NumPy pass. Optional: without onnxruntime, or without onnx where the graph is not cached yet,
`EncoderSession` raises ImportError and the embedder runs its NumPy pass.

`quantized=True` builds the int8 encoder (issue 45: the encoder was a third of a worker's
CPU on plain turns): the 36 linear layers multiply 8-bit integers; embeddings, attention's
own products, softmax, GELU and LayerNorm stay float32. Built here rather than by
onnxruntime's `quantize_dynamic`, which writes its model to a file, took 2.0 s of CPU and
270 MB more resident to give a session (this graph: 0.19 s and 20 MB; float32's 0.18 s and
130 MB), and quantizes each layer's input with one scale for the whole batch
(DynamicQuantizeLinear): built that way here, a text's vector moved with the texts beside
it, to cosine 0.949 of the same text alone. Here:
- Weights: one scale per output column (per channel), symmetric, -127..127, quantized once
  at load from the float32 tensors in memory.
- Activations: quantized when the layer runs, one scale per token (symmetric, stored as
  uint8 around 128), with the standard operators (ReduceMax, QuantizeLinear,
  MatMulInteger): a token's integers depend on that token alone, so a text's vector does
  not depend on its batch or its padding.
- Integer sums exact on every CPU. On x86 CPUs with VNNI (AVX512-VNNI or AVX-VNNI) the
  products take int8 weights as they are. Without VNNI, onnxruntime's AVX2 kernels for
  uint8 x int8 add pairs of products in 16 bits, which saturate (255 * 127 * 2 > 32767):
  on LoCoMo, with the same weights, conv-26 lost 2 of 149 questions on such a CPU. There
  the weights are stored as uint8 around 128 instead, whose kernel widens to 16 bits before
  it multiplies (exact): 13% more CPU per text than the saturating kernel, 20% less than
  float32, and the vectors a VNNI machine gives (`exact_signed_products`). Weights of 7
  bits would also rule saturation out, at a cost in recall (conv-49 77.1% -> 76.5%).
"""

from __future__ import annotations

import hashlib
import logging
import platform
from functools import cache
from pathlib import Path
from typing import Any

from parley.gateway import encoder_cache

log = logging.getLogger(__name__)
# This module's code as this process imported it: what writes the graph (a file changed under
# a running process must not name that process's graph).
_CODE = Path(__file__).read_bytes()

# Opset 17 brings LayerNormalization as one operator; IR version 8 is its pair, fixed so that
# the onnxruntime installed loads the graph whatever IR version the onnx package defaults to.
OPSET = 17
IR_VERSION = 8
# The int8 encoder's levels each side of 0: its weights' (int8) and its activations' (stored
# as uint8 with zero at MIDDLE).
WEIGHT_LEVELS = 127
ACTIVATION_LEVELS = 127
MIDDLE = 128
# ONNX's element type numbers (TensorProto.DataType), fixed by the format: a graph is
# described with them before the onnx package is imported, if it is at all.
ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "int64": 7}
FLOAT = ONNX_TYPES["float32"]


X86 = {"x86_64", "amd64", "i386", "i686", "x86"}
VNNI = {"avx512_vnni", "avx_vnni"}


@cache
def exact_signed_products() -> bool:
    """Whether onnxruntime sums uint8 x int8 products exactly on this CPU: everywhere but
    on x86 without VNNI (module docstring). An x86 CPU whose flags cannot be read counts as
    one without."""
    if platform.machine().lower() not in X86:
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return not VNNI.isdisjoint(flags)


def quantize_columns(weight: Any) -> tuple[Any, Any]:
    """A float32 (in, out) matrix as int8 levels in -WEIGHT_LEVELS..WEIGHT_LEVELS and one
    float32 scale per output column: weight ~ levels * scale."""
    import numpy as np

    peak = np.abs(weight).max(axis=0)
    scale = np.where(peak > 0, peak / WEIGHT_LEVELS, 1.0).astype(np.float32)
    levels = np.clip(np.rint(weight / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return levels, scale


class _Encoder:
    """The graph being described: its nodes, its initializers (small constants stored in it,
    and the weights declared as external data, handed to the session from memory), and fresh
    names for intermediate values. Plain data and NumPy arrays only: `written` writes it out
    with the onnx package, which `EncoderSession` skips when the graph it describes is in
    the cache (gateway/encoder_cache.py)."""

    def __init__(
        self,
        weights: dict[str, Any],
        *,
        heads: int,
        eps: float,
        quantized: bool = False,
        signed_weights: bool = True,
    ) -> None:
        import numpy as np

        self.quantized = quantized
        self.signed_weights = signed_weights
        self.nodes: list[tuple[str, list[str], str, dict[str, Any]]] = []
        self.constants: list[tuple[str, Any]] = []
        self.arrays: dict[str, Any] = {}
        self._weights = weights
        self._eps = eps
        self._count = 0
        self.width = int(weights["embeddings.word_embeddings.weight"].shape[1])
        size = self.width // heads
        # A 0 in a Reshape's shape copies that dimension of its input (batch, tokens).
        self.to_heads = self.const("to_heads", np.array([0, 0, heads, size], dtype=np.int64))
        self.to_width = self.const("to_width", np.array([0, 0, self.width], dtype=np.int64))
        self.scale = self.const("scale", np.array(np.sqrt(size), dtype=np.float32))
        self.one = self.const("one", np.array(1.0, dtype=np.float32))
        self.half = self.const("half", np.array(0.5, dtype=np.float32))
        self.root2 = self.const("root2", np.array(np.sqrt(2.0), dtype=np.float32))
        if quantized:
            self.batch_tokens = self.op("Shape", "input_ids")
            self.middle = self.const("middle", np.array(MIDDLE, dtype=np.uint8))
            self.levels = self.const("levels", np.array(ACTIVATION_LEVELS, dtype=np.float32))
            self.tiny = self.const("tiny", np.array(1e-12, dtype=np.float32))
            self.column = self.const("column", np.array([1], dtype=np.int64))
            self._rows: dict[str, tuple[str, str]] = {}

    def const(self, name: str, array: Any) -> str:
        """A small constant, stored in the graph (shapes, scalars)."""
        self.constants.append((name, array))
        return name

    def weight(self, name: str, *, transposed: bool = False) -> str:
        """A tensor of the checkpoint, declared as external data: copying 90 MB into protobuf
        messages took 1.4 s of CPU and as much memory again. A linear layer's weight is
        stored (out, in); MatMul wants it `transposed`, (in, out)."""
        import numpy as np

        array = np.asarray(self._weights[name], dtype=np.float32)
        return self.external(name, np.ascontiguousarray(array.T if transposed else array))

    def external(self, name: str, array: Any) -> str:
        """`array` (float32, int8 or uint8) as an initializer the session takes from memory."""
        self.arrays[name] = array
        return name

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append((kind, list(inputs), out, attributes))
        return out

    def fingerprint(self) -> str:
        """What the written-out graph depends on, hashed: this module's code (which writes
        it), its nodes, its constants' values, and its external weights' names, types and
        shapes (not their values: the session takes those from memory)."""
        digest = hashlib.sha256(_CODE)
        digest.update(f"{self.width}".encode())
        for node in self.nodes:
            digest.update(repr(node).encode())
        for name, array in self.constants:
            digest.update(f"{name} {array.dtype} {array.shape}".encode())
            digest.update(array.tobytes())
        for name, array in self.arrays.items():
            digest.update(f"{name} {array.dtype} {array.shape}".encode())
        return digest.hexdigest()

    def dense(self, x: str, name: str) -> str:
        if self.quantized:
            return self.int8_dense(x, name)
        product = self.op("MatMul", x, self.weight(name + ".weight", transposed=True))
        return self.op("Add", product, self.weight(name + ".bias"))

    def int8_dense(self, x: str, name: str) -> str:
        """A linear layer as an integer product: (batch, tokens, in) -> (batch, tokens, out),
        float32 on both sides."""
        import numpy as np

        weight = np.asarray(self._weights[name + ".weight"], dtype=np.float32)
        levels, scale = quantize_columns(np.ascontiguousarray(weight.T))
        rows, row_scale = self.quantized_rows(x, int(weight.shape[1]))
        stored, zero_points = levels, [self.middle]
        if not self.signed_weights:  # the same levels as uint8 around MIDDLE: exact sums
            stored = (levels.astype(np.int16) + MIDDLE).astype(np.uint8)
            zero_points.append(self.middle)
        weights = self.external(name + ".int8", stored)
        product = self.op("MatMulInteger", rows, weights, *zero_points)
        product = self.op("Cast", product, to=FLOAT)
        columns = self.external(name + ".scale", scale)
        y = self.op("Mul", self.op("Mul", product, columns), row_scale)
        y = self.op("Add", y, self.weight(name + ".bias"))
        width = self.const(f"{name}.width", np.array([levels.shape[1]], dtype=np.int64))
        return self.op("Reshape", y, self.op("Concat", self.batch_tokens, width, axis=0))

    def quantized_rows(self, x: str, width: int) -> tuple[str, str]:
        """`x` as (batch * tokens, width) uint8 rows, each with its own scale (returned as a
        column, (rows, 1)). Made once per input: query, key and value share theirs."""
        import numpy as np

        if x not in self._rows:
            flat = self.op("Reshape", x, self.const(f"rows_{x}", np.array([-1, width], np.int64)))
            peak = self.op("ReduceMax", self.op("Abs", flat), axes=[1], keepdims=0)
            scale = self.op("Div", self.op("Max", peak, self.tiny), self.levels)
            zero = self.op("Expand", self.middle, self.op("Shape", scale))
            rows = self.op("QuantizeLinear", flat, scale, zero, axis=0)
            self._rows[x] = rows, self.op("Unsqueeze", scale, self.column)
        return self._rows[x]

    def norm(self, x: str, name: str) -> str:
        scale, shift = self.weight(name + ".weight"), self.weight(name + ".bias")
        return self.op("LayerNormalization", x, scale, shift, axis=-1, epsilon=self._eps)

    def embeddings(self) -> str:
        """Word + position (the first `tokens` rows) + token type, then LayerNorm."""
        import numpy as np

        tokens = self.op("Shape", "input_ids", start=1, end=2)
        zero = self.const("zero", np.array([0], dtype=np.int64))
        positions = self.op(
            "Slice", self.weight("embeddings.position_embeddings.weight"), zero, tokens, zero
        )
        words = self.op("Gather", self.weight("embeddings.word_embeddings.weight"), "input_ids")
        types = self.op(
            "Gather", self.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"
        )
        return self.norm(
            self.op("Add", self.op("Add", words, positions), types), "embeddings.LayerNorm"
        )

    def padding(self) -> str:
        """The additive mask, (batch, 1, 1, tokens): 0 for a token, -1e9 for padding."""
        import numpy as np

        masked = self.const("masked", np.array(-1e9, dtype=np.float32))
        axes = self.const("between_axes", np.array([1, 2], dtype=np.int64))
        return self.op(
            "Unsqueeze", self.op("Mul", self.op("Sub", self.one, "attention_mask"), masked), axes
        )

    def layer(self, h: str, bias: str, p: str) -> str:
        """One transformer layer: self-attention, then the feed-forward block, each with its
        residual LayerNorm."""

        def heads(name: str, perm: list[int]) -> str:  # (batch, tokens, width) -> per head
            return self.op(
                "Transpose", self.op("Reshape", self.dense(h, name), self.to_heads), perm=perm
            )

        q = heads(p + "attention.self.query", [0, 2, 1, 3])  # (batch, heads, tokens, size)
        k = heads(p + "attention.self.key", [0, 2, 3, 1])  # (batch, heads, size, tokens)
        v = heads(p + "attention.self.value", [0, 2, 1, 3])
        scores = self.op("Add", self.op("Div", self.op("MatMul", q, k), self.scale), bias)
        context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)
        context = self.op(
            "Reshape", self.op("Transpose", context, perm=[0, 2, 1, 3]), self.to_width
        )
        attended = self.op("Add", h, self.dense(context, p + "attention.output.dense"))
        h = self.norm(attended, p + "attention.output.LayerNorm")
        inner = self.dense(h, p + "intermediate.dense")
        # GELU with the exact erf, as the model was trained: x * (1 + erf(x / sqrt 2)) / 2.
        erf = self.op("Erf", self.op("Div", inner, self.root2))
        inner = self.op("Mul", self.op("Mul", inner, self.op("Add", erf, self.one)), self.half)
        fed = self.op("Add", h, self.dense(inner, p + "output.dense"))
        return self.norm(fed, p + "output.LayerNorm")


# The encoder's inputs and output: (name, ONNX element type, dimensions).
ENCODER_INPUTS = (
    ("input_ids", ONNX_TYPES["int64"], ["batch", "tokens"]),
    ("token_type_ids", ONNX_TYPES["int64"], ["batch", "tokens"]),
    ("attention_mask", FLOAT, ["batch", "tokens"]),
)


def describe_encoder(
    weights: dict[str, Any], *, layers: int, heads: int, eps: float, quantized: bool = False
) -> _Encoder:
    """The BERT encoder over `weights` (named as gateway/minilm.py reads them), described:
    inputs `ENCODER_INPUTS` (the mask 1 for a token, 0 for padding), output `hidden` (batch
    x tokens x width). `quantized`: the int8 encoder (module docstring), its weights int8, or
    uint8 around MIDDLE where this CPU's uint8 x int8 sums may saturate
    (`exact_signed_products`)."""
    signed = exact_signed_products()
    g = _Encoder(weights, heads=heads, eps=eps, quantized=quantized, signed_weights=signed)
    h, bias = g.embeddings(), g.padding()
    for layer in range(layers):
        h = g.layer(h, bias, f"encoder.layer.{layer}.")
    g.nodes.append(("Identity", [h], "hidden", {}))
    return g


def written(
    g: _Encoder,
    inputs: tuple[tuple[str, int, list[Any]], ...],
    outputs: tuple[tuple[str, int, list[Any]], ...],
) -> Any:
    """The described graph as an onnx.ModelProto (the one place the onnx package is used):
    the external weights declared, not copied (copying 90 MB into protobuf messages took
    1.4 s of CPU and as much memory again)."""
    from onnx import TensorProto, helper, numpy_helper

    initializers = [numpy_helper.from_array(array, name) for name, array in g.constants]
    for name, array in g.arrays.items():
        tensor = TensorProto(name=name, data_type=ONNX_TYPES[array.dtype.name])
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "memory"), ("offset", "0"), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        initializers.append(tensor)
    graph = helper.make_graph(
        [helper.make_node(kind, ins, [out], **attrs) for kind, ins, out, attrs in g.nodes],
        "minilm_encoder",
        [helper.make_tensor_value_info(*spec) for spec in inputs],
        [helper.make_tensor_value_info(*spec) for spec in outputs],
        initializers,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )


def session(model: bytes, arrays: dict[str, Any]) -> Any:
    """An onnxruntime session over the serialized `model`, its external weights handed over
    from memory."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    # The weights from memory, copied once into the session (which may then drop them).
    names = list(arrays)
    options.add_external_initializers(
        names, [ort.OrtValue.ortvalue_from_numpy(arrays[n]) for n in names]
    )
    # One thread, as NumPy's BLAS has (gateway/minilm.py, threadpool_limits): a worker's
    # parallelism comes from the sessions it serves at once, and a pool of threads per
    # product spins against them on a busy machine.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class EncoderSession:
    """An onnxruntime session over the encoder graph (float32, or int8 if `quantized`): token
    ids in, last states out."""

    def __init__(
        self,
        weights: dict[str, Any],
        *,
        layers: int,
        heads: int,
        eps: float,
        quantized: bool = False,
    ) -> None:
        g = describe_encoder(weights, layers=layers, heads=heads, eps=eps, quantized=quantized)
        key = g.fingerprint()

        def write() -> bytes:
            output = ("hidden", FLOAT, ["batch", "tokens", g.width])
            data: bytes = written(g, ENCODER_INPUTS, (output,)).SerializeToString()
            return data

        data, kept = encoder_cache.cached(key, write)  # gateway/encoder_cache.py
        try:
            self._session = session(data, g.arrays)
        except ImportError:
            raise  # no onnxruntime: the NumPy pass runs (gateway/minilm.py)
        except Exception:
            if not kept:
                raise
            # A kept graph this onnxruntime refuses (one written by another version, say):
            # written again here, and what fails then is the session's own failure.
            log.warning("onnxruntime refused the cached encoder graph", exc_info=True)
            data, _ = encoder_cache.cached(key, write, fresh=True)
            self._session = session(data, g.arrays)

    def hidden(self, ids: Any, types: Any, mask: Any) -> Any:
        """(batch, tokens) int64 ids and types and float32 mask -> (batch, tokens, width)."""
        (states,) = self._session.run(
            ["hidden"], {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        )
        return states
