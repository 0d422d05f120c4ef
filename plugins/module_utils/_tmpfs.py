# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tmpfs on a path: its size, what the kernel has mounted there, and the fstab line that mounts it at boot."""

from __future__ import annotations

import math
import os
import re
import stat
import typing as t
from dataclasses import dataclass, field

from ._errors import InvalidParameterError, MpsError
from ._io import read_text
from ._proc import read_mountinfo
from ._resource.layout import systemd_instance

FLAGS = ('rw', 'nosuid', 'nodev', 'noexec')
SIZE_FORM = 'a percentage of RAM from 1% to 100% (e.g. "50%", the default) or a size with a k, m, g or t suffix (e.g. "16G")'
FSTAB_MARK = '# gpufleet.mps: tmpfs shared by MPS daemons and container clients as /dev/shm:'
_UNITS = {'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}


def memory_pages() -> t.Tuple[int, int]:
    """(total RAM in pages, page size) as the kernel's tmpfs sizes count them."""
    return os.sysconf('SC_PHYS_PAGES'), os.sysconf('SC_PAGE_SIZE')


def size_kib(size: object, pages: t.Optional[t.Tuple[int, int]] = None, param: str = 'size') -> int:
    """The size in KiB the kernel gives a tmpfs mounted with ``size=<size>`` (rounded up to pages)."""
    total, page = pages or memory_pages()
    text = str(size).lower() if isinstance(size, (str, int)) and not isinstance(size, bool) else ''
    percent = re.fullmatch(r'(\d{1,3})%', text)
    absolute = re.fullmatch(r'(\d+)([kmgt]?)', text)
    if percent and 1 <= int(percent.group(1)) <= 100:
        blocks = math.ceil(int(percent.group(1)) * total / 100)
    elif absolute and int(absolute.group(1)) > 0:
        value = int(absolute.group(1)) * _UNITS.get(absolute.group(2), 1)
        blocks = math.ceil(value / page)
    else:
        raise InvalidParameterError(param, 'must be %s, got %r' % (SIZE_FORM, size))
    return blocks * page // 1024


@dataclass
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mount_point: str
    fstype: str
    source: str
    flags: t.List[str]
    super_options: t.Dict[str, str] = field(default_factory=dict)
    device: str = ''
    mount_root: str = '/'


def _unescape(text: str) -> str:
    return re.sub(r'\\([0-7]{3})', lambda match: chr(int(match.group(1), 8)), text)


def parse_mountinfo(text: str) -> t.List[MountEntry]:
    entries = []
    for line in text.splitlines():
        head, sep, tail = line.partition(' - ')
        fields = head.split()
        rest = tail.split()
        if not sep or len(fields) < 6 or len(rest) < 3:
            continue
        options = {}
        for item in rest[2].split(','):
            key, value = item.split('=', 1) if '=' in item else (item, '')
            options[key] = value
        entries.append(MountEntry(_unescape(fields[4]), rest[0], _unescape(rest[1]), fields[5].split(','), options,
                                  device=fields[2], mount_root=_unescape(fields[3])))
    return entries


def real_path(path: str) -> str:
    """``path`` with symbolic links of its parents resolved, as the kernel writes mount points."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mounted_at(path: str, mountinfo: t.Optional[str] = None, real: t.Optional[str] = None) -> t.Optional[MountEntry]:
    """The file system mounted on ``path`` (the topmost when mounts are stacked), or None. ``real``: its real path (as
    :func:`real_path` gives it; a run's view has it)."""
    text = mountinfo if mountinfo is not None else read_mountinfo()
    return _mounted_at(path, parse_mountinfo(text), real)


def _mounted_at(path: str, entries: t.Sequence[MountEntry], real: t.Optional[str] = None) -> t.Optional[MountEntry]:
    wanted = real or real_path(path)
    found = None
    for entry in entries:
        if entry.mount_point == wanted:
            found = entry
    return found


def escape_fstab(path: str) -> str:
    return ''.join('\\%03o' % ord(char) if char in ' \t\n\\' else char for char in path)


@dataclass
class ShmState:
    """What is there, or what is wanted."""

    mounted: bool
    size_kib: t.Optional[int] = None
    flags: t.List[str] = field(default_factory=list)
    mode: t.Optional[str] = None

    def view(self) -> t.Dict[str, t.Any]:
        return {'mounted': self.mounted, 'size_kib': self.size_kib, 'options': self.flags, 'mode': self.mode}


def current_state(path: str, pages: t.Optional[t.Tuple[int, int]] = None, mountinfo: t.Optional[str] = None,
                  mode_of: t.Optional[t.Callable[[str], t.Optional[int]]] = None, real: t.Optional[str] = None) -> ShmState:
    """The tmpfs on ``path`` as the kernel reports it (the kernel omits size= at its default, half of RAM).

    Anything but a tmpfs of its own - another file system, or a bind mount of some other tmpfs (a
    resize would resize that one, e.g. the host's /dev/shm) - is refused.
    """
    text = mountinfo if mountinfo is not None else read_mountinfo()
    entries = parse_mountinfo(text)
    entry = _mounted_at(path, entries, real)
    if entry is None:
        return ShmState(mounted=False)
    if entry.fstype != 'tmpfs':
        raise MpsError('%s is a mount point of a %s file system (%s), not a tmpfs; refusing to mount over it or '
                       'unmount it' % (path, entry.fstype, entry.source), path=path)
    others = sorted({other.mount_point for other in entries if other.device == entry.device and other.mount_point != entry.mount_point})
    if entry.mount_root != '/' or others:
        raise MpsError('%s is a bind mount of a tmpfs that is also mounted elsewhere (%s); refusing to resize or unmount '
                       'it - unmount it and let this module mount a tmpfs of its own' % (
                           path, ', '.join(others) or 'its directory %s' % entry.mount_root), path=path)
    total, page = pages or memory_pages()
    size = entry.super_options.get('size')
    kib = int(size[:-1]) if size and size.endswith('k') and size[:-1].isdigit() else (total // 2) * page // 1024
    if mode_of is not None:
        bits = mode_of(path)
        mode = format(bits, '04o') if bits is not None else None
    else:
        try:
            mode = format(stat.S_IMODE(os.stat(path).st_mode), '04o')
        except OSError:
            mode = None
    return ShmState(mounted=True, size_kib=kib, flags=[flag for flag in FLAGS if flag in entry.flags], mode=mode)


def mount_options(kib: int) -> str:
    return ','.join(FLAGS) + ',size=%dk,mode=1777' % kib


def fstab_line(path: str, kib: int) -> str:
    # X-mount.mkdir: at boot /run is empty, and only systemd's fstab generator creates mount points itself.
    return 'tmpfs %s tmpfs %s,X-mount.mkdir 0 0' % (escape_fstab(path), mount_options(kib))


def _fstab_mark(path: str) -> str:
    return '%s %s' % (FSTAB_MARK, escape_fstab(path))


def _is_entry_for(line: str, path: str) -> bool:
    fields = line.split()
    return len(fields) >= 2 and not fields[0].startswith('#') and os.path.normpath(_unescape(fields[1])) == path


def fstab_entries(text: str, path: str) -> t.List[str]:
    """The fstab lines that mount something on ``path``."""
    return [line for line in text.splitlines() if _is_entry_for(line, path)]


def fstab_edit(text: str, path: str, line: t.Optional[str]) -> str:
    """``text`` with the entries for ``path`` (and their mark) replaced by ``line`` (removed when None).

    Returns ``text`` itself when its entries for ``path`` are already exactly ``line``, so that a file
    is rewritten only when an entry really changes.
    """
    if fstab_entries(text, path) == ([line] if line is not None else []):
        return text
    mark = _fstab_mark(path)
    out = [current for current in text.splitlines() if current != mark and not _is_entry_for(current, path)]
    if line is not None:
        out += [mark, line]
    return '\n'.join(out) + '\n' if out else ''


def mount_unit_name(path: str) -> str:
    """``systemd-escape --path --suffix=mount PATH``."""
    return systemd_instance(os.path.normpath(path).strip('/')) + '.mount'


def shm_persisted(path: str, unit_dir: str, fstab: str = '/etc/fstab',
                  reader: t.Optional[t.Callable[[str], t.Optional[str]]] = None, real: t.Optional[str] = None) -> bool:
    """Whether a mount unit or an fstab line mounts ``path`` (real path ``real``) at boot (``reader``: the files as a run
    read them)."""
    path = real or real_path(path)
    read = reader or read_text
    return read(os.path.join(unit_dir, mount_unit_name(path))) is not None or bool(fstab_entries(read(fstab) or '', path))


def check_unit_path(path: str, param: str) -> None:
    """Refuse a path that a unit file cannot carry as written (specifiers, separators, name length)."""
    if any(char.isspace() or char in '%:\\"\'' for char in path):
        raise InvalidParameterError(param, '%r cannot be written into a systemd unit: use a root without spaces, quotes, '
                                    '"%%", ":" or "\\"' % path)
    if len(mount_unit_name(path)) > 255:
        raise InvalidParameterError(param, 'the mount unit name for %s would be longer than 255 characters' % path)
