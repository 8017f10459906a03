"""PyTorch's two recorders read as one: the generic one (gloo) and ProcessGroupNCCL's own number their
groups independently, so they are joined by group name, never by number."""

from __future__ import annotations

from typing import Any

import pytest

from flightrec.record import torch_recorder


def _recorder(backend: str, groups: dict[int, str], completed: dict[int, int]) -> dict[str, Any]:
    entries = [{"pg_id": pg_id, "process_group": [name, ""], "collective_seq_id": completed[pg_id],
                "profiling_name": f"{backend}:all_reduce"} for pg_id, name in groups.items()]
    status = {str(pg_id): {"last_completed_collective": seq} for pg_id, seq in completed.items()}
    return {"version": "2.10", "entries": entries, "pg_status": status}


@pytest.mark.parametrize("include_entries", [True, False])
def test_groups_of_the_two_recorders_are_joined_by_name(monkeypatch: pytest.MonkeyPatch, include_entries: bool) -> None:
    # gloo's group 0 is the job's group "5"; NCCL's group 0 is the default group "0", 1 is "1"; NCCL's
    # group 2 has no entry left to name it.
    generic = _recorder("gloo", {0: "5"}, {0: 40})
    nccl = _recorder("nccl", {0: "0", 1: "1"}, {0: 7, 1: 3})
    nccl["pg_status"]["2"] = {"last_completed_collective": 99}
    monkeypatch.setattr(torch_recorder, "enabled", lambda: True)
    monkeypatch.setattr(torch_recorder, "_read_generic", lambda include: generic)
    monkeypatch.setattr(torch_recorder, "read_nccl", lambda include=True: nccl)
    merged = torch_recorder.read(include_entries)
    assert torch_recorder.completed_seqs(merged) == {"5": 40, "0": 7, "1": 3}
    assert torch_recorder.uid_to_group_name(merged) == {"5": "5", "0": "0", "1": "1"}


def test_one_recorder_is_read_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    generic = _recorder("gloo", {0: "5"}, {0: 40})
    monkeypatch.setattr(torch_recorder, "enabled", lambda: True)
    monkeypatch.setattr(torch_recorder, "_read_generic", lambda include: generic)
    monkeypatch.setattr(torch_recorder, "read_nccl", lambda include=True: None)
    assert torch_recorder.read(False) is generic
