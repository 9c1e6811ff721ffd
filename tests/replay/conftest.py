"""The replay tier: the committed workflow histories (tests/histories/, read through
tests/support/histories.py) replayed on the current workflow code, in this process, with no
server. A workflow change that would break a turn already running fails here. The histories
are recorded by tests/workflow/test_replay_shapes.py (every turn shape) and by a few
full-stack tests (tests/api/test_replay_live.py, tests/system/test_returns_specialist.py,
test_returns_agent.py, test_skills.py, test_summary_runs.py), each under PARLEY_RECORD_HISTORY."""
