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


def test_a_selection_never_run_as_such_is_estimated_from_its_assets_own_history():
    """A Materialize all ran docs__embedding among others: a run of docs__embedding alone, or of a
    selection of it and docs__summary, has no history of its own but its assets have."""
    history = {"docs, docs__embedding, docs__summary": [900.0], "docs__embedding": [300.0, 280.0, 320.0],
               "docs__summary": [60.0]}
    holder = Holder("docs__embedding, docs__summary", 1, 100.0, ("docs__embedding", "docs__summary"))
    state = QueueState("l4", 1, [holder], [Ahead("docs__embedding", 1, ("docs__embedding",))])
    estimate = estimate_wait(state, history)
    assert estimate.seconds == (300.0 + 60.0 - 100.0) + 300.0
    assert estimate.tag == "about 9 min"
    # An asset no run ever materialized makes it unknown, naming that asset (not the whole selection).
    never = QueueState("l4", 1, [holder], [Ahead("docs__embedding, docs__caption", 1, ("docs__caption",
                                                                                      "docs__embedding"))])
    unknown = estimate_wait(never, history)
    assert (unknown.seconds, unknown.tag) == (None, "unknown")
    assert unknown.text.endswith("; no finished run of docs__caption in this instance's history)")


def test_holders_past_their_typical_time_make_the_start_any_moment_never_now():
    late = QueueState("l4", 1, [Holder("embed", 1, 900.0)], [], 1)  # typical 600 s, held for 900 s
    estimate = estimate_wait(late, HISTORY)
    assert (estimate.seconds, estimate.tag) == (0.0, "any moment")
    behind = estimate_wait(QueueState("l4", 1, [Holder("embed", 1, 900.0)], [Ahead("caption", 1)], 1), HISTORY)
    assert (behind.seconds, behind.tag) == (120.0, "about 2 min")
    # A GPU the instance knows to be free is "now", and the two say the same minutes.
    free = estimate_wait(QueueState("l4", 2, [Holder("embed", 1, 900.0)], [], 1), HISTORY)
    assert (free.seconds, free.tag) == (0.0, "now")
    assert not changed_meaningfully("any moment", free) and not changed_meaningfully("any moment", estimate)
