"""Persistent sessions: SQLite with a versioned schema, shared by the app and the CLI."""

from localchat.store.records import UNTITLED, SearchHit, SessionRecord, TurnRecord
from localchat.store.store import NameTaken, SessionNotFound, Store, StoreError

__all__ = ["UNTITLED", "NameTaken", "SearchHit", "SessionNotFound", "SessionRecord", "Store", "StoreError", "TurnRecord"]
