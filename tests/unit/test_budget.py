"""The conversation budget follows what there is to remember (parley/budget.py): a short chat
stays on the floor, a long one gets its share up to the ceiling, and recall takes most of it
when the question reaches back past the recent turns."""

from __future__ import annotations

from dataclasses import replace

from parley.budget import BudgetRule, only_a_question, reaches_back

RULE = BudgetRule(floor=600, ceiling=4000, share=0.09, recall_at_floor=200, reach_back_recall=0.75)


def test_a_short_chat_stays_on_the_floor_and_a_long_one_stops_at_the_ceiling() -> None:
    assert RULE.conversation(0) == 600
    assert RULE.conversation(6_000) == 600  # 9% is 540: the floor governs
    assert RULE.conversation(11_500) == 1035  # about LoCoMo's conversation 50, sessions 1-15
    assert RULE.conversation(1_000_000) == 4000


def test_a_follow_up_keeps_the_floors_split_and_a_question_that_reaches_back_goes_to_recall() -> (
    None
):
    assert RULE.recall(600, reaches_back=False) == 200
    assert RULE.recall(1200, reaches_back=False) == 400
    assert RULE.recall(1200, reaches_back=True) == 900
    # A share below the follow-up's never takes recall under it.
    low = replace(RULE, reach_back_recall=0.1)
    assert low.recall(600, reaches_back=True) == 200


def test_a_question_reaches_back_when_its_words_are_not_in_the_last_turns() -> None:
    recent = [("user", "Caroline: I'm off to the beach this weekend."), ("assistant", "Enjoy!")]
    assert reaches_back(["pottery", "class", "signed"], recent)
    assert not reaches_back(["beach", "weekend"], recent)
    assert not reaches_back(["beaches", "weekend", "pottery"], recent)  # two of three, inflected
    assert not reaches_back([], recent)  # "and the other one?": a follow-up
    assert reaches_back(["beach"], [])  # nothing recent to answer from


def test_words_the_user_says_all_the_time_do_not_make_a_question_a_follow_up() -> None:
    reply = ("assistant", "Noted. Anything else?")
    recent = [("user", "Dave: I went to a car show."), reply, ("user", "Calvin: Cool!"), reply]
    earlier = [f"{name}: line {n}" for n in range(10) for name in ("Dave", "Calvin")]
    # "dave" and "calvin" are in every line the user wrote: the question is about a country
    # and a meeting, which the last turns do not hold.
    assert reaches_back(["country", "calvin", "dave", "meet"], recent, earlier)
    assert not reaches_back(["country", "calvin", "dave", "meet"], recent)  # no history: counted
    assert not reaches_back(["car", "show", "dave"], recent, earlier)  # the car show was just said
    assert not reaches_back(["calvin", "dave"], recent, earlier)  # nothing but the constants


def test_a_word_only_asked_about_in_the_last_turns_is_not_held_by_them() -> None:
    recent = [("user", "When did the flood happen in Tokyo?"), ("assistant", "Noted.")]
    assert reaches_back(["tokyo", "concert"], recent)
    told = [("user", "The flood in Tokyo was in May."), ("assistant", "Noted.")]
    assert not reaches_back(["tokyo", "flood"], told)
    assert only_a_question("When was it?") and not only_a_question("It was May. Right?")
