"""The dump's format, torch-free: its schema tag and version, file names, how a dump lies in its file,
its packed integer columns, how group members are written, and the shared facts the analyzer reads it
by (what a backend's Works mean, which source files are library code).

Imported by the recorder, the analyzer's flightrec reader, the fixtures that write dumps and the
tests alike, so none of them spells the format a second time. Imports nothing else of flightrec.
"""
