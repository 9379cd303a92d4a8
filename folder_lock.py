"""The lock of a run folder: one process at a time may write in it, on this machine or on any node of a cluster
that shares the filesystem. The standard library alone: copy this file into a project of your own as it is.

The lock is a file inside the folder, made by a hard link of a file already holding its holder's name (host,
pid): the link either makes the lock or fails because it exists, and that holds on a shared filesystem (NFS,
Lustre, GPFS) where fcntl.flock may be node-local or off, so that two nodes of a cluster could both have trained
into one folder. Made whole by the link, the lock names its holder from the instant it exists: a rival never
reads an empty one. Inside the folder, not beside it: one folder reached under two names (a symlink, a bind
mount, another node's mount point) has one lock. A process killed outright leaves its file behind, so the file
names its holder: on the same host a lock whose process is gone is stale; from another host, whose processes
cannot be seen, a lock its holder has not touched for LOCK_STALE_S seconds is stale (the holder touches it
every LOCK_BEAT_S while it runs: beating).

    import os
    from folder_lock import LOCK_NAME, Busy, beating, release, take_lock

    take_lock(out, "my-trainer")        # raises Busy("runs/x is in use by another my-trainer (pid 7 on node3)...")
    lock = os.path.join(out, LOCK_NAME)  # what beating and release take
    try:
        with beating(lock):
            ...                         # write in out
    finally:
        release(lock)

(In lengen, runs.hold wraps this with what it puts right in a run folder on the way in and out.)
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import tempfile
import threading
import time


class Busy(Exception):
    """The folder is held by a process that may be alive: its one line says by whom."""


LOCK_NAME = ".lengen.lock"  # a copy in another project names its own
LOCK_BEAT_S = 60.0
LOCK_STALE_S = 600.0  # ten missed beats: more than a shared filesystem's clock skew or a stalled write
HELD: dict[str, str] = {}  # the locks this process holds (take_lock), each with what it wrote in it


def lock_owner(path: str) -> dict | None:
    """What a lock file says of its holder ({"host", "pid", "holder"}), or None when it cannot be read (it went
    as we looked, or it is not one take_lock made: then only its age tells)."""
    try:
        with open(path, encoding="utf-8") as f:
            owner = json.load(f)
        return owner if isinstance(owner, dict) and {"host", "pid"} <= set(owner) else None
    except (OSError, ValueError):
        return None


def lock_stale(path: str, owner: dict | None) -> str | None:
    """Why the lock at `path` is left over from a holder that is gone (a line), or None while it may be alive."""
    if owner and owner["host"] == socket.gethostname():
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return f"its process {owner['pid']} on {owner['host']} is gone"
        except (PermissionError, OverflowError, TypeError):  # alive under another user; a pid no process has
            pass
        return None
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return "it was released"
    return f"untouched for {age:.0f} s (more than {LOCK_STALE_S:.0f})" if age > LOCK_STALE_S else None


def place_lock(claim: str, lock: str, me: str) -> bool:
    """Make `lock` a hard link of `claim` (a file holding `me`, written whole): True if this made it, False if
    it was there. NFS may answer a link that it made, then retried, with "exists": the claim's second link
    tells. Where the filesystem has no hard links (vfat, some FUSE mounts) an exclusive create, written at once,
    stands in (a rival may then read it empty for an instant)."""
    try:
        os.link(claim, lock)
        return True
    except FileExistsError:
        return os.stat(claim).st_nlink > 1
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(me)
    return True


def take_lock(out: str, holder: str) -> str:
    """Make out/LOCK_NAME naming this host and process and return what it says (JSON: host, pid, holder), or
    raise Busy, one line saying who holds it. A stale lock is taken over under a second exclusive file
    (LOCK_NAME + ".break"), so that of two processes finding it stale at once only one replaces it; the other
    sees the new holder."""
    lock = os.path.join(out, LOCK_NAME)
    me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "holder": holder})
    claim = None
    try:
        fd, claim = tempfile.mkstemp(dir=out, prefix=LOCK_NAME + ".claim.")  # a name of its own, made anew
        os.fchmod(fd, 0o644)  # readable by all, as the lock it becomes
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(me)
            f.flush()
            os.fsync(f.fileno())
        for _ in range(3):  # a lock released or broken as we look is tried again
            if place_lock(claim, lock, me):
                HELD[lock] = me  # held from this instant: released by release, or by release_held
                return me
            owner = lock_owner(lock)
            if owner is None and not os.path.lexists(lock):  # released as we looked
                continue
            why = lock_stale(lock, owner)
            if why is None:
                who = f"{owner.get('holder', 'command')} (pid {owner['pid']} on {owner['host']})" if owner else holder
                raise Busy(f"{out} is in use by another {who}; wait for it to finish, or delete {lock} if "
                           "nothing holds it")
            breaker = lock + ".break"
            try:
                os.close(os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:  # another process is taking it over now; one left by a killed one is old
                with contextlib.suppress(FileNotFoundError):  # (gone as we look: that one has finished)
                    if time.time() - os.stat(breaker).st_mtime > LOCK_BEAT_S:
                        os.remove(breaker)
                continue
            try:
                if lock_owner(lock) == owner and lock_stale(lock, owner):  # still the lock judged stale
                    print(f"{out}: taking over a stale lock ({why})", file=sys.stderr)
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(lock)
            finally:
                with contextlib.suppress(FileNotFoundError):  # removed as old by a process that waited long
                    os.remove(breaker)
    finally:
        if claim:
            with contextlib.suppress(OSError):
                os.remove(claim)
    raise Busy(f"{out} is in use by another {holder}; wait for it to finish")


def release(lock: str) -> None:
    """Remove a lock this process holds, if it is still ours (not broken by another host that thought us gone)."""
    me = HELD.pop(lock, None)
    if me is not None and lock_owner(lock) == json.loads(me):
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)


def release_held() -> None:
    """Every lock this process holds released: for a process about to end at once (os._exit, a --jobs worker
    told to stop), whose `with` blocks will not finish, so that no run folder is left locked by it."""
    for lock in list(HELD):
        with contextlib.suppress(OSError):
            release(lock)


def touch_while(lock: str, done: threading.Event) -> None:
    """The lock's heartbeat: its time stamp renewed every LOCK_BEAT_S until `done`, so that another host can
    tell a held lock from one left by a holder that died (lock_stale)."""
    while not done.wait(LOCK_BEAT_S):
        with contextlib.suppress(OSError):
            os.utime(lock)


@contextlib.contextmanager
def beating(lock: str):
    """The lock touched every LOCK_BEAT_S while the block runs (touch_while, in a thread of its own)."""
    done = threading.Event()
    beat = threading.Thread(target=touch_while, args=(lock, done), daemon=True)
    beat.start()
    try:
        yield
    finally:
        done.set()
        beat.join()
