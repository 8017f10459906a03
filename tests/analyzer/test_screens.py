"""The golden first screens: one per kind of real job (DDP, FSDP2, TP/DP, pipeline, crash, SIGKILL,
straggler), each a screen the on-call engineer can act on.

The real jobs run in tests/scenarios/test_fault_injection.py, where `check` holds every screen-set
scenario's live first screen to `screen_problems`. Here: the committed screens
(fixtures/screens/, written by `python -m fixtures.run --screens`) cover that set and keep
the same rules, and each rule catches the screen that breaks it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fixtures.run import SCENARIOS, SCREEN_LINES, SCREENS, screen_problems

SCREEN_SET = sorted(name for name, s in SCENARIOS.items() if s.screen)
KINDS = {"ddp": "ddp_stall", "fsdp2": "fsdp_stall", "tp/dp": "mesh_dp_hang", "pipeline": "pp_1f1b_hang",
         "crash": "ddp_crash", "sigkill": "sigkill", "straggler": "straggler_20"}


def test_the_golden_set_covers_every_kind_of_job() -> None:
    assert sorted(KINDS.values()) == SCREEN_SET
    assert sorted(p.stem for p in SCREENS.glob("*.txt")) == SCREEN_SET


@pytest.mark.parametrize("name", SCREEN_SET)
def test_a_committed_screen_keeps_the_rules(name: str) -> None:
    text = (SCREENS / f"{name}.txt").read_text()
    lines = text.rstrip("\n").splitlines()
    script = SCENARIOS[name].script.name
    assert len(lines) <= SCREEN_LINES, f"{name}: {len(lines)} lines"
    assert re.match(r"(HANG|CRASH|SLOW|DEADLOCK|DESYNC): rank \d+", lines[0]), lines[0]
    assert " host " in text or "(host " in text
    assert re.search(rf"\b{re.escape(script)}:\d+", text)
    assert lines[-2].startswith("next:  flightrec analyze dumps")
    assert any(line.lstrip().startswith("next step") and "rank " in line for line in lines)
    assert "/torch/" not in "\n".join(line for line in lines if line.startswith(("  now at", "  last op")) or " -> " in line)


def _sample() -> tuple[str, dict, Path]:
    """The ddp_stall screen as committed, with the report facts it must show."""
    text = (SCREENS / "ddp_stall.txt").read_text()
    report = {"root_causes": [{"rank": 1}], "hosts": {"1": {"host": "vm"}}, "stragglers": []}
    return text, report, Path("dumps")


def test_the_rules_hold_for_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fixtures.run.dumped_ranks", lambda out: [0, 1])
    text, report, out = _sample()
    assert screen_problems(SCENARIOS["ddp_stall"], report, text, out) == []


@pytest.mark.parametrize("breaks", ["too long", "no host", "no rank", "library line", "no script line", "no next",
                                    "no show", "no step"])
def test_each_rule_catches_the_screen_that_breaks_it(breaks: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fixtures.run.dumped_ranks", lambda out: [0, 1])
    text, report, out = _sample()
    if breaks == "too long":
        text = text.replace("\nwaiting ranks", "\n" * SCREEN_LINES + "waiting ranks")
    elif breaks == "no host":
        text = text.replace("host vm", "pid 1")
    elif breaks == "no rank":
        text = text.replace("HANG: rank 1", "HANG: a rank", 1)
    elif breaks == "library line":
        text = re.sub(r"now at .*", "now at /usr/lib/python3/torch/utils/_contextlib.py:124 in decorate_context", text)
    elif breaks == "no script line":
        text = re.sub(r"scenarios\.py:\d+", "scenarios.py", text)
    elif breaks == "no next":
        text = text.replace("next:", "then:")
    elif breaks == "no step":
        text = re.sub(r"next step .*", "", text)
    else:
        text = re.sub(r"flightrec show \S+ --rank \d+", "", text)
    assert screen_problems(SCENARIOS["ddp_stall"], report, text, out), breaks
