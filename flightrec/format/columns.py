"""The dump's entry columns and their rules (docs/dump-format.md, "Entries"): one definition for the
recorder that writes them (record/entry.py), the synthetic-dump writer (fixtures/dumpwriter.py) and the
tests that decode dumps (tests/helpers.py)."""

from __future__ import annotations

COLUMNS = (  # every entry column, in the dump's order
    "id", "group", "seq", "pg_seq", "kind", "op", "api", "peer", "root", "reduce_op",
    "in_shapes", "in_dtypes", "out_shapes", "out_dtypes", "is_async", "unit", "state", "error",
    "t_enqueue_ns", "t_complete_ns", "t_dev_start_ns", "t_dev_end_ns", "thread", "site", "stack",
    "source", "t_seen_ns", "t_seen_complete_ns",
)
# What an op *is* (its group, op, peer, payload, call site, thread) is stored once per distinct
# combination in `templates`; `entries` keeps only what changes from one op to the next.
TEMPLATE_COLUMNS = (
    "group", "kind", "op", "api", "peer", "root", "reduce_op", "in_shapes", "in_dtypes", "out_shapes",
    "out_dtypes", "is_async", "thread", "site", "source",
)
ENTRY_COLUMNS = tuple(c for c in COLUMNS if c not in TEMPLATE_COLUMNS)
# Stored dictionary-encoded: `{"values": [...distinct...], "codes": [...]}`, code -1 for null.
CODED_COLUMNS = ("group", "kind", "op", "api", "reduce_op", "in_shapes", "in_dtypes", "out_shapes", "out_dtypes",
                 "state", "error", "thread", "site", "source")
# Left out of a dump when every value is null (readers take null for them) ...
OMITTED_WHEN_NULL = frozenset(("error", "t_dev_start_ns", "t_dev_end_ns", "stack", "t_seen_ns", "t_seen_complete_ns"))
# ... or when every value is this default (no p2p, no root, nothing coalesced or async): each is
# 2,000 numbers fewer for every reader to parse. A reader takes a left-out column as its default.
OMITTED_AT_DEFAULT = {"peer": -1, "root": -1, "unit": -1, "is_async": False}
# Times: C++-issued ops' polled moments go to `t_seen_*`, so `t_enqueue_ns` / `t_complete_ns` hold measurements only.
TIME_COLUMNS = frozenset(("t_enqueue_ns", "t_complete_ns", "t_seen_ns", "t_seen_complete_ns"))


def default_of(name: str) -> object:
    """What a reader takes for a left-out column."""
    return OMITTED_AT_DEFAULT.get(name)
