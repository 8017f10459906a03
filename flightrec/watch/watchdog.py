"""The watchdog thread: notices hangs, failures and requests, and has the dumps written.

It never blocks on anything the training thread holds: it reads the ring by snapshot, talks to the
store through its own client, and waits with `select` on the signal pipe so a SIGTERM is handled
within milliseconds even when the main thread is stuck in C++.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import launchers, log
from ..format.names import dump_filename
from ..identity import process_rank, restart_attempt
from ..record import torch_recorder
from ..record.entry import Entry, format_site
from ..record.group_timeouts import Limits, derive_limits, unsafe_setting, warning_text
from ..record.recorder import Recorder
from ..settings import Settings
from . import recovery
from .dump_requests import LONGEST_STORE_CALL_S, FileTrigger, StoreTrigger
from .dump_writer import joined
from .gil_watch import GilWatch, limit_for
from .live import Live
from .on_hang import (
    HANG_REQUEST,
    UNCONFIRMED_REQUEST,
    HangAction,
    find_suspects,
    parse_answers,
    peer_what,
    position_key,
)
from .signals import TermHandler

_DISCOVER_EVERY_S = 0.5
_FR_STATUS_EVERY_S = 1.0
_PEER_REQUEST_EVERY_S = 5.0
# Every rank polls the job's store: at 16k ranks, once a second is 16k requests/s on one host
# (PyTorch's own NCCL monitor checks its store as often: TORCH_NCCL_COORD_CHECK_MILSEC=1000).
_STORE_POLL_EVERY_S = 1.0
_TIMEOUTS_EVERY_S = 5.0  # re-read the groups' timeouts (a job may change them with _set_pg_timeout)


CPP_SITE = "issued from C++ (e.g. DDP's Reducer)"


def describe(entry: Entry) -> str:
    where = format_site(entry.site) or (CPP_SITE if entry.source == "c++" else "an unknown call site")
    target = f" peer={entry.peer}" if entry.kind == "p2p" else ""
    op = entry.op if entry.op != "unknown" else "a collective"
    return f"{op} group={entry.group} seq={entry.seq}{target} {'' if where == CPP_SITE else 'at '}{where}"


class Watchdog:
    def __init__(self, rec: Recorder, settings: Settings, dump: Callable[..., bool],
                 term: TermHandler) -> None:
        self.rec = rec
        self.settings = settings
        self._dump_fn = dump
        self.term = term
        # faulthandler's C timer, re-armed from here: it writes the stacks when this thread cannot run
        self.gil = GilWatch(limit_for(settings.timeout_s, settings.watchdog_tick_s)) if settings.gil_watch else None
        self.store = StoreTrigger()
        self.files = FileTrigger(settings.dir)
        self.hang = HangAction(settings)  # FLIGHTREC_ON_HANG: told of every hang dump
        self.live = Live(settings, self.store)  # pace published; on rank 0, straggler alerts (watch/live.py)
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._failures: list[tuple[Entry, bool]] = []
        self._fired: set[int] = set()
        self._next_discover = 0.0
        self._next_fr = 0.0
        self._next_store_poll = 0.0
        self._next_snapshot = time.monotonic() + settings.snapshot_s
        self._last_peer_request = -1e18
        self._answered: set[str] = set()  # hang positions this rank told the store where it is (watch/on_hang.py)
        self.last_dump_mono_ns = 0
        self._recorded_seen = -1  # ring.recorded at the last change, and when it changed: see _silent_cpp_op
        self._recorded_since_ns = 0
        self.limits = Limits(settings.timeout_s)  # per group: derived from the groups' timeouts (record/group_timeouts.py)
        self._limits_gen = -1
        self._next_timeouts = 0.0
        self._warned_below = float("inf")  # the shortest group timeout already warned about
        self._stall: recovery.Stall | None = None  # the op a declared hang waits on here (watch/recovery.py)
        self._recovery_lock = threading.Lock()  # the exit hook checks too: one record and one line per stall
        self.recoveries: list[dict[str, Any]] = []  # the dump's `recovered` records, newest last
        self.recovered_count = 0  # stalls that recovered (recoveries keeps the latest few)
        self._thread = threading.Thread(target=self._run, name="flightrec-watchdog", daemon=True)

    def start(self) -> None:
        if self.gil is not None:
            self.gil.install()
        self._thread.start()

    def stop(self, timeout: float = LONGEST_STORE_CALL_S + 1.0) -> None:
        """Wait out the tick in progress: a daemon thread still inside a C++ call when the
        interpreter finalises dies through std::terminate and takes the process with it."""
        self._stop.set()
        self.wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.gil is not None:
            self.gil.stop()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1  # a late wake() must not write to whatever file reuses the number

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def notify_failure(self, entry: Entry, dumped: bool) -> None:
        self._failures.append((entry, dumped))
        self.wake()

    def before_fork(self) -> None:
        if self.gil is not None:
            self.gil.before_fork()

    def discard_unused_stacks(self) -> None:
        """The process is about to die of a signal (no atexit): cancel the held-GIL timer and remove its
        file if it never fired."""
        if self.gil is not None:
            self.gil.stop()

    def after_fork_in_parent(self) -> None:
        if self.gil is not None:
            self.gil.tick()  # at once: the training thread may hold the GIL from here on

    def dumped_now(self) -> None:
        self.last_dump_mono_ns = time.monotonic_ns()

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        tick = self.settings.watchdog_tick_s
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive its own bugs
                if sys.is_finalizing():
                    return
                log.warn_once(f"watchdog-{type(exc).__name__}", f"watchdog error: {exc!r}")
            fds = [self._wake_r] + ([self.term.read_fd] if self.term.read_fd >= 0 else [])
            try:
                ready, _, _ = select.select(fds, [], [], tick)
            except (OSError, ValueError):
                if self._stop.wait(tick):
                    return
                continue
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass

    def _watch_gil(self, grace_s: float = 0.0) -> None:
        """Re-arm the held-GIL timer; its file is opened once this process is a rank (joined a group: a
        spawned DataLoader worker that inherited RANK never is), under the name of the rank's dump."""
        gil = self.gil
        if gil is None:
            return
        if not gil.opened:
            rank = process_rank()[0] if joined() else -1
            if rank < 0:
                return
            try:
                attempt = restart_attempt()
                gil.open(self.settings.dir, dump_filename(rank, attempt), rank, attempt)
            except OSError as exc:
                self.gil = None
                log.warn_once("gil-watch-file", f"cannot create the stacks file in {self.settings.dir}: {exc!r}")
                return
        gil.tick(grace_s)

    def _dump(self, reason: str, detail: str | None, on_demand: bool = False) -> bool:
        self._watch_gil(LONGEST_STORE_CALL_S)  # a dump takes this thread a while: no stacks for that
        return self._dump_fn(reason, detail, on_demand=on_demand)

    def _tick(self) -> None:
        self._watch_gil()
        if self.term.drain():
            self.term.handle_from_watchdog()
            return
        if self.hang.due():
            self._read_suspects()
            if not self.hang.hold(launchers.known_rank()):  # a suspect that answered exits first
                self.discard_unused_stacks()  # os._exit follows: no atexit
                self.hang.abort()  # FLIGHTREC_ON_HANG=abort: the others had their grace period; never returns
        self._handle_failures()
        rec = self.rec
        now = time.monotonic()
        rec.catch_up(wait=True)
        if now >= self._next_discover:
            self._next_discover = now + _DISCOVER_EVERY_S
            rec.groups.discover()
        if now >= self._next_timeouts:
            self._next_timeouts = now + _TIMEOUTS_EVERY_S
            rec.groups.refresh_timeouts()
        if rec.groups.timeouts_gen != self._limits_gen:
            self._update_limits()
        rec.scan_cpp_ops()
        if now >= self._next_fr:
            self._next_fr = now + _FR_STATUS_EVERY_S
            self._update_cpp_states()
        self._check_timeouts()
        self.check_recovery()
        reason = self.files.poll()
        if reason is not None:
            self._dump(reason, "dump requested through the dump folder", on_demand=True)
        if self.settings.snapshot_s > 0 and now >= self._next_snapshot:
            self._next_snapshot = now + self.settings.snapshot_s  # written here: the training thread never waits
            self._dump("snapshot", f"every {self.settings.snapshot_s:g} s (FLIGHTREC_SNAPSHOT_S)")
        if self.live.due(now) and not self._stop.is_set() and joined():
            rank, world_size = process_rank()
            if rank >= 0:
                self.live.run(rec.ring.snapshot(), rank, world_size, restart_attempt(), now)
        if self._stop.is_set() or now < self._next_store_poll:
            return  # no new store call once stopping: it could outlast the join
        self._next_store_poll = now + _STORE_POLL_EVERY_S
        if self.hang.abort_at is not None:
            self._read_suspects()  # for the abort line, should the launcher's SIGTERM come first
        request = self.store.poll()
        if request is not None:
            written = self._dump("peer_request", request[1])
            if request[1].startswith((HANG_REQUEST, UNCONFIRMED_REQUEST)):
                what = peer_what(request[1])
                confirmed = request[1].startswith(HANG_REQUEST)
                self.hang.hung(what, written, confirmed=confirmed)
                if confirmed:
                    self._answer(what)
                self._watch_position(what)

    def _handle_failures(self) -> None:
        while self._failures:
            entry, dumped = self._failures.pop(0)
            detail = f"{describe(entry)} failed: {entry.error}"
            if not dumped:
                self._dump("op_failed", detail)
            self._ask_peers(f"op_failed on rank {_rank()}: {detail}")

    def _update_cpp_states(self) -> None:
        oldest_kept = self.rec.ring.dropped
        open_cpp = [e for e in self.rec.cpp_open if e.state in ("unknown", "started") and e.id >= oldest_kept]
        self.rec.cpp_open[:] = open_cpp
        if not open_cpp:
            return
        status = torch_recorder.read(include_entries=False)
        if status is None:
            return
        done = torch_recorder.completed_seqs(status)
        now = time.monotonic_ns()
        for entry in open_cpp:
            last = done.get(entry.group)
            if last is None:
                continue
            if entry.pg_seq <= last:
                entry.state, entry.t_complete_ns = "completed", now
            else:
                entry.state = "started"

    def _update_limits(self) -> None:
        """Re-derive the per-group limits from the groups' timeouts; warn (once per shorter group timeout)
        when an explicit FLIGHTREC_TIMEOUT would let a group's own watchdog end its op first."""
        groups = self.rec.groups
        self._limits_gen = groups.timeouts_gen
        timeouts = dict(groups.timeouts)
        explicit = self.settings.timeout_from != "default"
        self.limits = derive_limits(self.settings.timeout_s, explicit, timeouts)
        unsafe = unsafe_setting(self.settings.timeout_s, explicit, timeouts)
        if unsafe is not None and unsafe[1].seconds < self._warned_below:
            self._warned_below = unsafe[1].seconds
            setting = "FLIGHTREC_TIMEOUT" if self.settings.timeout_from == "FLIGHTREC_TIMEOUT" else "flightrec.enable(timeout_s)"
            log.warn(warning_text(setting, self.settings.timeout_s, *unsafe))

    def _check_timeouts(self) -> None:
        limits = self.limits
        now = time.monotonic_ns()
        candidates = self.rec.in_flight(issued_before_ns=now - int(limits.shortest_s() * 1e9))  # the rest are in time
        candidates += [e for e in self.rec.cpp_open if e.state == "started"]
        stuck = [e for e in candidates
                 if e.pending and now - e.t_enqueue_ns > limits.seconds(e.group) * 1e9 and e.id not in self._fired]
        if not stuck:
            silent = self._silent_cpp_op(now, limits)
            if silent is not None:
                self._fired.add(silent.id)
                waited = (now - self._recorded_since_ns) / 1e9
                detail = (f"{describe(silent)}, then no op for {waited:.1f}s{limits.note(silent.group)}; its completion "
                          "cannot be observed without PyTorch's recorder (TORCH_FR_BUFFER_SIZE)")
                written = self._dump("timeout", detail)
                self._ask_peers(f"{UNCONFIRMED_REQUEST} {_rank()}: {detail}")
                self.hang.hung(detail, written, confirmed=False)  # a long compute phase looks the same
                self._watch(silent, detail)
            return
        oldest = min(stuck, key=lambda e: e.t_enqueue_ns)
        self._fired.update(e.id for e in stuck)
        waited = (now - oldest.t_enqueue_ns) / 1e9
        detail = f"{describe(oldest)} incomplete after {waited:.1f}s{limits.note(oldest.group)}"
        if self.last_dump_mono_ns > oldest.t_enqueue_ns:
            self.hang.hung(detail, True)  # the dump taken while it was pending (e.g. a peer asked first) shows it
            self._answer(detail)
            self._watch(oldest, detail)
            return
        written = self._dump("timeout", detail)
        self._ask_peers(f"{HANG_REQUEST} {_rank()}: {detail}")
        self.hang.hung(detail, written)
        self._answer(detail)
        self._watch(oldest, detail)

    # ------------------------------------------------------------------ recovery (watch/recovery.py)
    def _watch(self, entry: Entry, detail: str) -> None:
        """This rank's own op timed out: watch it (unless a declared hang is watched already)."""
        if self._stall is None or self._stall.entry is None:
            self._stall = recovery.watch(entry, entry.group, entry.seq, self.limits.seconds(entry.group), "timeout",
                                         detail, self.rec.ring.recorded)

    def _watch_position(self, what: str) -> None:
        """A peer's op timed out at the position its request names: watch this rank's op there."""
        position = recovery.position_of(what)
        if self._stall is not None or position is None:
            return
        group, seq = position
        if all(g.name != group for g in self.rec.groups.known()):
            group, seq = "", -1  # not a member: its next op to complete anywhere shows it moved on
        mine = next((e for e in self.rec.in_flight() if e.group == group and e.seq == seq and e.kind == "coll"), None)
        self._stall = recovery.watch(mine, group, seq, self.limits.seconds(group), "peer_request", what,
                                     self.rec.ring.recorded)

    def check_recovery(self, dump: bool = True) -> bool:
        """The watched op completed: log it once, keep the record, rewrite the dump (reason `recovered`;
        `dump` False: the caller writes the next one, the exit record). True when it recovered now."""
        with self._recovery_lock:  # taken every time: the exit hook must see a recovery the watchdog is telling
            item = self._settle()
        if item is None:
            return False
        log.warn(recovery.line(item, self.hang.folder, self.settings.timeout_from))
        self.hang.recovered()
        if dump:
            self._dump("recovered", f"{item['op']} group={item['group']} seq={item['seq']} completed after the hang dump")
        return True

    def _settle(self) -> dict[str, Any] | None:
        stall = self._stall
        if stall is None:
            return None
        if self.hang.abort_at is not None:  # FLIGHTREC_ON_HANG=abort: this rank exits; its hang dump is final
            self._stall = None
            return None
        done, failed = recovery.settled(stall, self.rec.ring.snapshot)  # any order: no sort per tick
        if done is None:
            if failed:
                self._stall = None  # the failure's own dump is the evidence
            return None
        self._stall = None
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        dumped = self.last_dump_mono_ns + wall_minus_mono if self.last_dump_mono_ns else None
        item = recovery.record(stall, done, dumped)
        self.recoveries = (self.recoveries + [item])[-recovery.KEPT:]
        self.recovered_count += 1
        return item

    def _silent_cpp_op(self, now: int, limits: Limits) -> Entry | None:
        """The newest op, when it was issued from C++, its completion cannot be observed (`unknown`:
        PyTorch's recorder is off) and nothing was recorded for a whole timeout since: DDP's Reducer
        blocked in its all-reduce looks exactly like this, and nothing else would ever fire. A rank
        that only computes that long after a completed C++ op dumps too; the analyzer then finds
        every member at the same position and reports no hang."""
        recorded = self.rec.ring.recorded
        if recorded != self._recorded_seen:
            self._recorded_seen, self._recorded_since_ns = recorded, now
            return None
        last = self.rec.cpp_open[-1] if self.rec.cpp_open else None
        if last is None or last.state != "unknown" or last.id != recorded - 1 or last.id in self._fired:
            return None
        return last if now - self._recorded_since_ns > limits.seconds(last.group) * 1e9 else None

    # ------------------------------------------------------------------ suspects (watch/on_hang.py)
    def _answer(self, what: str) -> None:
        """A confirmed hang at `what`'s (group, seq): with FLIGHTREC_ON_HANG=abort, tell the store how far
        this rank got in that group (once per position), so every rank's abort line can name who holds it.
        Collectives only: a point-to-point op's position counts per peer."""
        position = recovery.position_of(what)
        if self.settings.on_hang != "abort" or position is None or " peer=" in what:
            return
        group, seq = position
        state = next((g for g in self.rec.groups.known() if g.name == group), None)
        if self.hang.position is None and what == self.hang.what:
            self.hang.position = (group, seq, list(state.ranks) if state is not None else None)
        me = launchers.known_rank()
        key = position_key(restart_attempt(), group, seq)
        if state is None or me is None or key in self._answered:
            return  # not a member: it has nothing to say about the group
        self._answered.add(key)
        self.store.append(key, f"{me}:{state.coll_seq};")

    def _read_suspects(self) -> None:
        """The suspects of this rank's hang from the members' answers; kept as they were when the store
        cannot say."""
        position = self.hang.position
        if position is None:
            return
        group, seq, members = position
        text = self.store.read(position_key(restart_attempt(), group, seq))
        if text is not None:
            self.hang.suspects = find_suspects(group, seq, parse_answers(text), members)

    def _ask_peers(self, reason: str) -> None:
        now = time.monotonic()
        if self._stop.is_set() or now - self._last_peer_request < _PEER_REQUEST_EVERY_S:
            return
        self._last_peer_request = now
        self.store.request(reason)


def _rank() -> str:
    rank = launchers.known_rank()
    return "?" if rank is None else str(rank)
