"""Settings, ring, enable/disable, fork and start-up behaviour of the recorder."""

from __future__ import annotations

import gc
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flightrec.record import entry as entry_module
from flightrec.record import fastpath, native, torch_compat
from flightrec.record.ring import Ring
from flightrec.settings import Settings, SettingsError, load_settings
from tests.child import command, env_with_root, facts
from tests.helpers import entries, load_dump, run_ranks
from tests.recorder import workers

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.recorder.one_rank_jobs"


def test_defaults_are_the_documented_ones() -> None:
    s = load_settings({})
    assert s == Settings(dir="./flightrec-dumps", buffer=2000, timeout_s=300.0, stacks=False, dump_on_exit=False)


def test_settings_from_environment() -> None:
    s = load_settings({"FLIGHTREC_DIR": "/x", "FLIGHTREC_BUFFER": "10", "FLIGHTREC_TIMEOUT": "1.5",
                       "FLIGHTREC_STACKS": "1", "FLIGHTREC_DUMP_ON_EXIT": "1"})
    assert (s.dir, s.buffer, s.timeout_s, s.stacks, s.dump_on_exit) == ("/x", 10, 1.5, True, True)


@pytest.mark.parametrize("name,value", [
    ("FLIGHTREC_BUFFER", "lots"), ("FLIGHTREC_BUFFER", "0"), ("FLIGHTREC_TIMEOUT", "-1"),
    ("FLIGHTREC_TIMEOUT", "nan"), ("FLIGHTREC_STACKS", "maybe"), ("FLIGHTREC_DUMP_ON_EXIT", "2"), ("FLIGHTREC_DIR", " "),
])
def test_invalid_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


@pytest.mark.parametrize("raw,seconds", [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("500ms", 0.5),
                                         ("45", 45.0), (" 2.5S ", 2.5)])
def test_timeout_takes_a_duration_with_its_unit(raw: str, seconds: float) -> None:
    assert load_settings({"FLIGHTREC_TIMEOUT": raw}).timeout_s == seconds
    assert load_settings({"FLIGHTREC_SNAPSHOT_S": raw}).snapshot_s == seconds


def test_an_unreadable_timeout_names_the_accepted_forms() -> None:
    with pytest.raises(SettingsError, match=r"FLIGHTREC_TIMEOUT='5 minutes'.*500ms, 30s, 5m, 1h"):
        load_settings({"FLIGHTREC_TIMEOUT": "5 minutes"})


def test_invalid_value_turns_the_recorder_off_not_the_job() -> None:
    env = env_with_root(FLIGHTREC="1", FLIGHTREC_TIMEOUT="soon")
    out = subprocess.run(command(JOBS, "armed_or_off"), capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and facts(out.stdout) == {"armed": False}, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "flightrec" in line]
    assert len(lines) == 1 and "FLIGHTREC_TIMEOUT='soon'" in lines[0] and "30s, 5m" in lines[0]


def test_startup_hook_arms_only_when_asked() -> None:
    job = command(JOBS, "startup_hook")
    off = subprocess.run(job, capture_output=True, text=True, timeout=60,
                         env=env_with_root({k: v for k, v in os.environ.items() if k != "FLIGHTREC"}))
    on = subprocess.run(job, capture_output=True, text=True, timeout=60, env=env_with_root(FLIGHTREC="1"))
    assert off.returncode == 0 and on.returncode == 0, off.stderr[-2000:] + on.stderr[-2000:]
    assert facts(off.stdout) == {"torch_at_start": False, "wrapped_once_imported": False,
                                 "wrapped_once_joined": False}, off.stderr
    # the hook itself imports no torch, and arms only once the process joins a group
    assert facts(on.stdout) == {"torch_at_start": False, "wrapped_once_imported": False,
                                "wrapped_once_joined": True}, on.stderr


def test_ring_wraps_in_constant_memory() -> None:
    ring: Ring[int] = Ring(4)
    for _ in range(10):
        i = ring.next_id()
        ring.put(i, i)
    assert sorted(ring.snapshot()) == [6, 7, 8, 9]
    assert ring.recorded == 10 and ring.dropped == 6 and len(ring._slots) == 4


def test_ring_counts_what_writers_stored_directly() -> None:
    """The C hot path fills slots itself (no `put`): `recorded` finds the newest id stored, past ids
    taken but never stored (a write that failed) and ids taken but not stored yet (a write under way)."""
    @dataclass
    class Item:
        id: int

    ring: Ring[Item] = Ring(8)
    for _ in range(11):
        i = ring.next_id()
        ring.slots[i % 8] = Item(i)
    assert ring.recorded == 11 and ring.dropped == 3
    hole = ring.next_id()  # taken, never stored
    assert ring.recorded == 11
    i = ring.next_id()
    ring.slots[i % 8] = Item(i)
    assert hole == 11 and ring.recorded == 13 and ring.dropped == 5
    ring.next_id()  # taken, not stored yet
    assert ring.recorded == 13


def test_ring_wrap_in_a_real_job(tmp_path: Path) -> None:
    run_ranks(workers.ring_wrap, 2, str(tmp_path), 16, 50, timeout_s=60)
    for rank in range(2):
        dump = load_dump(tmp_path, rank)
        rows = entries(dump)
        assert len(rows) == 16 and dump["dropped"] == 34 and dump["recorded"] == 50
        assert [e["seq"] for e in rows] == list(range(35, 51))


def test_ddp_cpp_allreduces_are_recorded(tmp_path: Path) -> None:
    run_ranks(workers.ddp_training, 2, str(tmp_path), timeout_s=90)
    per_rank = []
    for rank in range(2):
        rows = entries(load_dump(tmp_path, rank))
        cpp = [e for e in rows if e["source"] == "c++"]
        # DDP init (broadcasts from C++) and one gradient all-reduce per backward
        if not torch_compat.has_builtin_recorder():  # the dump says so; C++ ops are there, without their detail
            assert cpp and all(e["api"] == "c++" and e["op"] == "unknown" for e in cpp), cpp
            assert "cpp_op_detail" in {x["what"] for x in load_dump(tmp_path, rank)["not_recorded"]}
            per_rank.append([(e["group"], e["seq"], e["op"]) for e in rows])
            continue
        reduces = [e for e in cpp if e["op"] == "all_reduce"]
        assert len(reduces) == 3, cpp
        assert all(e["api"] == "c++" and e["state"] == "completed" for e in reduces)
        assert all(e["in_shapes"] for e in reduces)
        per_rank.append([(e["group"], e["seq"], e["op"]) for e in rows])
    assert per_rank[0] == per_rank[1]


def test_predicted_counter_steps_keep_cpp_ops_and_pg_seqs_exact(tmp_path: Path) -> None:
    """Once the recorder predicts the backend counter instead of reading it after each call, a
    collective issued from C++ between two Python ones is still recorded in its place, and every
    entry keeps the counter value the backend gave it."""
    run_ranks(workers.predicted_counter_steps, 2, str(tmp_path), timeout_s=90)
    per_rank = []
    for rank in range(2):
        rows = [e for e in entries(load_dump(tmp_path, rank)) if e["group"] == "0"]
        ops = [("c++" if e["source"] == "c++" else e["op"]) for e in rows]
        reduces = [i for i, op in enumerate(ops) if op == "all_reduce"]
        cpp = [i for i, op in enumerate(ops) if op == "c++"]
        assert len(reduces) == 60 and len(cpp) == 3, ops
        # after the 21st and 22nd Python all_reduce, and after the 46th
        assert [sum(1 for i in reduces if i < c) for c in cpp] == [21, 22, 46]
        colls = [e for e in rows if e["kind"] == "coll"]
        assert [e["seq"] for e in colls] == list(range(colls[0]["seq"], colls[0]["seq"] + 63))
        # gloo moves its counter once per collective, and once per p2p op too from torch 2.2 on (2.1: not
        # at all): every entry keeps the value the backend gave it, whichever way this torch counts
        pg_seqs = [e["pg_seq"] for e in rows]
        steps = [(rows[i]["kind"], pg_seqs[i] - pg_seqs[i - 1]) for i in range(1, len(rows))]
        assert all(step == 1 for kind, step in steps if kind != "p2p"), pg_seqs
        assert {step for kind, step in steps if kind == "p2p"} in ({0}, {1}), pg_seqs
        per_rank.append([(e["seq"], e["op"] if e["source"] != "c++" else "c++") for e in colls])
    assert per_rank[0] == per_rank[1]


@pytest.mark.parametrize("fastpath_on", ["1", "0"], ids=["c-path", "python-path"])
def test_a_counter_step_that_changes_is_learned_again(tmp_path: Path, fastpath_on: str) -> None:
    """A backend whose counter starts moving by 2 per all_reduce: once a recheck has seen it, the
    recorder predicts the new step. The C path's copy of the trusted step must not outlive the
    change, or every call would be followed by a phantom C++ op until the job ends."""
    env = env_with_root(FLIGHTREC_FASTPATH=fastpath_on)
    out = subprocess.run(command(JOBS, "counter_step_change", tmp_path), capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = facts(out.stdout)
    if fastpath_on == "1" and fastpath._fastpath is not None and fastpath._fastpath.SUPPORTED:
        assert got["c_path"], "the C path was not in use"
    assert (got["ops"], got["steps"]) == (["all_reduce"], [2]), (got, out.stderr[-2000:])


def test_disable_restores_everything() -> None:
    out = subprocess.run(command(JOBS, "disable_restores"), capture_output=True, text=True, timeout=60,
                         env=env_with_root())
    assert out.returncode == 0, out.stderr[-2000:]
    got = facts(out.stdout)
    assert got["enabled"] and got["wrapped"] and got["handler_replaced"], got  # armed, it did replace them
    assert got["changed"] == [], got["changed"]
    assert got["work_wait_restored"] and got["handler_restored"] and got["wakeup_fd"] == -1, got
    assert got["watchdogs"] == [], got


def test_forked_child_neither_records_nor_watches(tmp_path: Path) -> None:
    out = subprocess.run(command(JOBS, "forked_child", tmp_path), capture_output=True, text=True, timeout=60,
                         env=env_with_root())
    assert out.returncode == 0, out.stderr[-2000:]
    got = facts(out.stdout)
    assert got["child"] == {"disarmed": True, "recorder_off": True, "no_watchdog": True, "exception_hook_off": True}
    assert (got["recorded"], got["active"]) == (1, True), got


def test_sigterm_handler_chains_to_a_user_handler(tmp_path: Path) -> None:
    out = subprocess.run(command(JOBS, "sigterm_chains", tmp_path), capture_output=True, text=True, timeout=60,
                         env=env_with_root())
    assert out.returncode == 0, out.stderr[-2000:]
    got = facts(out.stdout)
    assert got["hits"] == [got["sigterm"]] and got["dumped"], (got, out.stderr[-2000:])
    assert signal.SIGTERM  # the parent is untouched


@pytest.mark.parametrize("fast", ["1", "0"])
def test_the_call_site_is_the_users_line_past_library_frames(fast: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An op issued from inside a library (an FSDP2 hook under torch's no_grad decorator) is placed at the
    user's line that called the library, in the C hot path and the Python wrapper alike; with no user
    frame on the stack, at the first library frame."""
    if fast == "1" and not fastpath.available():
        pytest.skip("the C hot path is not built")
    monkeypatch.setenv("FLIGHTREC_FASTPATH", fast)
    run_ranks(workers.through_a_library, 2, str(tmp_path), timeout_s=60)
    sites = [row["site"] for row in entries(load_dump(tmp_path, 1)) if row["op"] == "all_reduce"]
    user = f"{workers.__file__}:{_line_of(workers.__file__, '# the user' + chr(39) + 's line')} in through_a_library"
    assert sites == [user] * 3 + [f"{workers.LIBRARY_FILE}:3 in decorate_context"], sites


def _line_of(path: str, marker: str) -> int:
    return next(i for i, text in enumerate(Path(path).read_text().splitlines(), 1) if marker in text)


def test_full_stacks_when_asked(tmp_path: Path) -> None:
    run_ranks(workers.with_stacks, 2, str(tmp_path), timeout_s=60)
    row = entries(load_dump(tmp_path, 1))[0]
    assert row["site"].endswith("in _nested_call")
    assert row["stack"][-1].endswith("in _nested_call") and row["stack"][-2].endswith("in with_stacks")
    assert load_dump(tmp_path, 1)["settings"]["stacks"] is True


def test_templates_hold_each_distinct_op_once_and_defaults_are_left_out() -> None:
    from flightrec.format.packed import is_packed, plain
    from flightrec.record.entry import Entry, to_tables

    colls = [Entry(i, "0", "coll", "all_reduce", "all_reduce") for i in range(3)]
    for e in colls:
        e.state, e.t_enqueue_ns, e.t_complete_ns = "completed", 10 + e.id, 20 + e.id
    packed, templates = to_tables(colls)
    assert all(is_packed(v) or is_packed(v["codes"]) for v in packed.values())  # integers packed
    cols = {k: plain(v) for k, v in packed.items()}
    assert cols["template"] == [0, 0, 0] and templates["op"] == {"values": ["all_reduce"], "codes": [0]}
    assert not {"peer", "root", "is_async"} & set(templates) and not {"unit", "error", "stack"} & set(cols)
    assert cols["id"] == [0, 1, 2] and cols["t_complete_ns"] == [20, 21, 22]
    assert cols["state"] == {"values": ["completed"], "codes": [0, 0, 0]}
    colls[1].peer, colls[2].is_async, colls[0].unit = 3, True, 0
    colls[2].t_complete_ns = None
    packed, templates = to_tables(colls)
    cols = {k: plain(v) for k, v in packed.items()}
    assert cols["template"] == [0, 1, 2] and cols["unit"] == [0, -1, -1] and cols["t_complete_ns"] == [20, 21, None]
    assert templates["peer"] == [-1, 3, -1] and templates["is_async"] == [False, False, True] and "root" not in templates


def test_c_hot_path_is_built_where_a_compiler_is() -> None:
    """The install builds flightrec/record/_fastpath.c when it can: a silent fallback would cost ~2x per op."""
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[:1]
    if not compiler or shutil.which(compiler[0]) is None:
        pytest.skip("no C compiler: the recorder is pure Python here")
    assert fastpath._fastpath is not None, "flightrec/record/_fastpath.c was not built by `pip install`"
    assert fastpath._fastpath.SUPPORTED or sys.version_info < (3, 11)


def _storages() -> list[type]:
    """Entry over each storage this build has: Python slots, and the C hot path's EntryBase."""
    methods = {name: vars(entry_module.Entry)[name] for name in ("__init__", "reset", "pending")}
    kinds = [entry_module._PyStorage]
    if fastpath._fastpath is not None and fastpath._fastpath.SUPPORTED:
        kinds.append(fastpath._fastpath.EntryBase)
    return [type(f"Entry_{kind.__name__}", (kind,), {"__slots__": (), **methods}) for kind in kinds]


@pytest.mark.parametrize("entry_type", _storages(), ids=lambda t: t.__name__)
def test_entry_storages_hold_the_same_fields_with_the_same_defaults(entry_type: type) -> None:
    """The dump, the watchdog and the Python wrapper read an Entry by its attributes: the C storage
    must hold every field the Python one has, with the same defaults and the same None-able times."""
    e = entry_type(7, "0", "coll", "all_reduce", "all_reduce")
    reference = _storages()[0](7, "0", "coll", "all_reduce", "all_reduce")
    for name in entry_module.FIELDS:
        assert getattr(e, name) == getattr(reference, name), name
    assert e.pending and e.t_complete_ns is None and e.is_async is False
    for name, value in (("id", 2**40), ("seq", 3), ("pg_seq", -1), ("peer", 5), ("root", 0), ("unit", 9),
                        ("t_enqueue_ns", 10**18), ("t_complete_ns", 10**18 + 1), ("t_dev_start_ns", 1),
                        ("t_dev_end_ns", 2), ("is_async", True), ("state", "completed"), ("error", "E: x"),
                        ("inputs", ((torch.Size([2]), torch.float32),)), ("site", None), ("work", object())):
        setattr(e, name, value)
        assert getattr(e, name) == value, name
    assert not e.pending
    e.t_complete_ns = None
    assert e.t_complete_ns is None
    e.reset(8, "1", "p2p", "send", "isend")
    assert (e.id, e.group, e.kind, e.t_dev_end_ns, e.work, e.state) == (8, "1", "p2p", None, None, "started")


def test_c_entry_storage_refuses_what_it_cannot_hold() -> None:
    if fastpath._fastpath is None or not fastpath._fastpath.SUPPORTED:
        pytest.skip("the C hot path is not built")
    e = _storages()[1](1, "0", "coll", "all_reduce", "all_reduce")
    with pytest.raises(TypeError):
        e.seq = "3"
    with pytest.raises(TypeError):
        e.is_async = 1  # as a Python Entry never gets: the wrappers store bools
    with pytest.raises(AttributeError):
        e.not_a_field = 1
    for state in entry_module.STATES:  # kept as an index in C: every state, and only those
        e.state = state
        assert e.state == state
    with pytest.raises(ValueError, match="'done'"):
        e.state = "done"


def test_c_entry_storage_is_seen_by_the_garbage_collector() -> None:
    """An Entry can sit in a cycle (its Work's future callback holds it): the C storage must let
    the collector break it."""
    if fastpath._fastpath is None or not fastpath._fastpath.SUPPORTED:
        pytest.skip("the C hot path is not built")

    class Holder:
        pass

    e = _storages()[1](1, "0", "coll", "all_reduce", "all_reduce")
    holder = Holder()
    holder.entry, e.work = e, holder
    alive = weakref.ref(holder)
    del e, holder
    gc.collect()
    assert alive() is None


def test_ring_ids_count_like_itertools_count() -> None:
    ring = Ring(4)
    assert [ring.next_id() for _ in range(5)] == list(itertools.islice(itertools.count(), 5))
    c_module = native.c_module()
    if c_module is not None:
        assert type(ring.ids) is c_module.Counter and ring.ids.next == 5


def test_group_storages_hold_the_same_fields() -> None:
    """GroupState keeps its counters in C where the hot path is built: same fields, same values."""
    from flightrec.record import groups

    class FakeGroup:
        def _get_sequence_number_for_group(self) -> int:
            return 5

    pg = FakeGroup()
    kinds = [groups._PyStorage] + ([fastpath._fastpath.GroupBase] if fastpath._fastpath is not None
                                   and fastpath._fastpath.SUPPORTED else [])
    methods = {k: v for k, v in vars(groups.GroupState).items() if k not in ("__slots__", "__module__", "__doc__")}
    states = [type(f"GroupState_{kind.__name__}", (kind,), {**methods, "__slots__": ()})(pg, "7", "d", "gloo", [0, 3], 1)
              for kind in kinds]
    for state in states:
        assert (state.coll_seq, state.last_pg_seq, state.busy, state.ranks, state.global_rank(1)) == (5, 5, 0, [0, 3], 3)
        state.busy += 1
        state.coll_seq += 2
        state.last_pg_seq = 2**40
        assert (state.busy, state.coll_seq, state.last_pg_seq) == (1, 7, 2**40)
        for name in groups.FIELDS:
            assert getattr(state, name) == getattr(states[0], name), name
    if fastpath._fastpath is not None and fastpath._fastpath.SUPPORTED:
        assert groups.GroupState.__mro__[1] is fastpath._fastpath.GroupBase
        assert entry_module.Entry.__mro__[1] is fastpath._fastpath.EntryBase


def test_async_slot_empties_in_one_step_and_only_for_its_entry() -> None:
    """The watchdog releases a completed op's slot while the training thread may fill it with the
    next one: release must take both fields at once, and only for the entry it was given."""
    if fastpath._fastpath is None or not fastpath._fastpath.SUPPORTED:
        pytest.skip("the C hot path is not built")
    slot = fastpath._fastpath.AsyncSlot()
    assert slot.work is None and slot.entry is None
    work, entry, other = object(), _storages()[1](1, "0", "coll", "all_reduce", "all_reduce"), object()
    slot.work, slot.entry = work, entry
    assert slot.release(other) is False and slot.entry is entry and slot.work is work
    assert slot.release(entry) is True and slot.work is None and slot.entry is None


def test_default_group_is_described_where_the_start_up_hook_arms() -> None:
    """The start-up hook arms inside `_update_default_pg`; torch 2.1 records the default group's members
    only after it returns. The group must be describable right there, so the recorder counts DDP's C++
    ops from the first (else a DDP stall could leave no dump at all)."""
    from fixtures.launch import free_port

    env = env_with_root({k: v for k, v in os.environ.items() if k != "FLIGHTREC"})
    out = subprocess.run(command(JOBS, "default_group_described", free_port()), capture_output=True, text=True,
                         env=env, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    (row, *_) = facts(out.stdout)["described"]
    assert (row["name"], row["ranks"], row["rank_in_group"]) == ("0", [0], 0), row


def test_every_api_reader_reads_what_its_spec_says() -> None:
    """The recorder's per-API reader (one itemgetter per positional count) gives, for every API and any
    number of positional arguments with or without keywords, what reading each parameter by name gives."""
    import torch.distributed as dist

    from flightrec.record.ops import SPECS

    checked = []
    for base in SPECS:
        fn = getattr(dist, base.api, None)
        if fn is None:
            continue
        checked.append(base.api)
        spec = base.bind_positions(fn)
        names = spec.read_names()
        read = spec.reader(names)
        params = list(spec.positions)
        for count in range(len(params) + 2):
            args = tuple(f"arg{i}" for i in range(count))
            for kwargs in ({}, {params[-1]: "by-name"} if params and count < len(params) else {}):
                expected = tuple(spec.arg(args, kwargs, n) if n else None for n in names)
                assert read(args, kwargs) == expected, (spec.api, count, kwargs)
    assert {"all_reduce", "send", "irecv", "broadcast", "all_to_all_single", "batch_isend_irecv"} <= set(checked)


def test_backend_errors_are_told_from_the_jobs_own() -> None:
    """Only an error a collective backend raised marks the C++-issued op in flight failed (fail_cpp_ops)."""
    from flightrec.record.recorder import is_backend_error

    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:52120. This is typically caused by a remote worker crashing.")
    assert is_backend_error(RuntimeError(gloo))
    assert is_backend_error(RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                                         "waiting 1800000ms for recv operation to complete"))
    assert is_backend_error(torch.distributed.DistBackendError("NCCL communicator was aborted on rank 1."))
    assert not is_backend_error(ValueError("gradient check failed in RaiseInBackward.backward"))
    assert not is_backend_error(RuntimeError("DataLoader worker (pid 123) exited unexpectedly"))


def test_the_timeout_checks_filter_in_c_finds_what_the_python_walk_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Recorder.in_flight(issued_before_ns)` filters the tables in C (`_fastpath.issued_before`) where it is
    built: the same ops as the Python walk, and exactly the pending ones issued before the limit."""
    from flightrec.record import recorder as recorder_module
    from flightrec.settings import load_settings

    rec = recorder_module.Recorder(load_settings({}))
    made = []
    for i, (state, t_ns) in enumerate([("started", 10), ("started", 90), ("completed", 5), ("failed", 5),
                                        ("enqueued", 40), ("started", 50), ("started", 100), ("started", 0)]):
        entry = entry_module.Entry(i, "0", "coll", "all_reduce", "all_reduce")
        entry.state, entry.t_enqueue_ns = state, t_ns
        made.append(entry)
    rec.pending.update({e.id: e for e in made[:3]})
    rec.by_work.update({1000 + e.id: e for e in made[2:5]})  # entry 2 and 4 in two tables
    rec.polled.update({e.id: e for e in made[4:7]})
    expected = [0, 4, 5]  # pending, issued before 60; 7 is in no table
    c_filter = recorder_module._C_ISSUED_BEFORE
    if c_filter is not None:  # the C filter itself (in_flight would fall back to the walk if it raised)
        assert fastpath.available()
        assert sorted({e.id for e in c_filter((rec.pending, rec.by_work, rec.polled), 60)}) == expected
    c_found = sorted(e.id for e in rec.in_flight(60))
    monkeypatch.setattr(recorder_module, "_C_ISSUED_BEFORE", None)
    assert sorted(e.id for e in rec.in_flight(60)) == expected == c_found
    assert sorted(e.id for e in rec.in_flight()) == [0, 1, 4, 5, 6]
    assert c_filter is not None or os.environ.get("FLIGHTREC_FASTPATH") == "0"


class _StreamWork:
    """A device stream's Work as the in-order poll asks it: done or not, never failed."""

    def __init__(self, done: bool) -> None:
        self.done, self.asked = done, 0

    def is_completed(self) -> bool:
        self.asked += 1
        return self.done

    def exception(self) -> None:
        return None


def _stream_op(record_id: int, work: _StreamWork | None) -> entry_module.Entry:
    op = entry_module.Entry(record_id, "0", "coll", "all_reduce", "all_reduce")
    op.work = work
    return op


def test_the_in_order_poll_reads_each_work_from_its_entry_when_asked() -> None:
    """A stream's ops are listed as entries (no per-op tuple): the poll reads the Works it asks (the newest,
    the one before it, then O(log n) by bisection). An entry settled since the walk (its Work let go: a
    failed wait) never counts as done, so no op before it is completed on its account; a settled newest
    sends the stream op by op."""
    from flightrec.record.recorder import _done_in_order

    works = [_StreamWork(i < 5) for i in range(8)]
    ops = [_stream_op(i, w) for i, w in enumerate(works)]
    assert _done_in_order(ops) == 5
    assert sum(w.asked for w in works) <= 5  # the newest, the one before it, then log2(6) by bisection
    works[5].done = works[6].done = True
    for work in works:
        work.asked = 0
    assert _done_in_order(ops) == 7  # all but the newest, just queued (a GPU that keeps up) ...
    assert sum(w.asked for w in works) == 2  # ... in two queries
    works[7].done = True
    ops[3].work = None  # failed meanwhile: it may have timed out behind a stuck op 2
    assert _done_in_order(ops) == 8  # the newest is done: in issue order, so is every op before it
    works[6].done = works[7].done = False
    assert _done_in_order(ops) == 3  # not past the settled op 3: the next poll, without it, goes on
    ops[7].work = None
    assert _done_in_order(ops) is None  # one by one


@pytest.mark.skipif(not fastpath.available(), reason="the C hot path is off or not built")
def test_the_polls_completion_leaves_an_op_settled_since_the_walk_as_it_is() -> None:
    """`_fastpath.complete_unmeasured`, as `Recorder._complete_unmeasured`'s Python reference: only ops
    still pending are completed; one marked failed between the walk and the completion stays failed."""
    complete = native.c_module().complete_unmeasured
    pending, failed = _stream_op(1, _StreamWork(True)), _stream_op(2, None)
    failed.state, failed.error = "failed", "RuntimeError: aborted"
    polled = {1: pending, 2: failed}
    complete([pending, failed], {}, {}, polled, None)
    assert (pending.state, pending.work, pending.t_complete_ns) == ("completed", None, None)
    assert (failed.state, failed.error) == ("failed", "RuntimeError: aborted")
    assert polled == {2: failed}
