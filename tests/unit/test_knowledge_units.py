"""Knowledge documents in pure code: parsing and chunking, the budget, hybrid ranking, query
rewriting, citations, and the demo model's policy answers."""

from __future__ import annotations

from parley.gateway.demo_policy import NOT_FOUND, policy_answer
from parley.gateway.fake_provider.embeddings import hashed_embedding
from parley.knowledge import (
    DocumentMode,
    Passage,
    Selection,
    chunk_document,
    cited_sources,
    fuse,
    knowledge_text,
    parse_document,
    query_terms,
    read_passages,
    select_passages,
    standalone_query,
)
from parley.launch.knowledge import read_library

DOC = """---
title: Warranty and damaged items
mode: always
---

## Items damaged on arrival

Report it within 14 days. We replace it.

## Long section

""" + "\n\n".join(f"Paragraph {i} has several words in it. It ends here." for i in range(40))


def words(text: str) -> int:
    return len(text.split())


def test_sections_become_chunks_and_long_sections_split_at_paragraphs() -> None:
    document = parse_document(DOC, doc="warranty")
    assert document.title == "Warranty and damaged items"
    assert document.mode == DocumentMode.always
    chunks = chunk_document(document, max_words=60)
    assert chunks[0].section == "Items damaged on arrival"
    assert chunks[0].text == "Report it within 14 days. We replace it."
    long = [c for c in chunks if c.section == "Long section"]
    assert len(long) > 1
    assert all(words(c.text) <= 60 for c in long)
    # Nothing lost, nothing cut mid-paragraph, positions in order.
    assert sum(c.text.count("Paragraph") for c in long) == 40
    assert [c.position for c in chunks] == list(range(len(chunks)))


def test_the_demo_library_has_four_northwind_documents_and_another_tenant() -> None:
    library = read_library()
    assert {d.doc for d in library["northwind"]} == {
        "returns-and-refunds",
        "shipping",
        "warranty-and-damaged-items",
        "business-accounts",
    }
    assert library["southwind"]
    returns = next(d for d in library["northwind"] if d.doc == "returns-and-refunds")
    assert "30 days of delivery" in " ".join(s.text for s in returns.sections)


def passage(doc: str, position: int, text: str, mode: DocumentMode = DocumentMode.retrieved):
    return Passage(doc, doc.title(), f"section {position}", 1, position, text, mode)


def test_budget_takes_always_documents_first_then_cuts_and_counts_what_is_left_out() -> None:
    always = [passage("house", i, "word " * 30, DocumentMode.always) for i in range(3)]
    retrieved = [passage("faq", i, "word " * 30) for i in range(3)]
    roomy = select_passages(always, retrieved, budget=10_000, count=words)
    assert [p.doc for p in roomy.passages] == ["house"] * 3 + ["faq"] * 3
    assert (roomy.left_out, roomy.truncated) == (0, 0)
    # Room for about two passages: the always-document is cut, the retrieved ones left out.
    tight = select_passages(always, retrieved, budget=110, count=words)
    assert [p.doc for p in tight.passages] == ["house", "house"]
    assert (tight.left_out, tight.truncated) == (3, 1)
    text = knowledge_text(tight)
    assert "3 knowledge document(s) did not fit and were left out" in text
    assert "1 knowledge document(s) did not fit and were cut short" in text


def test_reciprocal_rank_fusion_lifts_what_both_methods_found() -> None:
    text_ranking = ["a", "b", "c"]
    vector_ranking = ["c", "d", "a"]
    assert fuse([text_ranking, vector_ranking])[:2] == ["a", "c"]
    assert set(fuse([text_ranking, vector_ranking])) == {"a", "b", "c", "d"}
    assert fuse([text_ranking]) == text_ranking


def test_a_message_that_points_back_names_the_order_from_the_slots() -> None:
    query = standalone_query(
        "What about returns for that one?", slots={"active_order_id": "8390", "other": 1}
    )
    assert "order 8390" in query
    assert "returns" in query_terms(query)
    assert "that" not in query_terms(query)
    # A message that stands alone is left as it is.
    assert standalone_query("What is your shipping policy?", slots={"active_order_id": "8390"}) == (
        "What is your shipping policy?"
    )


def test_citations_name_only_passages_the_prompt_showed_each_once() -> None:
    selection = Selection([passage("warranty", 0, "x"), passage("shipping", 2, "y")])
    shown = selection.sources
    answer = "Per [K2] and [K1], again [K2]; [K9] was never shown."
    assert cited_sources(answer, shown) == [
        {"doc": "shipping", "section": "section 2", "version": 1},
        {"doc": "warranty", "section": "section 0", "version": 1},
    ]
    assert cited_sources("No references here.", shown) == []


def test_the_demo_model_answers_policy_from_passages_and_never_invents() -> None:
    library = read_library()
    warranty = next(d for d in library["northwind"] if d.doc == "warranty-and-damaged-items")
    passages = [
        Passage(warranty.doc, warranty.title, c.section, 1, c.position, c.text)
        for c in chunk_document(warranty)
    ]
    messages = [{"role": "system", "content": knowledge_text(Selection(passages))}]
    shown = read_passages(messages)
    assert [p.section for p in shown] == [p.section for p in passages]
    answer = policy_answer("What is your policy on damaged items?", shown)
    assert answer is not None
    assert "14 days" in answer and "[K1]" in answer
    assert policy_answer("What is your policy on damaged items?", []) == NOT_FOUND
    # Questions about the customer's own orders are not policy questions.
    assert policy_answer("Can I still return it?", shown) is None


def test_fake_embeddings_are_deterministic_unit_vectors_of_shared_words() -> None:
    a = hashed_embedding("damaged items on arrival")
    assert a == hashed_embedding("damaged items on arrival")
    assert abs(sum(x * x for x in a) - 1.0) < 1e-9
    near = sum(x * y for x, y in zip(a, hashed_embedding("item damaged"), strict=True))
    far = sum(x * y for x, y in zip(a, hashed_embedding("invoice payment terms"), strict=True))
    assert near > far
