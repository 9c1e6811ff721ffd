"""MiniLM's encoder as an ONNX graph built in memory, run by onnxruntime.

The NumPy pass of gateway/minilm.py is the reference; this is the same BERT encoder over the
same weights (the tensors the embedder has already loaded), written out node by node with
`onnx.helper`: no exported file, no torch, no network. Why: the encoder's products are a few
rows tall (one message is a dozen tokens), where NumPy's BLAS is slow; onnxruntime's kernels
did one (14 x 384) @ (384 x 1536) product in 0.18 ms against NumPy's 1.3-2.4 ms. A short
message's vector takes 2 to 2.8 times less CPU, a batch of LoCoMo's messages 1.6 times less
(docs/benchmarks-results.md).

The graph takes token ids, token types and the padding mask, batch and length both dynamic,
and gives the last layer's states; pooling and normalisation stay with the caller, as for the
NumPy pass. Optional: without onnx or onnxruntime, `EncoderSession` raises ImportError and
the embedder runs its NumPy pass.
"""

from __future__ import annotations

from typing import Any

# Opset 17 brings LayerNormalization as one operator; IR version 8 is its pair, fixed so that
# the onnxruntime installed loads the graph whatever IR version the onnx package defaults to.
OPSET = 17
IR_VERSION = 8


class _Encoder:
    """The graph being built: its nodes, its initializers (small constants stored in it, and
    the weights declared as external data, handed to the session from memory), and fresh
    names for intermediate values."""

    def __init__(self, weights: dict[str, Any], *, heads: int, eps: float) -> None:
        import numpy as np

        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
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

    def const(self, name: str, array: Any) -> str:
        """A small constant, stored in the graph (shapes, scalars)."""
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, *, transposed: bool = False) -> str:
        """A tensor of the checkpoint, declared as external data: copying 90 MB into protobuf
        messages took 1.4 s of CPU and as much memory again. A linear layer's weight is
        stored (out, in); MatMul wants it `transposed`, (in, out)."""
        import numpy as np
        from onnx import TensorProto

        array = np.asarray(self._weights[name], dtype=np.float32)
        array = np.ascontiguousarray(array.T if transposed else array)
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT)
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "memory"), ("offset", "0"), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        self.initializers.append(tensor)
        self.arrays[name] = array
        return name

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        from onnx import helper

        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attributes))
        return out

    def dense(self, x: str, name: str) -> str:
        product = self.op("MatMul", x, self.weight(name + ".weight", transposed=True))
        return self.op("Add", product, self.weight(name + ".bias"))

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


def build_encoder(
    weights: dict[str, Any], *, layers: int, heads: int, eps: float
) -> tuple[Any, dict[str, Any]]:
    """The BERT encoder over `weights` (named as gateway/minilm.py reads them), as a model
    (onnx.ModelProto) with inputs `input_ids`, `token_type_ids` (int64, batch x tokens),
    `attention_mask` (float32, 1 for a token, 0 for padding) and output `hidden` (batch x
    tokens x width), and the arrays of its external weights by name."""
    from onnx import TensorProto, helper

    g = _Encoder(weights, heads=heads, eps=eps)
    h, bias = g.embeddings(), g.padding()
    for layer in range(layers):
        h = g.layer(h, bias, f"encoder.layer.{layer}.")
    g.nodes.append(helper.make_node("Identity", [h], ["hidden"]))
    ids = ["batch", "tokens"]
    graph = helper.make_graph(
        g.nodes,
        "minilm_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ids),
            helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ids),
        ],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [*ids, g.width])],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return model, g.arrays


class EncoderSession:
    """An onnxruntime session over the encoder graph: token ids in, last states out."""

    def __init__(self, weights: dict[str, Any], *, layers: int, heads: int, eps: float) -> None:
        import onnxruntime as ort

        model, arrays = build_encoder(weights, layers=layers, heads=heads, eps=eps)
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
        self._session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def hidden(self, ids: Any, types: Any, mask: Any) -> Any:
        """(batch, tokens) int64 ids and types and float32 mask -> (batch, tokens, width)."""
        (states,) = self._session.run(
            ["hidden"], {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        )
        return states
