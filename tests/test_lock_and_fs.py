"""The lock and the filesystem: a frozen holder makes others wait and then fail with a
RegistryBusy naming it; a killed holder frees the lock at once; network, FUSE and cloud-sync
filesystems are refused by default with a message that says how to override."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleetclaims
import fleetclaims.store.file.store as sf
from fleetclaims import RegistryBusy, UnsafeRegistry
from fleetclaims.system import mount_of, unsafe_filesystem

pytestmark = pytest.mark.integration

# The holder: stops itself (SIGSTOP) right after writing a journal line, inside the lock.
HOLDER = r"""
import os, signal, sys
import fleetclaims
from fleetclaims.store.file.faults import set_crash_hook
reg = fleetclaims.Registry(sys.argv[1])
reg.claim("warm-up", owner="holder", ttl=600)
def freeze(point):
    if point == "journal.after_write":
        print("FROZEN", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
set_crash_hook(freeze)
reg.claim("frozen-op", owner="holder", ttl=600)
print("DONE", flush=True)
"""


#: the registry directory and the holder process, stopped inside the lock
FrozenHolder = tuple[Path, "subprocess.Popen[str]"]


@pytest.fixture
def frozen_holder(tmp_path: Path) -> Iterator[FrozenHolder]:
    directory = tmp_path / "reg"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "FROZEN"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until the kernel reports it stopped
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                break
        time.sleep(0.01)
    yield directory, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_frozen_holder_gives_registry_busy_naming_it(frozen_holder: FrozenHolder) -> None:
    """SIGSTOPped inside the lock: a waiter gets RegistryBusy after its timeout, naming the pid."""
    directory, proc = frozen_holder
    reg = fleetclaims.Registry(directory, lock_timeout=0.6)
    started = time.monotonic()
    with pytest.raises(RegistryBusy) as info:
        reg.claim("other", owner="waiter", ttl=60)
    waited = time.monotonic() - started
    assert 0.55 <= waited < 3.0, waited
    assert info.value.holder is not None and f"pid={proc.pid}" in info.value.holder
    assert f"pid={proc.pid}" in str(info.value) and "0.6s" in str(info.value)
    assert info.value.timeout == 0.6
    # Readers need no lock: they still see the committed state.
    assert reg.get("warm-up") is not None


@pytest.mark.timeout(60)
def test_frozen_holder_busy_from_a_thread_too(frozen_holder: FrozenHolder) -> None:
    """Off the main thread the lock polls; the timeout and the message are the same."""
    directory, proc = frozen_holder
    out: list[BaseException] = []

    def run() -> None:
        try:
            fleetclaims.Registry(directory, lock_timeout=0.4).claim("t", owner="w", ttl=60)
        except BaseException as exc:
            out.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert 0.35 <= time.monotonic() - started < 3.0
    assert len(out) == 1 and isinstance(out[0], RegistryBusy)
    assert f"pid={proc.pid}" in str(out[0])


@pytest.mark.timeout(60)
def test_killed_holder_frees_the_lock_at_once(frozen_holder: FrozenHolder) -> None:
    """SIGKILL of the frozen holder: a waiter with a long timeout proceeds immediately."""
    directory, proc = frozen_holder
    reg = fleetclaims.Registry(directory, lock_timeout=30)
    result: list[object] = []

    def wait_and_claim() -> None:
        result.append(reg.claim("after-kill", owner="waiter", ttl=60))

    thread = threading.Thread(target=wait_and_claim)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive(), "the waiter did not wait for the frozen holder"
    killed = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    thread.join(10)
    assert result, "the waiter never got the lock"
    assert time.monotonic() - killed < 1.0
    # The frozen op's line was written (not synced, not acknowledged): present or absent, the
    # registry is consistent and verifies.
    report = reg.verify()
    assert report.ok, report
    assert reg.get("after-kill") is not None


@pytest.mark.timeout(60)
def test_killed_holder_main_thread_waiter(frozen_holder: FrozenHolder) -> None:
    """The main-thread (blocking flock) waiter is woken by the holder's death, not its timeout."""
    directory, proc = frozen_holder
    timer = threading.Timer(0.3, os.kill, (proc.pid, signal.SIGKILL))
    timer.start()
    started = time.monotonic()
    fleetclaims.Registry(directory, lock_timeout=30).claim("main", owner="waiter", ttl=60)
    assert time.monotonic() - started < 2.0
    timer.join()


# --- filesystems ------------------------------------------------------------------------------

MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export {base}/nfs nfs4 rw,vers=4.2 0 0
//nas/share {base}/smb cifs rw 0 0
sshfs#me@host:/ {base}/sshfs fuse.sshfs rw 0 0
rclone:drive {base}/rclone fuse.rclone rw 0 0
overlay {base}/overlay overlay rw 0 0
tmpfs {base}/nfs/inner tmpfs rw 0 0
server:/x {base}/with\\040space nfs rw 0 0
tmpfs {base}/stacked tmpfs rw 0 0
server:/y {base}/stacked nfs rw 0 0
"""


@pytest.fixture
def mounts(tmp_path: Path) -> Path:
    path = tmp_path / "mounts"
    path.write_text(MOUNTS.format(base=tmp_path))
    return path


@pytest.mark.parametrize(
    ("sub", "expected"),
    [
        ("nfs/reg", "network filesystem (nfs4"),
        ("smb/reg", "network filesystem (cifs"),
        ("sshfs/reg", "FUSE filesystem (fuse.sshfs"),
        ("rclone/reg", "FUSE filesystem (fuse.rclone"),
        ("with space/reg", "network filesystem (nfs"),
        ("stacked/reg", "network filesystem (nfs"),  # the later mount on a point is on top
        ("overlay/reg", None),
        ("nfs/inner/reg", None),  # a local mount inside a network one
        ("local/reg", None),
    ],
)
def test_unsafe_filesystem_from_mount_table(tmp_path: Path, mounts: Path, sub: str,
                                            expected: str | None) -> None:
    """NFS, CIFS and FUSE are detected from the mount table; local ones are not."""
    target = tmp_path / sub
    target.mkdir(parents=True)
    reason = unsafe_filesystem(target, str(mounts))
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


@pytest.mark.parametrize("folder", ["Dropbox", "OneDrive", "Google Drive", "iCloud Drive"])
def test_cloud_sync_folders(tmp_path: Path, mounts: Path, folder: str) -> None:
    """Cloud-sync folders are refused whatever the filesystem underneath."""
    target = tmp_path / "home" / folder / "project" / ".cache" / "fleetclaims"
    target.mkdir(parents=True)
    reason = unsafe_filesystem(target, str(mounts))
    assert reason is not None and folder in reason


def test_unreadable_mount_table_is_not_a_crash(tmp_path: Path) -> None:
    """No mount table: fall back (psutil), never raise."""
    reason = unsafe_filesystem(tmp_path, str(tmp_path / "missing"))
    assert reason is None or isinstance(reason, str)
    found = mount_of(tmp_path, str(tmp_path / "missing"))
    assert found is None or found.mountpoint


def test_registry_refuses_network_fs_and_says_how_to_override(
    tmp_path: Path, mounts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by default with the reason and the override; allowed when asked."""
    monkeypatch.setattr(sf, "unsafe_filesystem",
                        functools.partial(unsafe_filesystem, mounts_file=str(mounts)))
    monkeypatch.delenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", raising=False)
    target = tmp_path / "nfs" / "reg"
    with pytest.raises(UnsafeRegistry) as info:
        fleetclaims.Registry(target).claim("t", owner="o", ttl=60)
    message = str(info.value)
    assert "network filesystem" in message and "nfs4" in message
    assert "allow_unsafe_fs=True" in message and "FLEETCLAIMS_ALLOW_UNSAFE_FS=1" in message
    assert "--allow-unsafe-fs" in message
    # Nothing was written there.
    assert not (target / "audit.jsonl").exists()
    fleetclaims.Registry(target, allow_unsafe_fs=True).claim("t", owner="o", ttl=60)
    monkeypatch.setenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", "1")
    assert fleetclaims.Registry(target).get("t") is not None


def test_registry_refuses_cloud_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry inside a Dropbox folder is refused on the real mount table too."""
    monkeypatch.delenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", raising=False)
    with pytest.raises(UnsafeRegistry, match="cloud-sync folder"):
        fleetclaims.Registry(tmp_path / "Dropbox" / "reg").claim("t", owner="o", ttl=60)
