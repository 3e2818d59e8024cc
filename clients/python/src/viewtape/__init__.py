"""viewtape: a view as a live dict (``View``), a runtime as an idempotent producer
(``Producer``), with a file store so a restart resumes where it was (``FileStore``)."""

from ._errors import ProducerError, ViewError
from ._producer import Producer
from ._store import FileStore, MemoryStore, Store
from ._view import Change, Status, View, parse_cursor

__all__ = [
    "Change",
    "FileStore",
    "MemoryStore",
    "Producer",
    "ProducerError",
    "Status",
    "Store",
    "View",
    "ViewError",
    "parse_cursor",
]
__version__ = "0.1.0"
