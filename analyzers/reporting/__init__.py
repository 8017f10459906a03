"""Reporting: the report as text, JSON, HTML and plots, the notebook tables, Parquet export and the trace timeline."""
