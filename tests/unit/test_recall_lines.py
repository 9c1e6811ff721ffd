"""Recall's pure rules beyond the fusion: the neighbours of the best hits, and the compact
recalled lines (one date heading per day, greetings and thank-yous left out, within budget)."""

from __future__ import annotations

from parley.prompt import RECALLED_SEQ, Budgets, RecallHit, recall_block
from parley.recall import (
    fuse,
    neighbours,
    rounds_for,
    said,
    trim_filler,
    with_neighbours,
    without_speakers,
)
from parley.tokens import default_counter

# --- neighbours ---------------------------------------------------------------------------------


def test_the_messages_next_to_the_best_hits_are_offered_in_the_order_of_their_hits() -> None:
    assert neighbours([40, 7, 90], top=2) == [39, 41, 6, 8]
    assert neighbours([1], top=10) == [2]  # there is no seq 0
    assert neighbours([5, 6], top=10) == [4, 6, 5, 7]  # a hit can be another's neighbour


def test_a_neighbour_of_several_good_hits_climbs_above_a_lone_weak_hit() -> None:
    words, meaning = [20, 50, 70, 90], [22, 51, 71, 91]
    rankings = [words, meaning]
    near = neighbours(fuse(rankings), top=4)
    fused = fuse([*rankings, near])
    # 21 answers the question at 20 and precedes the reply at 22: both rankings' top hits.
    assert fused.index(21) < fused.index(91)
    assert 21 not in fuse(rankings)


# --- compact lines ------------------------------------------------------------------------------


def test_greetings_and_thanks_are_left_out_and_the_rest_is_the_speakers_own_words() -> None:
    text = "Hey Mel! Good to see you! I went to a support group yesterday. It was powerful."
    assert trim_filler(text) == "I went to a support group yesterday. It was powerful."
    # A yes or a no answers something: it stays with the line.
    assert trim_filler("No. The fleece still fits. Thanks!") == "No. The fleece still fits."
    assert trim_filler("Tuesday. Hi Mel!") == "Tuesday."  # a one-word answer is not filler
    assert trim_filler("Wow, that's awesome! I painted a sunrise.") == "I painted a sunrise."
    # A speaker's label stays; a message that is all filler is kept whole.
    assert trim_filler("Caroline: Thanks, Melanie! Is this your painting?") == (
        "Caroline: Is this your painting?"
    )
    assert trim_filler("Thanks so much, Melanie!") == "Thanks so much, Melanie!"
    assert trim_filler("My order 8472 never came. Thanks!") == "My order 8472 never came."


def test_recalled_lines_carry_seq_and_a_date_heading_per_day_in_conversation_order() -> None:
    hits = [
        RecallHit(30, "user", "Thanks! My new address is 12 Harbour Lane.", "2024-03-02"),
        RecallHit(4, "assistant", "Your order 8390 shipped today.", "2024-03-01"),
        RecallHit(31, "assistant", "Noted, I updated the address.", "2024-03-02"),
    ]
    counter = default_counter()
    (block,) = recall_block(counter, hits, Budgets(window=4096, reserve=512, recall=400))
    lines = block.messages[0]["content"].splitlines()[1:]
    assert lines == [
        "2024-03-01:",
        "4 assistant: Your order 8390 shipped today.",
        "2024-03-02:",
        "30 user: My new address is 12 Harbour Lane.",
        "31 assistant: Noted, I updated the address.",
    ]
    # The seqs shown are read back from the text, and only from the start of a line: not a
    # date heading, not a number inside the text.
    assert [int(s) for s in RECALLED_SEQ.findall(block.messages[0]["content"])] == [4, 30, 31]


def test_compact_lines_fit_more_recalled_messages_in_the_same_budget() -> None:
    counter = default_counter()
    hits = [
        RecallHit(100 + i, "user", f"I told you my sister {i} lives in Oslo now.", "2024-03-01")
        for i in range(60)
    ]
    budgets = Budgets(window=4096, reserve=512, recall=300)
    (block,) = recall_block(counter, hits, budgets)
    shown = RECALLED_SEQ.findall(block.messages[0]["content"])
    # The same lines in the old "[seq N] role: text" form cost 4 tokens more each.
    old_form = sum(counter.count(f"[seq {h.seq}] user: {h.text}") + 1 for h in hits[: len(shown)])
    assert block.tokens <= budgets.recall < old_form


def test_the_recall_block_stays_within_its_budget_and_keeps_the_best_hits() -> None:
    counter = default_counter()
    hits = [
        RecallHit(seq, "user", f"Line number {seq} about the fleece return.", f"2024-03-{seq:02d}")
        for seq in range(1, 29)
    ]
    budgets = Budgets(window=4096, reserve=512, recall=120)
    (block,) = recall_block(counter, hits, budgets)
    content = block.messages[0]["content"]
    assert block.tokens <= budgets.recall
    shown = RECALLED_SEQ.findall(content)
    assert "1" in shown and "28" not in shown  # best first: seq 1 wins


def test_a_second_round_brings_in_the_neighbour_of_a_neighbour_the_first_round_lifted() -> None:
    words, meaning = [10], [10]
    one = with_neighbours([words, meaning], below=100, top=2, rounds=1)
    two = with_neighbours([words, meaning], below=100, top=2, rounds=2)
    assert 9 in one and 11 in one and 8 not in one  # round one: the neighbours of 10
    # Round one lifted 9 into the top two (10 and 9): its neighbour 8 comes in.
    assert 8 in two and two.index(8) > two.index(9)


def test_a_neighbour_counts_for_less_than_a_search_hit() -> None:
    # 9 and 11, the neighbours of the best hit, come after 70, which only one search found:
    # a round of neighbours counts NEIGHBOUR_WEIGHT of a search's ranking.
    fused = with_neighbours([[10], [10, 70]], below=100, top=1, rounds=1)
    assert fused[:2] == [10, 70] and set(fused[2:]) == {9, 11}
    assert fuse([[1, 2], [2]], weights=[1.0, 0.05]) == [1, 2]
    assert fuse([[1, 2], [2]]) == [2, 1]
    # Nothing at or past `below` (the recent window's first seq) is offered.
    assert max(with_neighbours([[98, 99]], below=100)) == 99


def test_a_neighbour_is_the_nearest_message_that_says_something() -> None:
    # Seqs 11 and 13 are a canned reply said many times: not in the order recall may show.
    order = [8, 9, 10, 12, 14, 15]
    assert neighbours([12], top=1, order=order) == [10, 14]
    assert neighbours([8], top=1, order=order) == [9]  # nothing said before the first
    # A hit that is not in the order itself (found by meaning) still has its neighbours.
    assert neighbours([11], top=1, order=order) == [10, 12]


def test_a_repeated_text_is_no_candidate_whichever_ranking_found_it() -> None:
    order = [2, 4, 6, 8]
    fused = with_neighbours([[5, 4], [7, 6]], below=100, top=2, rounds=1, order=order)
    assert 5 not in fused and 7 not in fused
    assert set(fused[:2]) == {4, 6}
    assert set(fused) == {2, 4, 6, 8}  # the neighbours skip the left-out texts


def test_more_room_brings_more_rounds_of_neighbours() -> None:
    assert rounds_for(200) == 2  # the floor's recall: two rounds, as before
    assert rounds_for(1000) == 3
    assert rounds_for(50_000) == 4
    assert rounds_for(0) == 2


def test_a_transcripts_speakers_are_named_once_in_the_heading_not_in_every_line() -> None:
    counter = default_counter()
    said = [
        (5, "user", "Caroline: I went to a support group yesterday."),
        (6, "assistant", "Melanie: That's brave. I painted a sunrise last week."),
        (9, "user", "Caroline: My sister moved to Oslo."),
        (12, "assistant", "Melanie: We camped by the lake with the kids."),
        (14, "user", "Caroline: I'm applying to counselling courses."),
        (15, "assistant", "Melanie: Pottery class starts on Monday."),
    ]
    hits = [RecallHit(seq, role, text, "2023-05-08") for seq, role, text in said]
    budgets = Budgets(window=4096, reserve=512, recall=400)
    (block,) = recall_block(counter, hits, budgets)
    heading, *lines = block.messages[0]["content"].splitlines()
    assert "assistant lines are Melanie's" in heading and "user lines are Caroline's" in heading
    assert lines[1:3] == [
        "5 user: I went to a support group yesterday.",
        "6 assistant: That's brave. I painted a sunrise last week.",
    ]
    # The same lines with their labels cost more: in a tight budget, fewer of them fit.
    labelled = [f"{seq} {role}: {text}" for seq, role, text in said]
    assert block.tokens < counter.count(heading + "\n" + "\n".join(labelled))
    # One line of a role without the label, or too few lines, and the labels stay in the lines.
    mixed = [*hits, RecallHit(20, "user", "No label here.", "2023-05-09")]
    (block,) = recall_block(counter, mixed, budgets)
    content = block.messages[0]["content"]
    assert "user lines are" not in content and "5 user: Caroline: I went" in content
    assert "assistant lines are Melanie's" in content
    (block,) = recall_block(counter, hits[:4], budgets)
    assert "lines are" not in block.messages[0]["content"]


# --- what recall by meaning compares --------------------------------------------------------------


def test_a_line_is_embedded_for_what_it_says_not_for_who_says_it() -> None:
    line = "Mira: Hey Tomas! How are you? I took my sister fishing on the lake on Sunday."
    assert said(line) == "I took my sister fishing on the lake on Sunday."
    assert said("Mira: Thanks!") == "Thanks!"  # nothing but filler: kept as it is
    assert said("a plain message, no label") == "a plain message, no label"


def test_the_question_leaves_out_the_speakers_names_but_not_what_it_asks_about() -> None:
    speakers = ["Mira", "Tomas"]
    assert without_speakers("Where did Mira go fishing?", speakers) == "Where did go fishing?"
    assert without_speakers("What are Tomas's dogs called?", speakers) == "What are dogs called?"
    # Another name, or a name inside a longer word, stays.
    assert without_speakers("Who is Miranda's dog Pixie?", speakers) == (
        "Who is Miranda's dog Pixie?"
    )
    assert without_speakers("Mira?", speakers) == "Mira?"  # nothing else would be left
    assert without_speakers("Where did Mira go?", []) == "Where did Mira go?"
