"""Watching, off the hot path: the watchdog thread that notices hangs, failures and requests; the
dump writer; signals; requests between ranks; what a rank does once the job is hung; stacks of a rank
whose watchdog cannot run; stalls that recover.

Imports `record`, `format` and the top-level launch/settings/log modules.
"""
