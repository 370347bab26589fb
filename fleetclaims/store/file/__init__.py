"""The embedded file store: a hash-chained JSONL journal, a JSON snapshot and a lock file.

``store`` is the Store; ``reader`` the one journal reader; ``journal`` the line and snapshot
codecs; ``lock``, ``fsutil`` and ``faults`` the OS seams; ``doctor`` checks and repairs.
"""
