"""Test helpers for fleetclaims.sync: a bare repository as the remote, clones of it, and a
``git daemon`` on 127.0.0.1 started and stopped by the test."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

GIT_ENV = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(*args: str, cwd: Path | str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def remote_with_clones(base: Path, n: int, url: str | None = None) -> tuple[Path, list[Path]]:
    """A bare repository ``base/remote.git`` with one commit, and ``n`` clones of it (cloned
    from ``url`` when given, e.g. a git daemon's)."""
    bare = base / "remote.git"
    git("init", "-q", "--bare", str(bare), cwd=base)
    seed = base / "seed"
    git("init", "-q", str(seed), cwd=base)
    (seed / "README").write_text("x\n")
    git("add", "README", cwd=seed)
    git("commit", "-q", "-m", "init", cwd=seed)
    git("push", "-q", str(bare), "HEAD:refs/heads/main", cwd=seed)
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=bare)
    clones = []
    for i in range(n):
        clone = base / f"clone{i}"
        git("clone", "-q", url or str(bare), str(clone), cwd=base)
        clones.append(clone)
    return bare, clones


def registry_dir(clone: Path) -> str:
    return str(clone / ".cache" / "fleetclaims")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """A git daemon serving ``base`` (push enabled) on 127.0.0.1; yields its URL prefix."""
    port = free_port()
    proc = subprocess.Popen(
        ["git", "daemon", f"--base-path={base}", "--export-all", "--enable=receive-pack",
         "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("git daemon did not start")
            time.sleep(0.05)
        yield f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
