"""Exports and reports are written 0600, and only a regular file's mode is ever changed."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from fleetclaims.cli.output import write_private

pytestmark = pytest.mark.integration


def test_a_new_and_an_existing_file_end_0600(tmp_path: Path) -> None:
    """A new file is created 0600 and an existing 0644 one is narrowed to 0600."""
    new, old = tmp_path / "new.html", tmp_path / "old.html"
    old.write_text("x")
    old.chmod(0o644)
    write_private(str(new), "report")
    write_private(str(old), "report")
    for path in (new, old):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text() == "report"


def test_a_pipe_or_device_keeps_its_mode(tmp_path: Path) -> None:
    """`-o` naming a FIFO (as /dev/null or a pipe) writes through it and leaves its mode alone:
    narrowing a device's mode as root made /dev/null unwritable for everyone else."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o644)
    os.chmod(fifo, 0o644)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_private(str(fifo), "through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o644
