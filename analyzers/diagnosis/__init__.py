"""Diagnosis: collectives matched across ranks, who waits for whom, and the root causes (stalled, dead, mismatched, deadlocked ranks)."""
