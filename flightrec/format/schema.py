"""The dump format's tag and schema version (docs/dump-format.md).

Why a module of its own: the recorder writes them, and the fixtures that write dumps like the
recorder's take them from here without importing the recorder (and torch with it).
"""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here); each dump records it
FORMAT = "flightrec-dump"
SCHEMA_VERSION = 6  # the one schema the recorder writes and the analyzer reads
