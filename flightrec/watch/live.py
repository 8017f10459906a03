"""The watchdog's live duty: publish this rank's pace, and on rank 0 score every rank's, say a straggler in
the log once per change, and rewrite the metrics file (watch/pace.py says how a straggler is found).

Runs in the watchdog thread, at most every `interval_s` (a sixth of the window): off the training thread's
path; one store write per rank per interval, and on rank 0 one read per rank.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .. import log
from ..settings import Settings
from . import pace
from .dump_requests import StoreTrigger

MIN_INTERVAL_S = 1.0
SCORE_SHARE_LIMIT = 100  # the next scoring round waits at least this many times the last one's duration


class Live:
    def __init__(self, settings: Settings, store: StoreTrigger) -> None:
        self.settings = settings
        self.store = store
        self.pace = pace.Pace()
        self.alerts = pace.AlertLog()
        self.interval_s = max(MIN_INTERVAL_S, settings.straggler_window_s / 6)
        self._next = time.monotonic() + self.interval_s
        self._next_score = 0.0
        self.last_found: list[pace.Straggle] = []

    @property
    def enabled(self) -> bool:
        return self.settings.straggler_window_s > 0

    def due(self, now: float) -> bool:
        return self.enabled and now >= self._next

    def run(self, entries: list[Any], rank: int, world_size: int, attempt: int, now: float) -> None:
        """One round: take in the ring, publish; on rank 0, score and speak."""
        self._next = now + self.interval_s
        self.pace.update(entries)
        in_flight = {e.group: (e.seq, round((time.monotonic_ns() - e.t_enqueue_ns) / 1e9, 1))
                     for e in entries if e.kind == "coll" and e.pending and e.seq > 0}
        record = self.pace.record(rank, world_size, in_flight, self.interval_s)
        self.store.publish(pace.pace_key(attempt, rank), json.dumps(record, separators=(",", ":")))
        if rank != 0 or world_size < 2 or now < self._next_score:
            return
        began = time.monotonic()
        keys = {r: pace.pace_key(attempt, r) for r in range(world_size)}
        raw = self.store.read_many(list(keys.values()))
        records = pace.parse_records({r: raw.get(k) for r, k in keys.items()})
        found = pace.score(records, self.settings.straggler_window_s, self.settings.straggler_share)
        self.last_found = found
        # rank 0's watchdog spends at most ~1% of its time here: reading and scoring 1,024 ranks takes
        # ~0.4 s, so a large job is scored less often than every round (docs/live.md)
        self._next_score = now + max(self.interval_s, SCORE_SHARE_LIMIT * (time.monotonic() - began))
        for line in self.alerts.news(found):
            log.warn(line)
        if self.settings.metrics_file:
            try:
                pace.write_atomically(self.settings.metrics_file, pace.metrics_text(records, found))
            except OSError as exc:
                log.warn_once("metrics-file", f"cannot write FLIGHTREC_METRICS_FILE={self.settings.metrics_file!r}: {exc}")
