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
from .._io import ensure_dir
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

    def __init__(self, root: str, exclusive: bool) -> None:
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


class ResourceLock:
    """An exclusive lock per resource, so concurrent runs on one host never double-start a daemon; it holds
    its root's lock shared meanwhile."""

    def __init__(self, path: str, root: t.Optional[str] = None) -> None:
        self.path = path
        self._root = RootLock(root, exclusive=False) if root else None
        self._fd: t.Optional[int] = None

    def __enter__(self) -> 'ResourceLock':
        ensure_dir(os.path.dirname(self.path), 0o755)
        if self._root is not None:
            self._root.__enter__()
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            if self._root is not None:
                self._root.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._root is not None:
            self._root.__exit__(*exc_info)


class HostLock(RootLock):
    """The root's lock for a whole host's run (``mps_host``): one run at a time, with a bounded wait.

    Exclusive for a run that may change the host, shared for a check-mode preview. It is the root directory's
    own ``flock``, so it creates no file (a preview changes nothing); a root that does not exist yet has no
    concurrent user to wait for. ``waited`` says whether another run held it: what was read before is stale.
    """

    POLL = 0.05

    def __init__(self, root: str, exclusive: bool, timeout: float) -> None:
        super().__init__(root, exclusive)
        self.timeout = timeout
        self.waited = False

    def __enter__(self) -> 'HostLock':
        try:
            self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return self
        mode = (fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self._fd, mode)
                return self
            except BlockingIOError:
                self.waited = True
                if time.monotonic() >= deadline:
                    os.close(self._fd)
                    self._fd = None
                    raise MpsError('another run of mps_host (or mps_shm) on this host still holds %s after %ds: nothing '
                                   'was done; run again when it has finished' % (self.root, self.timeout), path=self.root)
                time.sleep(self.POLL)
