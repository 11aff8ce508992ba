"""The event schema: every event kind described, violations refused with what to do."""

from __future__ import annotations

import pytest
from synthetic_events import every_event_kind, started, train

from elfes.records import EVENT_DESCRIPTIONS, EVENT_FIELDS, epoch_number, event_reference
from elfes.records.schema import event_json_line, validate_event


def test_schema_covers_every_event_with_a_description():
    assert set(EVENT_FIELDS) == set(EVENT_DESCRIPTIONS)
    logged = {event["event"] for event in every_event_kind()}
    assert logged | {"finished"} == set(EVENT_FIELDS)
    assert all(EVENT_DESCRIPTIONS.values())


@pytest.mark.parametrize(
    ("event", "pattern"),
    [
        ({"event": "nonsense", "step": 1}, "unknown event name 'nonsense'"),
        ({"step": 1}, "unknown event name None"),
        ({"event": "export", "weights": "raw"}, "'export'.*missing.*'path'"),
        ({**train(1), "time": "yesterday"}, "'train'.*'time'"),
        ({**started(), "state": {"step": 0}}, "'started'.*'state'.*'best_metric'"),
        ({**started(), "budget": 100}, "'started'.*'budget' must be a dict"),
        ({"event": "failed", "exception": "ValueError", "epoch": 1, "step": 3}, "'failed'.*missing.*'message'"),
        ({"event": "stop_signal", "reason": "SIGTERM", "epoch": 1, "step": 3}, "'stop_signal'.*missing.*'signal'"),
    ],
)
def test_schema_violations_say_what_to_change(event, pattern):
    with pytest.raises(ValueError, match=pattern):
        validate_event(event)


def test_json_line_names_a_value_without_json_form():
    with pytest.raises(TypeError, match=r"train\.metrics\.loss.*\.item\(\)"):
        event_json_line({**train(1), "metrics": {"loss": object()}}, "train", "T")


@pytest.mark.parametrize(
    ("completed_epochs", "next_batch", "expected"),
    [(0, 0, 1), (0, 15, 1), (1, 0, 1), (1, 1, 2), (2, 7, 3), (3, 0, 3)],
)
def test_epoch_number_is_the_epoch_the_run_is_in_and_a_boundary_belongs_to_the_epoch_that_ended(
    completed_epochs, next_batch, expected
):
    assert epoch_number(completed_epochs, next_batch) == expected


def test_the_reference_explains_the_epoch_field_and_the_state_epoch():
    reference = event_reference()
    assert "- `epoch`: The 1-based number of the epoch the run is in" in reference
    assert "`state.epoch` counts completed epochs" in reference


def test_the_reference_documents_the_new_events_and_fields():
    reference = event_reference()
    assert "| `failed` | `exception`, `message`, `epoch`, `step` |" in reference
    assert "| `stop_signal` | `signal`, `reason`, `epoch`, `step` |" in reference
    assert "`resumed_from`, `past_budget` (optional), `per_rank_data` (optional) |" in reference
    assert "lr/decay and lr/no_decay" in reference


def test_a_resumed_event_without_past_budget_is_still_valid():
    """Records written before past_budget existed (and engines not yet emitting it) stay readable."""
    assert validate_event(started(5, resumed_from="/ckpt")) == "resumed"
    assert validate_event({**started(5, resumed_from="/ckpt"), "past_budget": False}) == "resumed"


def test_every_warning_kind_is_explained_in_the_events_table():
    """The `warning` row of the events table (docs/engine.md, generated from the schema and checked against it by
    tests/docs) names every kind the engine can record (elfes.contract.WarningKind: the only kinds it emits)."""
    from elfes.contract import WarningKind
    from elfes.records.schema import EVENT_SPECS

    described = EVENT_SPECS["warning"].description
    assert [kind.value for kind in WarningKind if f"{kind.value}, " not in described] == []
