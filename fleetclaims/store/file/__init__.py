"""The embedded file store: a hash-chained JSONL journal, a JSON snapshot and a lock file.

``store`` is the Store; ``reader`` the one journal reader (everything that reads journal bytes
uses it); ``journal`` the line format and appending; ``snapshot`` the snapshot codec and its
files; ``lock``, ``fsutil`` and ``faults`` the OS seams; ``doctor`` checks and ``salvage``
repairs.
"""
