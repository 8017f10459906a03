"""The dump format's tag and schema version (docs/dump-format.md).

Why a module of its own: the recorder writes them, and the fixtures that write dumps like the
recorder's take them from here without importing the recorder (and torch with it).
"""

FORMAT = "flightrec-dump"
SCHEMA_VERSION = 6  # the one schema the recorder writes and the analyzer reads
