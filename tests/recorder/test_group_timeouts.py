"""flightrec's timeout under the groups' own timeouts (record/group_timeouts.py), and PyTorch's recorder state
in hang dumps.

There is no NCCL on the test machines. The rule for NCCL and HCCL (which backends end ops at their
timeout, under which variables) is unit-tested here with backend names and environments; the jobs use
real gloo groups with real timeouts, and where a group must count as NCCL's, the ranks mark gloo so in
the rule (tests/recorder/timeout_workers.simulate_nccl). What NCCL's watchdog then does to the process
is not exercised here (benchmarks/gpu_check.py, on a GPU).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from flightrec.record import torch_recorder
from flightrec.record.group_timeouts import (
    DUMP_MARGIN_S,
    GroupTimeout,
    derive_limits,
    ends_ops_at_timeout,
    latest_safe_s,
    unsafe_setting,
    warning_text,
)
from flightrec.settings import DEFAULT_TIMEOUT_S, SettingsError, load_settings
from tests.helpers import entries, load_dump, run_ranks
from tests.recorder import timeout_workers

# ---------------------------------------------------------------- the rule, by backend name


@pytest.mark.parametrize(("backend", "env", "expected"), [
    ("nccl", {}, True),  # PyTorch's default handles async errors (and aborts the process)
    ("NCCL", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, True),
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, True),
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}, True),  # CleanUpOnly: the op still ends
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, False),
    ("nccl", {"NCCL_ASYNC_ERROR_HANDLING": "0"}, False),  # the old name
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "0"}, True),  # the new name wins
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": " 0 "}, False),
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "off"}, True),  # not a number: PyTorch keeps its default
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}, True),
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_BLOCKING_WAIT": "true"}, True),
    ("nccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "0"}, False),
    ("hccl", {}, True),
    ("hccl", {"HCCL_ASYNC_ERROR_HANDLING": "0"}, False),
    ("hccl", {"HCCL_ASYNC_ERROR_HANDLING": "0", "HCCL_BLOCKING_WAIT": "1"}, True),
    ("hccl", {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, True),  # NCCL's variables are not HCCL's
    ("gloo", {}, False),
    ("gloo", {"TORCH_NCCL_BLOCKING_WAIT": "1"}, False),
    ("mpi", {}, False),
    ("ucc", {}, False),
])
def test_which_backends_end_ops_at_their_timeout(backend: str, env: dict[str, str], expected: bool) -> None:
    assert ends_ops_at_timeout(backend, env) is expected


def test_latest_safe_limit_leaves_half_or_the_margin() -> None:
    assert latest_safe_s(600) == 600 - DUMP_MARGIN_S == 570  # NCCL's default: the 300 s default stays
    assert latest_safe_s(60) == 30
    assert latest_safe_s(8) == 4
    assert latest_safe_s(100) == 70
    assert all(0 < latest_safe_s(t) < t for t in (0.5, 3, 59, 61, 1800))


def _nccl(seconds: float, read: bool = True) -> GroupTimeout:
    return GroupTimeout(seconds, "nccl", read, ends_ops=True)


GROUPS = {
    "0": _nccl(600),  # NCCL's default: latest safe 570, over the default: unchanged
    "1": _nccl(60),
    "2": GroupTimeout(5, "gloo", True, ends_ops=False),  # gloo: nothing changes, however short
    "3": _nccl(20, read=False),  # unreadable: c10d's default assumed (said so)
    "4": None,  # no timeout known at all
}


def test_derived_limits_when_the_setting_is_not_given() -> None:
    limits = derive_limits(DEFAULT_TIMEOUT_S, explicit=False, groups=GROUPS)
    assert {g: limits.seconds(g) for g in GROUPS} == {"0": 300, "1": 30, "2": 300, "3": 10, "4": 300}
    assert limits.seconds("never-seen") == 300
    assert "group 1's nccl timeout is 60s" in limits.note("1") and "limit 30s" in limits.note("1")
    assert "assumed" in limits.note("3") and "assumed" not in limits.note("1")
    assert limits.note("0") == limits.note("2") == ""
    short = derive_limits(10.0, explicit=False, groups=GROUPS)  # a lower default is kept where it is lower
    assert {g: short.seconds(g) for g in GROUPS} == {"0": 10, "1": 10, "2": 10, "3": 10, "4": 10}


def test_an_explicit_setting_is_applied_as_given_and_warned_about() -> None:
    limits = derive_limits(300.0, explicit=True, groups=GROUPS)
    assert {g: limits.seconds(g) for g in GROUPS} == {g: 300 for g in GROUPS}
    assert unsafe_setting(300.0, explicit=False, groups=GROUPS) is None  # derived: nothing to warn about
    assert unsafe_setting(9.0, explicit=True, groups=GROUPS) is None  # under every latest safe limit
    assert unsafe_setting(10.0, explicit=True, groups=GROUPS) is None  # exactly group 3's: still in time
    name, t, count = unsafe_setting(11.0, explicit=True, groups=GROUPS)
    assert (name, t.seconds, count) == ("3", 20, 1)
    name, t, count = unsafe_setting(580.0, explicit=True, groups=GROUPS)
    assert (name, t.seconds, count) == ("3", 20, 3)  # the shortest named, the others counted; gloo's 5 s never
    text = warning_text("FLIGHTREC_TIMEOUT", 580.0, name, t, count)
    assert "FLIGHTREC_TIMEOUT=580s" in text and "group '3'" in text and "20s" in text and "at most 10s" in text
    assert "2 more groups" in text


def test_settings_say_who_chose_the_timeout() -> None:
    assert load_settings({}).timeout_from == "default"
    assert load_settings({"FLIGHTREC_TIMEOUT": "5"}).timeout_from == "FLIGHTREC_TIMEOUT"
    assert load_settings({}, timeout_s=5).timeout_from == "enable()"
    assert load_settings({"FLIGHTREC_BUFFER": "10"}).as_dict()["timeout_from"] == "default"
    with pytest.raises(SettingsError, match="timeout_from"):
        load_settings({}, timeout_from="FLIGHTREC_TIMEOUT")


def test_torch_fr_summary_keeps_the_newest_entries_in_hang_dumps(monkeypatch: pytest.MonkeyPatch) -> None:
    fr = {"version": "2.10", "pg_status": {"0": {"last_completed_collective": "3"}},
          "entries": [{"record_id": i, "pg_id": 0, "profiling_name": "nccl:all_reduce", "collective_seq_id": i,
                       "state": "scheduled", "timeout_ms": 60000, "frames": [{"name": "f"}] * 20}
                      for i in range(40)]}
    assert torch_recorder.summary(None, hang=True) is None
    assert torch_recorder.summary(fr, hang=False) == {"pg_status": fr["pg_status"]}
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE", raising=False)
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/scratch/trace_")
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):  # NCCL's recorder: read only when set
        monkeypatch.delenv(name, raising=False)
    out = torch_recorder.summary(fr, hang=True)
    assert out["entries_total"] == 40 and out["version"] == "2.10"
    assert [e["record_id"] for e in out["entries"]] == list(range(40 - torch_recorder.KEPT_ENTRIES, 40))
    assert "frames" not in out["entries"][0] and out["entries"][-1]["timeout_ms"] == 60000
    assert out["dump_on_timeout"] is None and out["dump_prefix"] == "/scratch/trace_"
    assert out["nccl"] is None
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
    assert torch_recorder.summary(fr, hang=True)["dump_on_timeout"] is False


# ---------------------------------------------------------------- real gloo jobs


def _hang_dump(folder: Path, rank: int) -> dict:
    path = folder / f"hang-rank-{rank:05d}.json.gz"
    assert path.exists(), f"rank 1 found no hang dump of rank {rank} to keep before it joined"
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def _results(folder: Path) -> list[dict]:
    return [json.loads((folder / f"result-{rank}.json").read_text()) for rank in range(2)]


def test_gloo_groups_timeouts_are_read_and_change_nothing(tmp_path: Path) -> None:
    """init_process_group(timeout=40 s), new_group(timeout=7 s), new_group() (c10d's 30 min): read back
    from the groups, in the dump's group rows, and on gloo alone the watchdog keeps its default."""
    run_ranks(timeout_workers.gloo_groups, 2, str(tmp_path), timeout_s=90)
    for rank, result in enumerate(_results(tmp_path)):
        assert result["timeouts"] == {"world": 40, "short": 7, "plain": 1800}, result
        assert result["limits"] == {"world": 300, "short": 300, "plain": 300}, result
        assert result["settings"]["timeout_from"] == "default"
        if "after_set" in result:  # _set_pg_timeout (torch 2.2+) is seen on the next read
            assert result["after_set"] == {"world": 40, "short": 11, "plain": 1800}, result
        dump = load_dump(tmp_path, rank)
        rows = {g["name"]: g.get("timeout_s") for g in dump["groups"]}
        names = result["names"]
        assert rows[names["world"]] == 40 and rows[names["plain"]] == 1800
        assert rows[names["short"]] == (11 if "after_set" in result else 7)
        assert dump["settings"]["timeout_s"] == 300 and dump["settings"]["timeout_from"] == "default"
        assert dump["reason"] == "api" and "entries" not in (dump["torch_fr"] or {})  # not a hang dump


def test_simulated_nccl_group_dumps_under_its_timeout(tmp_path: Path) -> None:
    """FLIGHTREC_TIMEOUT unset, a group of 8 s counted as NCCL's (simulated, see the module docstring):
    the watchdog takes 4 s for its ops (300 s for the world's), and rank 0's `timeout` dump lands
    between 4 s and the group's 8 s; it carries PyTorch's recorder state (where this torch has one)."""
    run_ranks(timeout_workers.derived_limit, 2, str(tmp_path), timeout_s=90)
    results = _results(tmp_path)
    for result in results:
        assert result["limits"] == {"world": 300, "group": 4}, result
        assert result["timeouts"] == {"world": 1800, "group": 8}
        assert "limit 4s" in result["notes"]["group"] and result["notes"]["world"] == ""
    waiter = _hang_dump(tmp_path, 0)  # kept by rank 1 before it joined (the recovery rewrites rank-00000)
    assert waiter["reason"] == "timeout", waiter["reason"]
    group = results[0]["names"]["group"]
    assert f"group={group}" in waiter["reason_detail"] and "limit 4s" in waiter["reason_detail"]
    after_s = (waiter["dump_time_ns"] - results[0]["t_call_ns"]) / 1e9
    assert 4.0 <= after_s < 8.0, after_s
    assert results[0]["t_return_ns"] > waiter["dump_time_ns"]  # written while the op was still waiting
    pending = [e for e in entries(waiter) if e["group"] == group and e["op"] == "all_reduce"]
    assert pending and pending[-1]["state"] == "started"
    assert waiter["settings"]["timeout_s"] == 300 and waiter["settings"]["timeout_from"] == "default"
    assert {g["name"]: g["timeout_s"] for g in waiter["groups"]}[group] == 8
    assert _hang_dump(tmp_path, 1)["reason"] == "peer_request"  # asked by rank 0 while it slept
    for rank in (0, 1):  # the op completed after all: each final dump says so, and keeps the hang dump's time
        final = load_dump(tmp_path, rank)
        stall = [r for r in final.get("recovered", []) if r["group"] == group and r["op"] == "all_reduce"]
        assert final["reason"] == "exit" and len(stall) == 1, (final["reason"], final.get("recovered"))
        assert stall[0]["timed_out"] is (rank == 0)
        assert stall[0]["hang_reason"] == ("timeout", "peer_request")[rank]
        assert abs(stall[0]["hang_dump_ns"] - _hang_dump(tmp_path, rank)["dump_time_ns"]) < 1e9
    fr = waiter["torch_fr"]
    if torch_recorder.enabled():  # PyTorch's recorder (on by default where it exists)
        assert fr["dump_on_timeout"] is True and fr["dump_prefix"] == str(tmp_path / "torch_trace_rank_")
        assert 0 < len(fr["entries"]) <= min(fr["entries_total"], torch_recorder.KEPT_ENTRIES)
        last = fr["entries"][-1]
        assert last["timeout_ms"] == 8000 and last["profiling_name"].endswith("all_reduce"), last
        assert set(last) <= set(torch_recorder.ENTRY_FIELDS)
    else:
        assert fr is None


@pytest.mark.parametrize("simulated", [True, False], ids=["nccl-simulated", "gloo"])
def test_explicit_setting_past_a_group_timeout_warns_once(tmp_path: Path, simulated: bool,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """FLIGHTREC_TIMEOUT=10 with groups of 6 s and 8 s, then 9 s: the setting is applied as given; with
    the groups counted as NCCL's (simulated) each rank warns once, naming the 6 s group; on gloo, never."""
    run_ranks(timeout_workers.explicit_setting, 2, str(tmp_path), simulated, timeout_s=90)
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "too close to or past" in line]
    results = _results(tmp_path)
    for result in results:
        assert result["limits"] == {"six": 10, "eight": 10, "nine": 10}, result
        assert result["settings"]["timeout_from"] == "FLIGHTREC_TIMEOUT"
    if not simulated:
        assert warnings == [], warnings
        return
    assert len(warnings) == 2, err[-3000:]  # one per rank
    six = results[0]["names"]["six"]
    for line in warnings:
        assert "FLIGHTREC_TIMEOUT=10s" in line and f"group {six!r}" in line and "timeout of 6s" in line, line
        assert "1 more group" in line and "at most 3s" in line, line
