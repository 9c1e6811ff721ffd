"""A session's tree of versions as pure data (store/branches): which messages a branch's path
shows, and which summary versions it may read (issue 42: summaries per branch, never mixed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from parley.store.branches.path import Placed, SummaryEnd, summaries_off
from parley.store.branches.tree import BranchRow, last_shown, on_path, path_of

# Branch 0: seqs 1-6. Branch 1 edits seq 3 (its own messages 7-8). Branch 2 regenerates on
# branch 1 the answer to seq 7 (fork at 8; its own message 9).
TREE = {
    0: BranchRow(0, None, None, None, 1, None),
    1: BranchRow(1, 0, 3, "msg:m3", 2, "m7"),
    2: BranchRow(2, 1, 8, "ans:m7", 2, "t9"),
}
MESSAGES = [Placed(seq, 0) for seq in range(1, 7)] + [Placed(7, 1), Placed(8, 1), Placed(9, 2)]


def shown(leaf: int) -> list[int]:
    path = path_of(TREE, leaf)
    return [m.seq for m in MESSAGES if on_path(path, m.branch, m.seq)]


def test_a_path_is_its_own_messages_and_its_ancestors_before_each_fork() -> None:
    assert shown(0) == [1, 2, 3, 4, 5, 6]
    assert shown(1) == [1, 2, 7, 8]
    assert shown(2) == [1, 2, 7, 9]  # the regenerated answer (8) is left out


def test_a_summary_is_read_only_where_its_branch_agrees_up_to_its_end() -> None:
    summaries = [
        SummaryEnd(id=10, branch=0, through_seq=2),  # shared by every branch
        SummaryEnd(id=11, branch=0, through_seq=5),  # folds 3-5, only branch 0's
        SummaryEnd(id=12, branch=1, through_seq=8),  # folds branch 1's answer at 8
        SummaryEnd(id=13, branch=1, through_seq=7),  # what branches 1 and 2 share
    ]

    def hidden(leaf: int) -> list[int]:
        return summaries_off(TREE, path_of(TREE, leaf), summaries, MESSAGES)

    assert hidden(0) == [12, 13]
    assert hidden(1) == [11]
    assert hidden(2) == [11, 12]


def test_a_version_comes_back_with_the_continuation_shown_last() -> None:
    at = datetime(2026, 10, 28, 12, tzinfo=UTC)
    tree = {
        0: BranchRow(0, None, None, None, 1, None, shown_at=at),
        # Seq 3 edited (version 2, its message at 7), then on it the answer to 9 regenerated.
        1: BranchRow(1, 0, 3, "msg:m3", 2, "m7", shown_at=at, first_seq=7),
        3: BranchRow(3, 1, 10, "ans:m9", 2, "t11", shown_at=at + timedelta(1), first_seq=11),
        # Version 3 of seq 3, edited from version 2: it does not keep version 2.
        2: BranchRow(2, 1, 7, "msg:m3", 3, "m8", shown_at=at + timedelta(2), first_seq=8),
    }
    assert last_shown(tree, 1, 7) == 3  # version 2, as its regenerated answer left it
    assert last_shown(tree, 0, 3) == 0  # version 1: no fork after seq 3 keeps it
    assert last_shown(tree, 2, 8) == 2
