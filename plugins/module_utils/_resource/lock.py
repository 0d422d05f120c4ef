# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock of one resource: every writer of the resource's files takes it, daemon running or not."""

from __future__ import annotations

import fcntl
import os
import typing as t

from .._io import ensure_dir
from .layout import ResourcePaths

# In <root>/<name>/: it belongs to the resource, not to one of its users.
RESOURCE_LOCK = '.lock'


def resource_lock(paths: ResourcePaths) -> 'ResourceLock':
    """The lock of one resource (``<root>/<name>/.lock``): every writer of the resource takes it, daemon running or not."""
    return ResourceLock(os.path.join(paths.resource_dir, RESOURCE_LOCK))


class ResourceLock:
    """An exclusive lock per resource, so concurrent runs on one host never double-start a daemon."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: t.Optional[int] = None

    def __enter__(self) -> 'ResourceLock':
        ensure_dir(os.path.dirname(self.path), 0o755)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
