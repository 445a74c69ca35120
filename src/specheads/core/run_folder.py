"""Output folders a command owns: checked writable before any expensive work, locked while a run writes
them, and never mixed with another run's results.

    check_writable(folder)       the folder (or, not there yet, its nearest existing parent) takes a new
                                 file: a mistake there is found in a second, not after an hour of work
    hold_folder(folder, ...)     creates the folder and takes its lock, `.specheads.lock`, for the `with`
                                 block; a second command on the same folder stops at once with an error
                                 naming the holder (pid, host, command, since when)
    refuse_results(...)          a folder that holds another run's results is an error, unless the user
                                 overwrites (`clear`, or `replacing`) or resumes it
    replacing(folder, ...)       under the lock: an overwriting run sets the old results aside and drops
                                 them only once it has written its first record; a run that fails
                                 before that (an error, or killed outright) gets them put back
    clean_stale_tmp(...)         temporary files and folders a killed writer left (their pid is gone)

The lock is an advisory `flock` on the lock file: the kernel releases it when its process ends, however it
ends, so a killed run leaves no stale lock (only its lock file, with the dead holder's details, which the
next holder takes over). (Local file systems; on a network file system that ignores
flock two runs are not kept apart.)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".specheads.lock"


class FolderInUseError(OSError):
    """Another process holds the folder's lock."""


def check_writable(folder: str | Path, what: str = "output folder") -> None:
    """Raise naming `folder` unless a file can be created in it (or, if it does not exist yet, in the
    nearest parent that does, where it will be created). Writes and removes a probe file: permission
    bits alone do not tell (root, read-only mounts)."""
    folder = Path(folder).expanduser().absolute()
    if folder.is_symlink() and not folder.exists():
        raise FileNotFoundError(
            f"{what} {folder} is a symlink to {os.readlink(folder)}, which does not exist; create that "
            "folder, or choose another"
        )
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{what} {folder} cannot be created: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".specheads-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = "" if existing == folder else f" (it would be created in {existing})"
        raise PermissionError(f"{what} {folder} is not writable{where}: {e.strerror or e}") from None


def _holder(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {since}: {info.get('command')}"


@contextmanager
def hold_folder(folder: str | Path, what: str = "output folder") -> Iterator[Path]:
    """Create `folder` and hold its lock for the block; raise FolderInUseError naming the holder if
    another process (or another block of this one) holds it. The lock file is gone after the block, and so
    is the folder when the block created it and fails leaving it empty (a refused run leaves nothing)."""
    folder = Path(folder)
    check_writable(folder, what)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    fd = _locked(lock, what, folder)
    failed = True
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(["specheads", *sys.argv[1:]]) if sys.argv else "specheads",
            "started": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield folder
        failed = False
    finally:
        # Removed while still held, so that a finished run leaves nothing behind; a process that opened
        # the old file meanwhile finds it gone once it gets the lock, and tries again (_locked).
        Path(lock).unlink(missing_ok=True)
        if failed and created and not any(folder.iterdir()):
            folder.rmdir()
        os.close(fd)


def _locked(lock: Path, what: str, folder: Path) -> int:
    """An open descriptor of `lock` holding its flock, or FolderInUseError naming the holder."""
    import fcntl  # lazy: POSIX only

    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUseError(
                f"{what} {folder} is in use by {_holder(lock)}; wait for it to finish, or choose another folder"
            ) from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed that file as it finished: lock the new one


def present(folder: str | Path, names: Iterable[str]) -> list[str]:
    """Which of `names` exist in `folder`."""
    return [n for n in names if (Path(folder) / n).exists()]


def refuse_results(folder: str | Path, names: Iterable[str], how_to_continue: str) -> None:
    """Raise FileExistsError if `folder` holds any of `names` (another run's results)."""
    found = present(folder, names)
    if found:
        raise FileExistsError(f"{folder} holds another run's results ({', '.join(found)}); {how_to_continue}")


def clear(folder: str | Path, names: Iterable[str]) -> list[str]:
    """Remove `names` (files or folders) from `folder`; returns what was removed. Other files stay."""
    removed = []
    for name in present(folder, names):
        path = Path(folder) / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        removed.append(name)
    return removed


def tmp_prefix(out: str | Path) -> str:
    """The name prefix of this process's temporary folders for `out`: `.NAME.tmp-PID-`."""
    return f".{Path(out).name}.tmp-{os.getpid()}-"


def clean_stale_tmp(out: str | Path) -> list[Path]:
    """Remove the temporary files or folders of `out` whose writer (the pid in their name) is no longer
    running, as a killed export or cache leaves them; a running writer's are left alone."""
    out = Path(out)
    removed = []
    for path in out.parent.glob(f".{out.name}.tmp-*") if out.parent.is_dir() else ():
        pid = path.name.removeprefix(f".{out.name}.tmp-").split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_results_folder(out: str | Path, results: Iterable[str], overwrite: bool) -> None:
    """Before an eval or compare does any work: `out` must be writable (and not a dangling symlink), and
    hold none of `results` (the files it writes) unless `overwrite`. Changes nothing: the old results are
    replaced only under the folder's lock, once every input has been checked (`replacing`)."""
    check_writable(out, "--out")
    if not overwrite:
        refuse_results(out, results, "pass --overwrite to replace them, or choose another --out")


ASIDE = ".specheads-replaced-"  # + pid: the old results an overwriting run has set aside
MOVING = ".specheads-moving-"  # + pid: the same while they are being moved there
DROPPED = ".specheads-dropped-"  # + pid: the same once the new run has kept its first record


class Replacement:
    """The old results an overwriting run set aside (`replacing`): dropped by `commit`, or put back by
    `restore`. Without old results (or without --overwrite) both do nothing."""

    def __init__(self, folder: Path, names: tuple[str, ...], aside: Path | None):
        self.folder, self.names, self.aside = folder, names, aside

    def commit(self) -> None:
        """The new run has written its first record: the old results go (once; later calls do nothing)."""
        if self.aside is None:
            return
        dropped = self.folder / f"{DROPPED}{os.getpid()}"
        os.rename(self.aside, dropped)  # one step: a kill after it leaves nothing to put back
        self.aside = None
        shutil.rmtree(dropped, ignore_errors=True)

    def restore(self) -> None:
        """Remove what the new run wrote of `names` and put the old results back where they were."""
        if self.aside is None:
            return
        _put_back(self.folder, self.names, self.aside)
        self.aside = None


def _put_back(folder: Path, names: Iterable[str], aside: Path) -> None:
    clear(folder, names)  # what the new run wrote of them (all the old ones were set aside)
    for path in aside.iterdir():
        os.rename(path, folder / path.name)
    aside.rmdir()


def _recover(folder: Path, names: tuple[str, ...]) -> None:
    """What an overwriting run killed outright (its pid gone) left in `folder`: old results it had set
    aside and not yet dropped are put back; old results it was dropping are removed."""
    for path in sorted(folder.glob(".specheads-*-*")) if folder.is_dir() else ():
        prefix, _, pid = path.name.rpartition("-")
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)) or not path.is_dir():
            continue
        if prefix + "-" == DROPPED:
            shutil.rmtree(path, ignore_errors=True)
        elif prefix + "-" == MOVING:  # killed while moving them: the new run had written nothing yet
            _put_back(folder, (), path)
        elif prefix + "-" == ASIDE:
            _put_back(folder, names, path)


@contextmanager
def replacing(
    folder: str | Path, results: Iterable[str], overwrite: bool, also: Iterable[str] = ()
) -> Iterator[Replacement]:
    """Inside `hold_folder`'s block, before a run writes into `folder`: without `overwrite`, refuse a
    folder holding any of `results` (checked again under the lock); with it, set `results` and `also` (a
    stopped run's progress) aside, in a hidden folder of `folder`. The run calls `commit()` once it has
    written its first record: the old results go then, not before. If the block fails before that, they are
    put back and what the run wrote of those names is removed, so the folder is as it was; a run stopped
    by KeyboardInterrupt (Ctrl-C, SIGTERM) is a stopped new run, kept for its --resume, and the old results
    go. A run killed outright leaves them set aside, and the next run on the folder puts them back."""
    folder = Path(folder)
    names = tuple(dict.fromkeys([*results, *also]))
    _recover(folder, names)
    if not overwrite:
        refuse_results(folder, results, "pass --overwrite to replace them, or choose another --out")
    old = present(folder, names) if overwrite else []
    aside = None
    if old:
        moving = folder / f"{MOVING}{os.getpid()}"
        moving.mkdir()
        for name in old:
            os.rename(folder / name, moving / name)
        aside = folder / f"{ASIDE}{os.getpid()}"
        os.rename(moving, aside)
    replacement = Replacement(folder, names, aside)
    try:
        yield replacement
    except KeyboardInterrupt:
        replacement.commit()
        raise
    except BaseException:
        replacement.restore()
        raise
    replacement.commit()
