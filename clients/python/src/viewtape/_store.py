"""Stores keep what must survive a restart: a view's cursor with its state, a producer's next seq."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from pathlib import Path
from typing import Any, Protocol


class Store(Protocol):
    """JSON values by key; saving a key replaces it whole."""

    async def load(self, key: str) -> Any | None: ...

    async def save(self, key: str, value: Any) -> None: ...


class MemoryStore:
    """Survives reconnects, not a restart."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    async def load(self, key: str) -> Any | None:
        text = self._values.get(key)
        return None if text is None else json.loads(text)

    async def save(self, key: str, value: Any) -> None:
        self._values[key] = json.dumps(value)


class FileStore:
    """One JSON file per key in ``directory``, written to a temporary file, fsynced and renamed
    over the old one: a crash leaves the old or the new value, never half of one."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)

    def _path(self, key: str) -> Path:
        return self._dir / f"{urllib.parse.quote(key, safe='')}.json"

    async def load(self, key: str) -> Any | None:
        return await asyncio.to_thread(self._load, key)

    async def save(self, key: str, value: Any) -> None:
        text = json.dumps(value)
        await asyncio.to_thread(self._save, key, text)

    def _load(self, key: str) -> Any | None:
        try:
            return json.loads(self._path(key).read_text("utf-8"))
        except FileNotFoundError:
            return None

    def _save(self, key: str, text: str) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        target = self._path(key)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
