"""Sharing a registry between machines through the git remote they already have: ``sync``
(publish this journal, merge the others') and remote leases (one ref per task, moved by
compare-and-swap). Every ``git`` command runs in ``gitrefs``."""

from __future__ import annotations

__all__: list[str] = []
