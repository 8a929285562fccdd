"""Unit layer of the wait estimate: the class's GPUs replayed over holders and the runs ahead."""

from __future__ import annotations

from gpufn_dagster.run.estimate import Ahead, Estimate, Holder, QueueState, changed_meaningfully, estimate_wait

HISTORY = {"embed": [600.0, 620.0, 580.0], "caption": [120.0]}


def test_with_free_gpus_a_run_starts_now_and_without_history_the_estimate_is_unknown():
    assert estimate_wait(QueueState("l4", 4, [Holder("embed", 1, 10.0)], [], 1), HISTORY).text.startswith("now (")
    unknown = estimate_wait(QueueState("l4", 1, [Holder("embed", 1, 10.0)], [Ahead("train", 1)]), HISTORY)
    assert (unknown.seconds, unknown.tag) == (None, "unknown")
    assert "no finished run of train in this instance's history" in unknown.text


def test_a_run_needing_two_gpus_starts_when_two_are_free_at_once():
    # 2 GPUs: one frees in 500 s (embed, 100 s in), the other in 100 s (caption, 20 s in).
    state = QueueState("a100", 2, [Holder("embed", 1, 100.0), Holder("caption", 1, 20.0)], [], gpus=2)
    assert estimate_wait(state, HISTORY).seconds == 500.0
    one = QueueState("a100", 2, [Holder("embed", 1, 100.0), Holder("caption", 1, 20.0)], [], gpus=1)
    assert estimate_wait(one, HISTORY).seconds == 100.0


def test_runs_ahead_take_the_gpus_in_order_for_their_typical_duration():
    state = QueueState("l4", 1, [Holder("caption", 1, 60.0)], [Ahead("embed", 1), Ahead("caption", 1)])
    estimate = estimate_wait(state, HISTORY)
    assert estimate.seconds == 60.0 + 600.0 + 120.0
    assert estimate.text == "about 13 min (2 runs ahead on l4, typical 6 min each, 1 GPU in the class)"


def test_an_estimate_is_said_again_only_when_it_moves_meaningfully():
    assert not changed_meaningfully("about 13 min", Estimate(840.0, "about 14 min (...)"))
    assert changed_meaningfully("about 13 min", Estimate(1800.0, "about 30 min (...)"))
    assert changed_meaningfully("unknown", Estimate(0.0, "now (...)"))
    assert changed_meaningfully("now", Estimate(None, "unknown (...)"))
