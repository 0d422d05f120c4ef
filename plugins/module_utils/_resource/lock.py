# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Locks: one per resource, taken by every writer of the resource's files; one per root, shared by them and
taken alone by what changes the whole root (the shared ``<root>/shm`` tmpfs).

Order, to never deadlock: the root's lock first, then the resource's.
"""

from __future__ import annotations

import fcntl
import os
import time
import typing as t

from .._errors import MpsError
from .._io import ensure_dir, missing_dirs
from .layout import ResourcePaths

# In <root>/<name>/: it belongs to the resource, not to one of its users.
RESOURCE_LOCK = '.lock'


def resource_lock(paths: ResourcePaths) -> 'ResourceLock':
    """The lock of one resource (``<root>/<name>/.lock``): every writer of the resource takes it, daemon running or not."""
    return ResourceLock(os.path.join(paths.resource_dir, RESOURCE_LOCK), paths.root)


class RootLock:
    """A lock on the root directory itself (``flock`` on the directory: no file to create, none left behind).

    Shared by every run on one resource (several resources change side by side), exclusive for
    ``mps_shm``, whose tmpfs every daemon started with ``shm=true`` binds as its ``/dev/shm``: a mount,
    resize or unmount never happens while a daemon of the root is being started, stopped or given limits.
    A root that does not exist has nothing to protect: no lock is taken.
    """

    def __init__(self, root: str, *, exclusive: bool) -> None:
        self.root = root
        self.exclusive = exclusive
        self._fd: t.Optional[int] = None

    def __enter__(self) -> 'RootLock':
        try:
            self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return self
        fcntl.flock(self._fd, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: str) -> bool:
    """The locked file is still the one at ``path``: a run that gave up its lock may have removed it meanwhile."""
    try:
        held, now = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


class ResourceLock:
    """An exclusive lock per resource, so concurrent runs on one host never double-start a daemon; it holds
    its root's lock shared meanwhile."""

    def __init__(self, path: str, root: t.Optional[str] = None) -> None:
        self.path = path
        self._root_path = root
        self._root: t.Optional[RootLock] = None
        self._fd: t.Optional[int] = None
        # What taking the lock created (directories, outermost first; the lock file): a refused run removes them again.
        self.created: t.List[str] = []

    def __enter__(self) -> 'ResourceLock':
        while True:
            made = missing_dirs(os.path.dirname(self.path))
            ensure_dir(os.path.dirname(self.path), 0o755)
            self.created += [path for path in made if path not in self.created]
            self._root = RootLock(self._root_path, exclusive=False) if self._root_path else None
            if self._root is not None:
                self._root.__enter__()
            try:
                existed = os.path.exists(self.path)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                if self._root is not None:
                    self._root.__exit__(None, None, None)
                raise
            if _same_file(self._fd, self.path):
                if not existed and self.path not in self.created:
                    self.created.append(self.path)
                return self
            # The run that held it gave it up and removed it (a refused run leaves nothing behind): take the new one.
            self.__exit__(None, None, None)

    def discard(self) -> None:
        """Remove what taking the lock created - a refused run leaves the host as it found it - and release it."""
        for path in reversed(self.created):
            try:
                if path == self.path:
                    os.unlink(path)
                else:
                    os.rmdir(path)
            except OSError:
                break  # something else is there now: it stays, and so does everything above it
        self.created = []

    def __exit__(self, *exc_info: t.Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._root is not None:
            self._root.__exit__(*exc_info)
            self._root = None


class HostLock(RootLock):
    """The root's lock for a whole host's run (``mps_host``): one run at a time, with a bounded wait.

    Exclusive for a run that may change the host, shared for a check-mode preview. It is the root directory's
    own ``flock``, so it creates no file (a preview changes nothing). A real run creates the root first, so that a run
    on a new host waits for another run on it too, and discards it again when it is refused (:meth:`discard`); a check-mode
    preview of a root that does not exist yet has nothing to wait for. ``waited`` says whether another run held it:
    what was read before is stale.
    """

    POLL = 0.05

    def __init__(self, root: str, *, exclusive: bool, timeout: float, create: bool = False) -> None:
        super().__init__(root, exclusive=exclusive)
        self.timeout = timeout
        self.waited = False
        self.create = create
        self.created: t.List[str] = []

    def __enter__(self) -> 'HostLock':
        deadline = time.monotonic() + self.timeout
        while True:
            if self.create:
                made = missing_dirs(self.root)
                ensure_dir(self.root, 0o755)
                self.created += [path for path in made if path not in self.created]
            try:
                self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                return self
            mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
            while True:
                try:
                    fcntl.flock(self._fd, mode)
                    break
                except BlockingIOError:
                    self.waited = True
                    if time.monotonic() >= deadline:
                        os.close(self._fd)
                        self._fd = None
                        raise MpsError('another run of mps_host (or mps_shm) on this host still holds %s after %ds: nothing '
                                       'was done; run again when it has finished' % (self.root, self.timeout), path=self.root)
                    time.sleep(self.POLL)
            if _same_file(self._fd, self.root):
                return self
            # The run that held it was refused and removed the root it had made: lock the one there now.
            self.__exit__(None, None, None)

    def discard(self) -> None:
        """Remove the root (and its parents) this run created, where nothing was put there since: a refused run leaves
        the host as it found it."""
        for path in reversed(self.created):
            try:
                os.rmdir(path)
            except OSError:
                break
        self.created = []
