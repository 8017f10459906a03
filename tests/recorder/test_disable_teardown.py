"""`flightrec.disable()` and `destroy_process_group()`, in either order, leave nothing of the job alive.

A ProcessGroupGloo that outlives `destroy_process_group()` is destroyed at interpreter exit instead,
where its worker threads can no longer take the GIL: some exits (a race) die of SIGABRT.
Each job is two real gloo ranks on 127.0.0.1; every rank checks by weak reference that the group and
an unwaited Work are gone (a sure signal), and exits, whose code is the signal users see.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import JobFailed, entries, load_dump, run_ranks
from tests.recorder import teardown_workers

JOB_TIMEOUT_S = 90.0  # a whole batch shares 2 cores: every rank imports torch at once


def _run_jobs(out: Path, orders: list[str], armed_by_env: bool) -> None:
    """Run one two-rank job per order, side by side; fail listing every job that did not end with 0s."""

    def one(index: int, order: str) -> str | None:
        folder = out / f"job{index}"
        try:
            run_ranks(teardown_workers.disable_and_leave, 2, str(folder), order, armed_by_env, timeout_s=JOB_TIMEOUT_S)
        except JobFailed as exc:
            return f"job {index} ({order}): {exc}"
        return None

    with ThreadPoolExecutor(len(orders)) as pool:
        failures = [f for f in pool.map(one, range(len(orders)), orders) if f is not None]
    assert not failures, "\n".join(failures)


def test_disable_then_destroy_exits_cleanly(tmp_path: Path) -> None:
    _run_jobs(tmp_path, ["disable_first"] * 3 + ["destroy_first"], armed_by_env=False)


def test_autostarted_recorder_disabled_then_destroyed_exits_cleanly(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """FLIGHTREC=1 arms inside init_process_group, before torch chains its `[rankN]:` excepthook over ours."""
    monkeypatch.setenv("FLIGHTREC", "1")
    monkeypatch.setenv("FLIGHTREC_DIR", str(tmp_path / "dumps"))
    _run_jobs(tmp_path, ["disable_first", "disable_first"], armed_by_env=True)


def test_enable_after_disable_records_the_live_group(tmp_path: Path) -> None:
    run_ranks(teardown_workers.enable_again, 2, str(tmp_path), timeout_s=JOB_TIMEOUT_S)
    for rank in range(2):
        dump = load_dump(tmp_path, rank)
        assert [(e["op"], e["state"]) for e in entries(dump)] == [("all_reduce", "completed")] * 2, dump
        assert [g["size"] for g in dump["groups"]] == [2], dump["groups"]
