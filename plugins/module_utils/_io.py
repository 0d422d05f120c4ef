# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small file-system helpers: atomic writes, reads that tolerate absence, directory checks."""

from __future__ import annotations

import errno
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


def rmdir_if_empty(path: str) -> bool:
    """Remove a directory planned as empty; something put there since (or a mount on it) keeps it. True when removed."""
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY, errno.ENOENT):
            raise MpsError('cannot remove the directory %s: %s' % (path, exc.strerror), path=path) from exc
        return False
    return True


def remove(path: str) -> bool:
    """Remove a file; return True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def ancestors(path: str) -> t.List[str]:
    """``path`` and every directory above it, innermost first."""
    found = []
    current = os.path.abspath(path)
    while True:
        found.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            return found
        current = parent


def missing_dirs(path: str) -> t.List[str]:
    """``path`` and those of its ancestors that are no directory yet, outermost first: what creating it creates."""
    missing = []
    for directory in ancestors(path):
        if os.path.isdir(directory):
            break
        missing.append(directory)
    return list(reversed(missing))


def ensure_dir(path: str, mode: int = 0o755) -> bool:
    """Create ``path`` (and parents) with ``mode`` when missing; refuse a symlink. True when created."""
    if os.path.islink(path):
        raise UnsafePathError('%s is a symbolic link; refusing to use it' % path, path=path)
    if os.path.isdir(path):
        return False
    # Every directory created gets ``mode`` whatever the umask: os.makedirs() would give the
    # parents umask-limited modes (0700 under umask 077, untraversable for MPS clients).
    for directory in missing_dirs(path):
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


def refuse_unsafe_dirs(dirs: t.Sequence[t.Tuple[str, str]], view: t.Optional[t.Any] = None) -> None:
    """Refuse, naming the parameter, a managed directory that another user could redirect or fill.

    ``dirs`` is (path, parameter) pairs; ``view`` the paths as a run read them (:class:`._observe.paths.PathView`; None:
    the disk now). A directory that does not exist yet is fine (it is created 0755 by root). An existing one must be a
    real directory, not a symbolic link, owned by root or by the user running the module, and not writable by others
    unless sticky.
    """
    me = os.geteuid()
    for path, param in dirs:
        if view is not None:
            entry = view.entry(path)
            if entry.kind == 'missing':
                continue
            kind, mode, uid, link, error = entry.kind, entry.mode or 0, entry.uid, entry.link, entry.error
        else:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise UnsafePathError('%s: cannot inspect %s: %s' % (param, path, exc.strerror or exc), path=path, param=param) from exc
            kind = 'directory' if stat.S_ISDIR(st.st_mode) else 'symbolic link' if stat.S_ISLNK(st.st_mode) else 'file'
            mode, uid, link, error = stat.S_IMODE(st.st_mode), st.st_uid, os.readlink(path) if stat.S_ISLNK(st.st_mode) else None, ''
        if error and kind not in ('directory', 'symbolic link', 'file'):
            raise UnsafePathError('%s: cannot inspect %s: %s' % (param, path, error), path=path, param=param)
        if kind == 'symbolic link':
            raise UnsafePathError('%s: %s is a symbolic link (to %s); refusing to use it - give the real path' % (
                param, path, link), path=path, param=param)
        if kind != 'directory':
            raise UnsafePathError('%s: %s exists and is not a directory' % (param, path), path=path, param=param)
        if uid not in (0, me):
            raise UnsafePathError('%s: %s is owned by uid %d, not by root; refusing to use it' % (param, path, uid),
                                  path=path, param=param)
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise UnsafePathError('%s: %s is writable by every user (mode %04o); refusing to use it (chmod o-w)' % (
                param, path, mode), path=path, param=param)


def untraversable(view: t.Any, path: str) -> t.List[str]:
    """Existing ancestors of ``path`` (and ``path``) that other users cannot traverse (no o+x), as ``view`` read them
    (:func:`ancestors`: a run reads them all).

    The MPS server runs as the client's uid and must reach ``<pipe>/log``: a 0700 parent makes every non-root client fail.
    """
    modes = [(directory, view.mode(directory)) for directory in reversed(ancestors(path))]
    return [directory for directory, mode in modes if mode is not None and not mode & stat.S_IXOTH]


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
