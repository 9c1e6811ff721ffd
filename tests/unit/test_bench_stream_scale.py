"""The stream-scale section's bookkeeping: what the client saw against what the log holds."""

from __future__ import annotations

from bench.stream_scale import Received, Sampler, _figures, _under


def _step(received: list[Received], logged: list[tuple[str, int, str, float]]) -> dict:
    cpu = {"postgres_cpu_s": 1.0, "api_cpu_s": 2.0, "other_cpu_s": 50.0, "bench_client_cpu_s": 9.0}
    return _figures(2, 10.0, received, logged, cpu, 400, Sampler(""))


def test_lag_is_from_the_commit_to_the_frame_and_only_deltas_count() -> None:
    logged = [("t", 1, "state", 0.0), ("t", 2, "delta", 1.0), ("t", 3, "done", 2.0)]
    seen = Received("t", [(1, 0.5), (2, 1.1), (3, 2.0)], terminal="done")
    figures = _step([seen], logged)
    assert figures["deltas"] == 1
    assert round(figures["lag_p95_ms"]) == 100
    assert (figures["lost"], figures["duplicated"]) == (0, 0)
    # Per stream and per second, the client's and the machine's other processes left out.
    assert figures["commits_per_s_per_stream"] == 20.0
    assert figures["cpu_per_stream"] == 0.15
    assert (figures["commits_per_answer"], figures["cpu_per_answer_s"]) == (200.0, 1.5)


def test_an_event_the_client_skipped_or_saw_twice_is_counted() -> None:
    logged = [("t", i, "delta", 0.0) for i in (1, 2, 3)] + [("t", 4, "done", 0.0)]
    skipped = Received("t", [(1, 0.0), (3, 0.0), (3, 0.0), (4, 0.0)], terminal="done")
    figures = _step([skipped], logged)
    assert (figures["lost"], figures["duplicated"]) == (1, 1)


def test_a_stream_that_never_ended_is_a_failure_not_a_loss() -> None:
    logged = [("t", 1, "delta", 0.0), ("t", 2, "done", 0.0)]
    broken = Received("t", [(1, 0.0)], error="stream closed without a terminal event")
    figures = _step([broken], logged)
    assert (figures["failed"], figures["lost"]) == (1, 0)


def test_a_step_whose_answers_fall_behind_the_model_is_above_the_ceiling() -> None:
    step = {"lag_p95_ms": 40.0, "failed": 0, "pace": 1.1}
    assert _under(step)
    assert not _under(step | {"pace": 3.0})  # the stack could not keep up with the model
    assert not _under(step | {"lag_p95_ms": 300.0})
    assert not _under(step | {"failed": 1})
