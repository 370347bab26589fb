"""Stores: where the journal and the claims live. One contract, several backends."""

from .base import Event, EventPage, Store, VerifyReport

__all__ = ["Event", "EventPage", "Store", "VerifyReport"]
