"""The only module that touches psutil, sockets, clocks, /proc, the boot id and the machine id.

Every Linux-only source has a portable fallback, and a missing source yields "" / None, which
the core turns into an ``unknown`` verdict, never a crash.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .core.liveness import LocalFacts, Probe, decide_liveness
from .core.model import Identity, Now, Verdict
from .core.ports import Clock as Clock  # declared with the other ports; imported from here too
from .core.ports import Prober as Prober

_CLOCK_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)

# getpid() is a system call on current glibc and the write path asks on every operation (to
# notice a fork); remember it, and forget it in a forked child.
_PID = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def current_pid() -> int:
    return _PID[0]


# A store's mutex held by another thread at the moment of a fork stays held for good in the
# child (that thread does not exist there), and the child's first call would wait forever.
# A store notices a fork by its pid and reloads from disk; its mutex is made anew here.
_FORK_SAFE: weakref.WeakSet[Any] = weakref.WeakSet()


def fork_safe_mutex(owner: Any) -> threading.RLock:
    """A mutex for ``owner`` (its ``_mutex``), replaced by a free one in a forked child."""
    _FORK_SAFE.add(owner)
    return threading.RLock()


def _fresh_mutexes() -> None:
    for owner in list(_FORK_SAFE):
        owner._mutex = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_mutexes)


class SystemClock:
    """Wall time plus a boot clock that never steps (CLOCK_BOOTTIME, else monotonic)."""

    def now(self) -> Now:
        wall = time.time()
        if _CLOCK_BOOTTIME is not None:
            boot = time.clock_gettime(_CLOCK_BOOTTIME)
        else:  # macOS: monotonic stops during sleep, which only makes leases last longer
            boot = time.monotonic()
        return Now(wall=wall, boot=boot, boot_id=boot_id())


@lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        pass
    try:
        import psutil

        # Boot time is a wall-clock value; rounding absorbs small NTP adjustments.
        return f"boottime:{round(psutil.boot_time())}"
    except Exception:  # any failure means "unknown", never a crash
        return ""


@lru_cache(maxsize=1)
def machine_id_hash() -> str:
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(candidate).read_text().strip()
        except OSError:
            continue
        if raw:
            return _hash_machine(raw)
    if sys.platform == "darwin":
        raw = _darwin_platform_uuid()
        if raw:
            return _hash_machine(raw)
    return ""


def _hash_machine(raw: str) -> str:
    # Hashed so the journal never carries the raw machine id (it is a stable host secret).
    return hashlib.sha256(b"fleetclaims-machine:" + raw.encode()).hexdigest()[:32]


def _darwin_platform_uuid() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["/usr/sbin/ioreg", "-rd1", "-c", "IOPlatformExpertDevice"],
            capture_output=True, text=True, timeout=2, check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if "IOPlatformUUID" in line:
            return line.split("=")[-1].strip().strip('"')
    return ""


@lru_cache(maxsize=1)
def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    # macOS and the BSDs have no PID namespaces: every process shares the host's.
    return "host" if sys.platform == "darwin" else ""


@lru_cache(maxsize=1)
def hostname() -> str:
    # gethostname() is uname's nodename on POSIX (glibc, musl and the BSDs read it there), and
    # os.uname is already loaded: importing socket for it cost a fresh process's first claim
    # ~3-5 ms. Elsewhere (Windows) the socket module answers.
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket

    return socket.gethostname()


def shutdown_socket(fd: int) -> None:
    """Shut down both directions of the socket behind descriptor ``fd`` (which stays open and
    its owner's): a call blocked on it in another thread returns. Used to cut off a database
    connection whose server stopped answering."""
    import socket

    sock = socket.socket(fileno=os.dup(fd))
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()


@lru_cache(maxsize=1)
def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def local_facts() -> LocalFacts:
    return LocalFacts(
        host=hostname(), machine=machine_id_hash(), boot=boot_id(), pidns=pid_namespace()
    )


def read_proc(path: str) -> bytes:
    """One small /proc file (os calls, not pathlib: a probe runs on every refused claim and
    every listed claim, and this is ~3x cheaper)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def foreign_threads() -> bool | None:
    """Whether this process runs live native threads Python does not know of (a gRPC or
    database driver pool), None when its threads cannot be listed (no /proc)."""
    import threading
    import time

    # A Python thread that has just ended (joined, gone from threading.enumerate()) can still
    # be tearing down in the kernel for a while on a busy machine, neither listed nor a zombie
    # yet: an unknown thread counts only if it is still there ~50 ms later.
    deadline = time.monotonic() + 0.05
    while True:
        try:
            native = {int(t) for t in os.listdir("/proc/self/task")}
        except (OSError, ValueError):
            return None
        if not any(_running(tid) for tid in native - {t.native_id for t in threading.enumerate()}):
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.005)


def _running(tid: int) -> bool:
    """Whether thread ``tid`` of this process exists and is not a zombie."""
    try:
        state = read_proc(f"/proc/self/task/{tid}/stat").rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def probe(pid: int) -> Probe:
    """Look at a PID on this machine: gone, zombie, start ticks, or denied."""
    try:
        raw = read_proc(f"/proc/{pid}/stat")
    except FileNotFoundError:
        if os.path.exists("/proc/self/stat"):
            return Probe(exists=False)
        return _probe_psutil(pid)
    except PermissionError:
        return Probe(exists=True, denied=True)
    except OSError as exc:
        return Probe(exists=False, error=str(exc))
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    try:
        rest = raw[raw.rindex(b")") + 2 :].split()
        return Probe(exists=True, zombie=rest[0] in (b"Z", b"X"), start=int(rest[19]))
    except (ValueError, IndexError) as exc:
        return Probe(exists=True, error=f"unreadable /proc/{pid}/stat: {exc}")


def _probe_psutil(pid: int) -> Probe:
    try:
        import psutil
    except ImportError as exc:  # pragma: no cover - psutil is a dependency
        return Probe(exists=False, error=str(exc))
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return Probe(exists=False)
    except psutil.AccessDenied:
        return Probe(exists=True, denied=True)
    except Exception as exc:  # any other failure is "unknown"
        return Probe(exists=False, error=str(exc))
    zombie = status in (psutil.STATUS_ZOMBIE, getattr(psutil, "STATUS_DEAD", "dead"))
    return Probe(exists=True, zombie=zombie, start=_ticks_from_create_time(created))


def _ticks_from_create_time(created: float) -> int:
    # Fallback only (no /proc): create_time is wall-clock based, so express it relative to boot
    # time in 1/100 s; a wall step moves both values together.
    try:
        import psutil

        return round(float(created - psutil.boot_time()) * 100)
    except Exception:
        return -1


def background_priority(nice: int, *, session: bool = False) -> None:
    """Lower the CPU priority of the calling thread (on Linux nice is per thread) to ``nice``,
    for work no operation waits on. With ``session``, a helper leading its own session
    (rest.spawn_helper) lowers its session's autogroup too: Linux shares the CPU between
    sessions first, and a helper's session at the default weight took as much CPU as every
    writer of the session that started it (on 2 cores, operations were delayed 10-20 ms)."""
    try:
        current = os.nice(0)
        if nice > current:
            os.nice(nice - current)
    except OSError:
        return
    if session and hasattr(os, "getsid") and os.getsid(0) == os.getpid():
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass  # (no autogroups here)


def pid_exists(pid: int) -> bool:
    """Whether a process with this PID exists on this machine (signal 0 probes, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True  # unsure: keep what might belong to it
    return True


def flock_holder(dev: int, ino: int) -> int | None:
    """The PID holding a flock() on the file (dev, ino), from /proc/locks; None when unknown
    (not Linux, or nobody). Asked only when a lock wait times out, to name the holder."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 fd:01:123456 0 EOF" ("->" marks waiters)
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[2] != "->" and parts[5] == want:
            try:
                return int(parts[4])
            except ValueError:
                return None
    return None


def start_ticks(pid: int) -> int:
    found = probe(pid)
    return -1 if found.start is None else found.start


class SystemProber:
    """Identity of this process and liveness verdicts for recorded identities."""

    def __init__(self) -> None:
        self._identity: Identity | None = None

    def identity(self) -> Identity:
        pid = current_pid()
        if self._identity is None or self._identity.pid != pid:  # recomputed after fork
            facts = local_facts()
            self._identity = Identity(
                host=facts.host,
                machine=facts.machine,
                boot=facts.boot,
                pidns=facts.pidns,
                pid=pid,
                start=start_ticks(pid),
            )
        return self._identity

    def identity_of(self, pid: int) -> Identity:
        """The identity of another process on this machine (e.g. the shell that runs the CLI)."""
        facts = local_facts()
        return Identity(host=facts.host, machine=facts.machine, boot=facts.boot,
                        pidns=facts.pidns, pid=pid, start=start_ticks(pid))

    def verdict(self, identity: Identity | None) -> Verdict:
        facts = local_facts()
        found: Probe | None = None
        if (
            identity is not None
            and identity.machine
            and identity.machine == facts.machine
            and identity.boot == facts.boot
            and identity.pidns == facts.pidns
            and identity.pid > 0
        ):
            found = probe(identity.pid)
        return decide_liveness(identity, facts, found)


# --- filesystems -----------------------------------------------------------------------------

NETWORK_FS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "smb2", "9p", "afs", "ceph", "glusterfs",
        "lustre", "gpfs", "ncpfs", "coda", "davfs", "webdav", "sshfs", "virtiofs", "vboxsf",
        "prl_fs", "vmhgfs",
    }
)
#: folders that sync tools watch, matched in any letter case as a whole path component or as
#: its start before a space ("Dropbox (Personal)", "OneDrive - Contoso")
CLOUD_FOLDERS = ("Dropbox", "OneDrive", "Google Drive", "GoogleDrive", "Mobile Documents",
                 "iCloud Drive", "Box Sync", "pCloud Drive", "MEGA", "Nextcloud", "ownCloud",
                 "SynologyDrive", "Synology Drive")
#: macOS File Provider sync roots (Dropbox, OneDrive, Google Drive, Box ... since macOS 12.3)
CLOUD_PARENTS = (("library", "cloudstorage"),)
#: a directory holding one of these is the root of a synced folder (Syncthing)
SYNC_MARKERS = (".stfolder",)


@dataclass(frozen=True)
class MountInfo:
    mountpoint: str
    fstype: str


def mount_of(path: Path, mounts_file: str = "/proc/self/mounts") -> MountInfo | None:
    """The mount holding ``path`` from the mount table (longest matching mount point)."""
    try:
        text = Path(mounts_file).read_text()
    except OSError:
        return _mount_psutil(path)
    target = str(path.resolve())
    best: MountInfo | None = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape_mount(parts[1])
        # ">=": of two mounts on one point, the later line is the one on top.
        if (target == point or target.startswith(point.rstrip("/") + "/")) and (
            best is None or len(point) >= len(best.mountpoint)
        ):
            best = MountInfo(point, parts[2])
    return best


def _unescape_mount(field: str) -> str:
    """The mount table escapes space, tab, newline and backslash as octal (\\040 ...)."""
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_psutil(path: Path) -> MountInfo | None:
    try:
        import psutil

        target = str(path.resolve())
        best: MountInfo | None = None
        for part in psutil.disk_partitions(all=True):
            point = part.mountpoint
            if (target == point or target.startswith(point.rstrip("/") + "/")) and (
                best is None or len(point) > len(best.mountpoint)
            ):
                best = MountInfo(point, part.fstype)
        return best
    except Exception:
        return None


def unsafe_filesystem(path: Path, mounts_file: str = "/proc/self/mounts") -> str | None:
    """Why locks or rename may be unreliable at ``path``, or None when it looks local."""
    info = mount_of(path, mounts_file)
    if info is not None:
        fstype = info.fstype.lower()
        if fstype in NETWORK_FS or fstype.split(".")[0] in NETWORK_FS:
            return f"{path} is on a network filesystem ({info.fstype} at {info.mountpoint})"
        if fstype.startswith("fuse") and fstype not in ("fuse.portal",):
            return f"{path} is on a FUSE filesystem ({info.fstype} at {info.mountpoint})"
    return cloud_folder(path)


def cloud_folder(path: Path) -> str | None:
    """Why ``path`` is inside a folder a sync tool rewrites behind our back, or None."""
    resolved = path.resolve()
    parts = [p.lower() for p in resolved.parts]
    for name in CLOUD_FOLDERS:
        low = name.lower()
        if any(p == low or p.startswith(low + " ") for p in parts):
            return f"{path} is inside a cloud-sync folder ({name})"
    for first, second in CLOUD_PARENTS:
        for i in range(len(parts) - 2):
            if parts[i] == first and parts[i + 1] == second:
                return (f"{path} is inside a cloud-sync folder (~/Library/CloudStorage/"
                        f"{resolved.parts[i + 2]})")
    for directory in (resolved, *resolved.parents):
        for marker in SYNC_MARKERS:
            try:
                found = (directory / marker).exists()
            except OSError:  # unreadable: not proof of a synced folder
                found = False
            if found:
                return f"{path} is inside a Syncthing folder ({directory / marker} exists)"
    return None
