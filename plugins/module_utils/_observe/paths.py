# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The file system as one run read it, once: every path a decision may look at, with its type, mode and owner, and -
for the paths read as files or listed as directories - its text or its entries.

:func:`read_paths` is the one reader; :class:`PathView` is frozen once read. A decision asks it, never the disk: a path
it was not given is an internal error (:class:`ViewMiss`), not a read, so a decision cannot quietly depend on more than
was observed. A path of the wrong type - a directory where a state file belongs - is a refusal that names the path,
what it should be and how to repair it (:class:`WrongTypeError`), raised by the decision that needs the file.
"""

from __future__ import annotations

import os
import stat
import typing as t
from dataclasses import dataclass

from .._errors import MpsError

MISSING = 'missing'
FILE = 'file'
DIRECTORY = 'directory'
LINK = 'symbolic link'
OTHER = 'special file'


class ViewMiss(MpsError):
    """A decision asked about a path that the run did not read: a defect of this collection, not of the host."""

    def __init__(self, path: str) -> None:
        super().__init__('internal error: the plan asked about %s, which this run did not read first; nothing was changed '
                         '(please report this)' % path, path=path)


class WrongTypeError(MpsError):
    """A path this collection owns is of another type than it writes there (a directory where a file belongs)."""

    def __init__(self, path: str, what: str, found: str) -> None:
        super().__init__('%s should be %s, and it is a %s: nothing was changed. Move it away or remove it (rm -r %s) and run '
                         'again; this collection writes it anew' % (path, what, found, path), path=path)


@dataclass(frozen=True)
class Entry:
    """One path as read: its type (of the path itself; a link's target in ``target``), mode and owner, text, entries."""

    kind: str
    mode: t.Optional[int] = None
    uid: t.Optional[int] = None
    # the text of a file read as one (None: not read, not a file, or not readable: ``error`` says why)
    text: t.Optional[str] = None
    # the sorted entries of a directory listed (None: not listed, or not a readable directory)
    entries: t.Optional[t.Tuple[str, ...]] = None
    # what a symbolic link points to (its kind), where the path is one
    target: t.Optional[str] = None
    error: str = ''
    # a mount point (asked only where a removal may meet one)
    mount: bool = False
    # where a symbolic link points (its text)
    link: t.Optional[str] = None


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISLNK(mode):
        return LINK
    return OTHER


def _entry(path: str, *, read: bool, listed: bool, mounts: t.Optional[t.AbstractSet[str]]) -> Entry:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Entry(MISSING)
    except OSError as exc:
        return Entry(OTHER, error=exc.strerror or str(exc))
    kind = _kind(st.st_mode)
    target = link = None
    if kind == LINK:
        try:
            link = os.readlink(path)
            target = _kind(os.stat(path).st_mode)
        except OSError:
            target = MISSING
    effective = target or kind
    text, entries, error = None, None, ''
    if read and effective == FILE:
        try:
            with open(path, encoding='utf-8') as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            error = getattr(exc, 'strerror', None) or str(exc)
    if listed and effective == DIRECTORY:
        try:
            entries = tuple(sorted(os.listdir(path)))
        except OSError as exc:
            error = exc.strerror or str(exc)
    mount = mounts is not None and _is_mount(path, kind, mounts)
    return Entry(kind, stat.S_IMODE(st.st_mode), st.st_uid, text, entries, target, error, mount, link)


def _is_mount(path: str, kind: str, mounts: t.AbstractSet[str]) -> bool:
    return kind == DIRECTORY and (os.path.normpath(path) in mounts or os.path.realpath(path) in mounts)


def _with_mount(entry: Entry, path: str, mounts: t.AbstractSet[str]) -> Entry:
    return Entry(entry.kind, entry.mode, entry.uid, entry.text, entry.entries, entry.target, entry.error,
                 _is_mount(path, entry.kind, mounts), entry.link)


class PathView:
    """The paths one run read (:func:`read_paths`), answered from memory; frozen."""

    def __init__(self, entries: t.Mapping[str, Entry], *, mounts_read: bool = False) -> None:
        self._entries = dict(entries)
        self.mounts_read = mounts_read

    def __contains__(self, path: str) -> bool:
        return os.path.normpath(path) in self._entries

    def paths(self) -> t.List[str]:
        return sorted(self._entries)

    def entry(self, path: str) -> Entry:
        found = self._entries.get(os.path.normpath(path))
        if found is None:
            raise ViewMiss(path)
        return found

    def merged(self, other: 'PathView') -> 'PathView':
        """Both views' paths; ``other`` wins where both read one (it was read later)."""
        entries = dict(self._entries)
        entries.update(other._entries)  # pylint: disable=protected-access
        return PathView(entries, mounts_read=self.mounts_read and other.mounts_read)

    def with_mounts(self, mountinfo: str) -> 'PathView':
        """The same paths, each directory marked as a mount point or not by the mount table ``mountinfo``."""
        mounts = mount_points(mountinfo)
        return PathView({path: _with_mount(entry, path, mounts) for path, entry in self._entries.items()}, mounts_read=True)

    # --- os.path's questions ------------------------------------------------------------------
    def lexists(self, path: str) -> bool:
        return self.entry(path).kind != MISSING

    def exists(self, path: str) -> bool:
        entry = self.entry(path)
        return entry.kind not in (MISSING, LINK) or entry.target not in (None, MISSING)

    def isdir(self, path: str) -> bool:
        entry = self.entry(path)
        return entry.kind == DIRECTORY or (entry.kind == LINK and entry.target == DIRECTORY)

    def islink(self, path: str) -> bool:
        return self.entry(path).kind == LINK

    def ismount(self, path: str) -> bool:
        if not self.mounts_read:
            raise ViewMiss('the mount table (for %s)' % path)
        return self.entry(path).mount

    def mode(self, path: str) -> t.Optional[int]:
        """The mode bits of the path (a link's own); None when it is missing."""
        entry = self.entry(path)
        return None if entry.kind == MISSING else entry.mode

    # --- contents ---------------------------------------------------------------------------------
    def text(self, path: str, what: str = 'a file') -> t.Optional[str]:
        """The file's text; None when it does not exist. A directory (or another non-file) there is refused, naming
        ``what`` the file is; a file that was not read as one is an internal error."""
        entry = self.entry(path)
        if entry.kind == MISSING or (entry.kind == LINK and entry.target == MISSING):
            return None
        effective = entry.target or entry.kind
        if effective != FILE:
            raise WrongTypeError(path, what, effective)
        if entry.text is None:
            if entry.error:
                raise MpsError('%s (%s) cannot be read: %s; nothing was changed' % (path, what, entry.error), path=path)
            raise ViewMiss(path + ' (its text)')
        return entry.text

    def listdir(self, path: str) -> t.List[str]:
        """The directory's entries, as os.listdir (OSError when it is no readable directory)."""
        entry = self.entry(path)
        if entry.entries is None:
            if entry.kind == DIRECTORY and not entry.error:
                raise ViewMiss(path + ' (its entries)')
            raise OSError('%s is not a readable directory' % path)
        return list(entry.entries)

    def require_absent_or(self, path: str, kind: str, what: str) -> None:
        """Refuse, naming ``what`` it should be, a path that exists as something other than ``kind``."""
        entry = self.entry(path)
        effective = entry.target or entry.kind
        if entry.kind != MISSING and effective != kind:
            raise WrongTypeError(path, what, effective)


def mount_points(mountinfo: str) -> t.FrozenSet[str]:
    """The mount points of a mount table (``/proc/self/mountinfo``'s fifth field, unescaped)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(fields[4].replace('\\040', ' ').replace('\\011', '\t').replace('\\012', '\n').replace('\\134', '\\'))
    return frozenset(points)


def read_paths(files: t.Iterable[str] = (), dirs: t.Iterable[str] = (), others: t.Iterable[str] = (),
               mountinfo: t.Optional[str] = None) -> PathView:
    """Read each of ``files`` (type, mode, owner, text), ``dirs`` (the same, and their entries) and ``others`` (type, mode
    and owner only) once. With ``mountinfo`` (the mount table's text), each directory says whether it is a mount point."""
    wanted: t.Dict[str, t.List[bool]] = {}
    for group, index in ((files, 0), (dirs, 1), (others, 2)):
        for path in group:
            flags = wanted.setdefault(os.path.normpath(path), [False, False])
            if index < 2:
                flags[index] = True
    mounts = mount_points(mountinfo) if mountinfo is not None else None
    return PathView({path: _entry(path, read=read, listed=listed, mounts=mounts) for path, (read, listed) in wanted.items()}, mounts_read=mounts is not None)
