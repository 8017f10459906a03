"""Recording, on the training thread's hot path: wrapping torch.distributed's functions, the recorder
that turns each call into an entry and follows it to completion, the ring those entries live in,
per-group bookkeeping, op specs, call sites and stacks, device-side timing, the C hot path and its
loader, the optional reader of torch's C++ objects, and the reader of PyTorch's own recorder.

Imports `format` and the top-level launch/settings/log modules only; never `watch`.
"""
