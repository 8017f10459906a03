"""Offline hang analyzer for flightrec (and PyTorch flight-recorder) dumps.

    import analyzers
    a = analyzers.load("dumps/")
    a.entries        # one row per recorded op, all ranks (pandas DataFrame, categorical strings)
    a.groups         # process groups and their members
    a.graph          # networkx.DiGraph: edge r -> m when rank r waits for rank m
    a.report()       # the JSON report as a dict (docs/report-format.md)

    from analyzers.reporting import postmortem, plots# notebook steps as DataFrames, and their plots
    postmortem.entries(a)                    # every entry + derived columns (docs/postmortem.md)
"""

from .analysis import Analysis, load
from .reading.loader import UnusableInput
from .reporting import postmortem

__all__ = ["Analysis", "UnusableInput", "load", "postmortem"]
