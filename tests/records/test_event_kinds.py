"""Event kinds are one enum (elfes.contract.EventKind): the schema has an entry for each member and no other, and
no module of elfes/ or launcher/ writes or compares an event kind spelled by hand (a copy of the word that a
renamed or new kind would miss). A real run's events.jsonl reading back through the enum:
tests/engine/test_run_records.py::test_every_kind_a_run_writes_is_a_member_and_its_lines_are_plain_json."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from synthetic_events import every_event_kind

from elfes.contract import END_EVENTS, START_EVENTS, STOP_EVENTS, EventKind
from elfes.records.plain import _RENDERERS
from elfes.records.schema import EVENT_SPECS, event_json_line, validate_event

REPOSITORY = Path(__file__).resolve().parents[2]
KINDS = frozenset(kind.value for kind in EventKind)
CONTRACT = REPOSITORY / "elfes" / "contract.py"


def test_the_schema_and_the_plain_lines_have_one_entry_per_member_and_the_groups_are_members():
    """A new kind is a member (elfes/contract.py), its fields (elfes/records/schema.py) and its line
    (elfes/records/plain.py); each of the three without the others fails here."""
    assert list(EVENT_SPECS) == list(EventKind) and all(type(kind) is EventKind for kind in EVENT_SPECS)
    assert set(_RENDERERS) == set(EventKind)
    assert {*START_EVENTS, *END_EVENTS, *STOP_EVENTS} <= set(EventKind)
    assert {EventKind(event["event"]) for event in every_event_kind()} | {EventKind.FINISHED} == set(EventKind)


def test_an_event_written_through_a_member_is_the_same_line_as_through_its_word():
    for event in every_event_kind():
        kind = validate_event(event)
        assert type(kind) is EventKind and kind == event["event"]
        through_member = event_json_line({**event, "event": kind}, kind, "T")
        assert through_member == event_json_line(event, event["event"], "T")
        assert json.loads(through_member)["event"] == kind.value


# -- no kind spelled by hand ---------------------------------------------------------------------------------------

def _is_event_key(node: ast.AST) -> bool:
    """``x["event"]`` or ``x.get("event")``: an event's kind."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event")


def _spelled(node: ast.AST | None) -> list[str]:
    """The event kinds ``node`` spells as strings: a constant, or the constants of a tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in KINDS:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [item.value for item in node.elts if isinstance(item, ast.Constant) and item.value in KINDS]
    return []


def _names_of_kinds(function: ast.AST) -> set[str]:
    """Names a function binds to an event's kind (``kind = event.get("event")``, ``kind, t = e["event"], ...``)."""
    names: set[str] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [(target, node.value)])
            names |= {name.id for name, value in pairs if isinstance(name, ast.Name) and _is_event_key(value)}
    return names


def kinds_spelled_by_hand(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for each event kind the module writes or compares as a string instead of an EventKind."""
    found: list[tuple[int, str]] = []
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:
        names = _names_of_kinds(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(_is_event_key(o) or (isinstance(o, ast.Name) and o.id in names) for o in operands):
                    found += [(node.lineno, f"compares with {kind!r}") for o in operands for kind in _spelled(o)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [key for key in node.keys if key is not None]
            found += [(node.lineno, f"writes {{'event': {kind!r}}}") for key, value in zip(node.keys, node.values)
                      if isinstance(key, ast.Constant) and key.value == "event" for kind in _spelled(value)]
            spelled_keys = [kind for key in keys for kind in _spelled(key)]
            if len(spelled_keys) >= 2 and len(spelled_keys) == len(keys):
                found.append((node.lineno, f"keys a table by {spelled_keys}"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            spelled = _spelled(node)
            if len(spelled) >= 2 and len(spelled) == len(node.elts):
                found.append((node.lineno, f"lists {spelled}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "log"
              and node.args and _spelled(node.args[0])):
            found.append((node.lineno, f"logs {_spelled(node.args[0])[0]!r}"))
    return sorted(set(found))


def test_no_module_spells_an_event_kind_by_hand():
    """Every place that writes an event or compares its kind names an EventKind member (or a group of them:
    START_EVENTS, END_EVENTS, STOP_EVENTS), so that the kinds have one home and a new one is found everywhere."""
    files = [file for package in ("elfes", "launcher") for file in sorted((REPOSITORY / package).rglob("*.py"))
             if file != CONTRACT]
    spelled = [f"{file.relative_to(REPOSITORY)}:{line}: {what}" for file in files
               for line, what in kinds_spelled_by_hand(ast.parse(file.read_text(encoding="utf-8")))]
    assert spelled == [], "use elfes.contract.EventKind instead:\n" + "\n".join(spelled)


def test_the_scan_finds_each_way_of_spelling_a_kind_by_hand():
    """The scan above can fail: each of these spellings is found (and the members are not)."""
    source = '''
def read(event, logger, session):
    kind, time = event.get("event"), event.get("time")
    if kind == "train" or event["event"] in ("started", "resumed"):
        logger.log({"event": "export", "path": "m.pt"})
    session.log("finished", state={})
    return {"stopped": 1, "failed": 2}, ["finished", "stopped"], kind != EventKind.TRAIN
'''
    found = kinds_spelled_by_hand(ast.parse(source))
    assert sorted(what for _, what in found) == sorted([
        "compares with 'train'", "compares with 'started'", "compares with 'resumed'",
        "writes {'event': 'export'}", "keys a table by ['stopped', 'failed']", "lists ['started', 'resumed']",
        "lists ['finished', 'stopped']", "logs 'finished'",
    ])
