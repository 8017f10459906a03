"""Timing: slow ranks and slow links, from local durations (no clocks trusted across hosts)."""
