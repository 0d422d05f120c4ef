# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small file-system helpers: atomic writes, reads that tolerate absence, directory checks."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import typing as t

from ._errors import MpsError, UnsafePathError


def read_text(path: str) -> t.Optional[str]:
    """The file's text, or None when it does not exist."""
    try:
        with open(path, encoding='utf-8') as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> t.Optional[t.Any]:
    """The parsed JSON document, or None when the file is missing or not valid JSON."""
    return parse_json(read_text(path))


def parse_json(text: t.Optional[str]) -> t.Optional[t.Any]:
    """The parsed JSON document of ``text``, or None when there is none or it is not valid JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def atomic_write(path: str, content: str, mode: int = 0o644) -> bool:
    """Write ``content`` to ``path`` atomically; return True when the file changed.

    The new content goes to a temporary file in the same directory, is flushed to disk, and
    replaces the old file with one rename: a reader sees the old or the new file, never a
    truncated one, and a failure (read-only or full file system) leaves the old file intact.
    """
    if read_text(path) == content and stat.S_IMODE(os.stat(path).st_mode) == mode:
        return False
    directory = os.path.dirname(path) or '.'
    try:
        fd, tmp = tempfile.mkstemp(prefix='.%s.' % os.path.basename(path), suffix='.tmp', dir=directory)
    except OSError as exc:
        raise MpsError('cannot write %s: %s' % (path, exc.strerror or exc), path=path) from exc
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise MpsError('cannot write %s: %s' % (path, exc.strerror or exc), path=path) from exc
    return True


def remove(path: str) -> bool:
    """Remove a file; return True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def ensure_dir(path: str, mode: int = 0o755) -> bool:
    """Create ``path`` (and parents) with ``mode`` when missing; refuse a symlink. True when created."""
    if os.path.islink(path):
        raise UnsafePathError('%s is a symbolic link; refusing to use it' % path, path=path)
    if os.path.isdir(path):
        return False
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    # Every directory created gets ``mode`` whatever the umask: os.makedirs() would give the
    # parents umask-limited modes (0700 under umask 077, untraversable for MPS clients).
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise MpsError('cannot create directory %s: a file is in the way' % directory, path=directory) from None
            continue
        except OSError as exc:
            raise MpsError('cannot create directory %s: %s' % (directory, exc.strerror or exc), path=directory) from exc
        os.chmod(directory, mode)
    return True


def untraversable_parents(path: str) -> t.List[str]:
    """Existing ancestors of ``path`` (and ``path``) that other users cannot traverse (no o+x).

    The MPS server runs as the client's uid and must reach ``<pipe>/log``: a 0700 parent makes every
    non-root client fail.
    """
    blocked = []
    current = os.path.abspath(path)
    while True:
        try:
            mode = os.stat(current).st_mode
        except OSError:
            mode = None
        if mode is not None and not mode & stat.S_IXOTH:
            blocked.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return list(reversed(blocked))


def refuse_unsafe_dirs(dirs: t.Sequence[t.Tuple[str, str]]) -> None:
    """Refuse, naming the parameter, a managed directory that another user could redirect or fill.

    ``dirs`` is (path, parameter) pairs. A directory that does not exist yet is fine (it is created
    0755 by root). An existing one must be a real directory, not a symbolic link, owned by root or by
    the user running the module, and not writable by others unless sticky.
    """
    me = os.geteuid()
    for path, param in dirs:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UnsafePathError('%s: cannot inspect %s: %s' % (param, path, exc.strerror or exc), path=path, param=param) from exc
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError('%s: %s is a symbolic link (to %s); refusing to use it - give the real path' % (
                param, path, os.readlink(path)), path=path, param=param)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError('%s: %s exists and is not a directory' % (param, path), path=path, param=param)
        if st.st_uid not in (0, me):
            raise UnsafePathError('%s: %s is owned by uid %d, not by root; refusing to use it' % (param, path, st.st_uid),
                                  path=path, param=param)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError('%s: %s is writable by every user (mode %04o); refusing to use it (chmod o-w)' % (
                param, path, stat.S_IMODE(st.st_mode)), path=path, param=param)


def restorer(path: str, observed: t.Optional[t.Tuple[t.Optional[str], t.Optional[int]]] = None) -> t.Callable[[], None]:
    """Read ``path`` now (or take its ``observed`` text and mode); the function returned puts that content (and mode)
    back, or removes a file that was not there."""
    if observed is not None:
        text, mode = observed[0], observed[1] if observed[1] is not None else 0o644
    else:
        text = read_text(path)
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            mode = 0o644

    def restore() -> None:
        if text is None:
            remove(path)
        else:
            atomic_write(path, text, mode)
    return restore
