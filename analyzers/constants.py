"""Names shared by every analyzer module: verdicts, root-cause kinds, entry states, op families.

Why one module: the report is a contract (docs/report-format.md); its vocabulary must be spelled in
exactly one place so the loader, the graph and the renderers cannot drift apart.
"""

from __future__ import annotations

REPORT_SCHEMA = "flightrec-analysis/1"

# Verdicts, most severe first; renderers must not assume this list is closed.
HEALTHY = "healthy"
SLOW = "slow"  # no hang, but a significant straggler
HANG = "hang"
DESYNC = "desync"
DEADLOCK = "deadlock"
CRASH = "crash"  # a rank died (or raised) and took the job down
INCONCLUSIVE = "inconclusive"  # nothing hangs, but a rank's current state is unknown: `healthy` cannot be claimed
VERDICTS = (DESYNC, DEADLOCK, CRASH, HANG, SLOW, INCONCLUSIVE, HEALTHY)

# Root-cause kinds.
NOT_ENTERED = "not_entered"
MISSING_DUMP = "missing_dump"
MISMATCH = "mismatch"
COMM_STUCK = "comm_stuck"
KIND_DEADLOCK = "deadlock"
CRASHED = "crashed"  # died: its own uncaught error, or no dump while its peers lost their connections to it
EXITED = "exited"  # left the job cleanly (exit record) while others still wait for it
KINDS = (NOT_ENTERED, MISSING_DUMP, MISMATCH, COMM_STUCK, KIND_DEADLOCK, CRASHED, EXITED)

# Where an op issued from C++ (DDP's Reducer, FSDP, functional collectives) was called: Python never saw it.
CPP_SITE = "issued from C++ (e.g. DDP's Reducer)"

# Entry states of the flightrec dump format (torch FR states are mapped onto these).
ENQUEUED = "enqueued"
STARTED = "started"
COMPLETED = "completed"
FAILED = "failed"
UNKNOWN = "unknown"
STATES = (ENQUEUED, STARTED, COMPLETED, FAILED, UNKNOWN)
PENDING_STATES = (ENQUEUED, STARTED)

# Dump formats the loader understands.
FMT_FLIGHTREC = "flightrec"
FMT_TORCH_PICKLE = "torch_fr_pickle"
FMT_TORCH_JSON = "torch_fr_json"

SUPPORTED_FLIGHTREC_SCHEMAS = (6,)  # the one schema the recorder writes (docs/dump-format.md)

# Op families for the shape rules of the matcher. Names cover both the flightrec vocabulary and the
# one of PyTorch's recorder (`nccl:_all_gather_base`, `gloo:all_gather`, ...).
ALL_GATHER_OPS = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "_all_gather_base",
        "all_gather_base",
        "all_gather_single",
        "all_gather_into_tensor_coalesced",
        "ALLGATHER_coalesced",
    }
)
REDUCE_SCATTER_OPS = frozenset(
    {
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "reduce_scatter_base",
        "reduce_scatter_single",
        "reduce_scatter_tensor_coalesced",
        "REDUCE_SCATTER_coalesced",
    }
)
# Per-rank sizes legitimately differ (uneven splits, root-only buffers): compare tensor counts only.
LOOSE_SHAPE_OPS = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single", "gather_v"})
SCATTER_OPS = frozenset({"scatter"})  # input only on the root
GATHER_OPS = frozenset({"gather"})  # output only on the root
NO_PAYLOAD_OPS = frozenset({"barrier", "monitored_barrier", "coalesced", "unknown"})
P2P_OPS = frozenset({"send", "recv"})

# Normalisation of PyTorch's scalar-type names (torch FR dumps) to torch dtype names.
TORCH_DTYPE_NAMES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
}

# More ranks than any real job: a dump or file name claiming a rank or world size beyond this is
# rejected, since the analysis ranges over ranks (a fuzzed world_size of 2**63 hung it).
MAX_RANKS = 1 << 20

# Timing: a rank must be late by at least this much (median) to count as slow, so that scheduler jitter
# never qualifies; compute gaps shorter than it are overhead (reading/sample.py, timing/straggler_scoring.py, timing/blocking_ops.py).
MIN_LATE_MS = 0.5
