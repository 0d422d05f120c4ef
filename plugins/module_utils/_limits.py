# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MPS limits: the value model, sizes, replicas, comparison with the daemon's read-back, persistence.

MPS forgets ``set_default_*`` on every restart and changes only servers started afterwards. The
wanted limits of a resource are therefore persisted under the config directory, and replayed right
after every start: by mps_daemon for the daemons it supervises, by the systemd unit for the others.

Two files per resource (``<instance>`` is the systemd-escaped resource name):

``<instance>.limits.json``
    The truth: what was asked for, device memory keyed by GPU UUID (or ``*`` for every GPU of the
    daemon), so it stays right whatever order the daemon's devices have.
``<instance>.limits``
    The same as control commands for the daemon's current device order, one per line, fed to the
    control UI by the systemd unit after every start. Derived; rewritten whenever either changes.
"""

from __future__ import annotations

import json
import math
import re
import typing as t
from dataclasses import dataclass, field

from ._control import command
from ._errors import InvalidParameterError, MpsError
from ._io import atomic_write, read_json, read_text, remove
from ._root import ConfigPaths

FORMAT_VERSION = 1
EVERY_GPU = '*'
REPLAYABLE = ('set_default_active_thread_percentage', 'set_default_device_pinned_mem_limit')
SIZE_FORM = 'a size such as 20G, 20480M, 20GiB or 1.5G (M and MiB are 2^20 bytes, G and GiB 2^30)'
_SIZE = re.compile(r'(?P<number>\d+(?:\.\d+)?)(?P<unit>[MG])(?:i?B)?', re.IGNORECASE)
_READBACK = re.compile(r'(?P<number>\d+)(?P<unit>[MG])')
_PERCENT_TOLERANCE = 0.05


def parse_size(value: t.Any, param: str) -> int:
    """A size in whole MiB. Plain numbers are refused: the unit must be explicit."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidParameterError(param, '%r is not %s' % (value, SIZE_FORM))
    match = _SIZE.fullmatch(str(value))
    if not match:
        raise InvalidParameterError(param, '%r is not %s' % (value, SIZE_FORM))
    number = float(match.group('number'))
    mib = number * (1024 if match.group('unit').upper() == 'G' else 1)
    if not mib.is_integer():
        raise InvalidParameterError(param, '%r is not a whole number of MiB (%.2f MiB)' % (value, mib))
    if mib <= 0:
        raise InvalidParameterError(param, '%r must be greater than zero' % (value,))
    return int(mib)


def parse_percentage(value: t.Any, param: str = 'active_thread_percentage') -> float:
    """A thread percentage: a number, 0 < x <= 100."""
    if isinstance(value, bool):
        raise InvalidParameterError(param, 'must be a number greater than 0 and at most 100')
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(param, '%r is not a number greater than 0 and at most 100' % (value,)) from None
    if not (0 < number <= 100) or math.isnan(number):
        raise InvalidParameterError(param, '%s is not greater than 0 and at most 100' % value)
    return round(number, 1) if round(number, 1) == number else number


def format_percentage(value: float) -> str:
    return ('%.1f' % value) if round(value, 1) == value else repr(value)


def parse_readback(text: str) -> t.Optional[t.Tuple[int, int]]:
    """The range of MiB a memory read-back stands for: ``3G`` -> [3072, 4096), ``512M`` -> [512, 513).

    None for an unset limit - how the daemon prints one is undocumented (empty, ``0``, ``0M``...) - and
    for a reply that is no size at all (``N/A``, ``No limit``, whatever a new driver prints): either way
    it matches no wanted limit, so a wanted one is applied again (:func:`readback_readable` tells which).
    """
    text = text.strip()
    match = _READBACK.fullmatch(text)
    if not match:
        return None
    number = int(match.group('number'))
    if number == 0:
        return None
    if match.group('unit') == 'G':
        return number * 1024, (number + 1) * 1024
    return number, number + 1


def readback_readable(text: t.Optional[str]) -> bool:
    """Whether a memory read-back is a size or the plain unset forms (empty, ``0``), not an unknown reply."""
    text = (text or '').strip()
    return text in ('', '0') or bool(_READBACK.fullmatch(text))


def readback_matches(readback: t.Optional[t.Tuple[int, int]], mib: int) -> bool:
    """Whether the daemon's (possibly lossy) read-back is consistent with ``mib``."""
    return readback is not None and readback[0] <= mib < readback[1]


def percentage_matches(reported: t.Optional[float], wanted: float) -> bool:
    return reported is not None and abs(reported - wanted) < _PERCENT_TOLERANCE


@dataclass
class Limits:
    """Wanted defaults of one resource. None means "not managed"."""

    active_thread_percentage: t.Optional[float] = None
    # GPU UUID (or EVERY_GPU) -> MiB
    pinned_device_mem_limit: t.Dict[str, int] = field(default_factory=dict)
    replicas: t.Optional[int] = None

    def to_json(self) -> str:
        data = {
            'format': FORMAT_VERSION,
            'active_thread_percentage': self.active_thread_percentage,
            'pinned_device_mem_limit_mib': dict(sorted(self.pinned_device_mem_limit.items())),
            'replicas': self.replicas,
        }
        return json.dumps(data, indent=2, sort_keys=True) + '\n'

    @classmethod
    def from_data(cls, data: t.Any) -> t.Optional['Limits']:
        if not isinstance(data, dict) or data.get('format') != FORMAT_VERSION:
            return None
        pct = data.get('active_thread_percentage')
        mem = data.get('pinned_device_mem_limit_mib') or {}
        try:
            return cls(
                active_thread_percentage=None if pct is None else float(pct),
                pinned_device_mem_limit={str(key): int(value) for key, value in mem.items()},
                replicas=data.get('replicas'),
            )
        except (TypeError, ValueError, AttributeError):
            return None

    def mem_for(self, uuid: str) -> t.Optional[int]:
        return self.pinned_device_mem_limit.get(uuid, self.pinned_device_mem_limit.get(EVERY_GPU))

    def commands(self, device_uuids: t.Sequence[str]) -> t.List[str]:
        """The control commands that give a daemon with these devices (in ordinal order) these defaults.

        Devices are addressed by ordinal: limits set by UUID are accepted but not applied by real drivers.
        """
        cmds = []
        for ordinal, uuid in enumerate(device_uuids):
            mib = self.mem_for(uuid)
            if mib is not None:
                cmds.append(command('set_default_device_pinned_mem_limit', ordinal, '%dM' % mib))
        if self.active_thread_percentage is not None:
            cmds.append(command('set_default_active_thread_percentage', format_percentage(self.active_thread_percentage)))
        return cmds


def read_persisted(config: ConfigPaths) -> t.Optional[Limits]:
    """The persisted wanted limits, or None when there are none (or the file is unreadable)."""
    return Limits.from_data(read_json(config.limits_json))


def replay_text(limits: t.Optional[Limits], device_uuids: t.Sequence[str]) -> str:
    cmds = limits.commands(device_uuids) if limits else []
    return ''.join(cmd + '\n' for cmd in cmds)


def write_replay(config: ConfigPaths, limits: t.Optional[Limits], device_uuids: t.Sequence[str], check_mode: bool) -> bool:
    """(Re)write the commands file for ``device_uuids``; remove it when there is nothing to replay."""
    text = replay_text(limits, device_uuids)
    if not text:
        if read_text(config.limits_file) is None:
            return False
        if not check_mode:
            remove(config.limits_file)
        return True
    if read_text(config.limits_file) == text:
        return False
    if not check_mode:
        atomic_write(config.limits_file, text, 0o644)
    return True


def persist(config: ConfigPaths, limits: Limits, check_mode: bool) -> bool:
    """Write the wanted limits (JSON); True when the file changed (or would)."""
    text = limits.to_json()
    if read_text(config.limits_json) == text:
        return False
    if not check_mode:
        atomic_write(config.limits_json, text, 0o644)
    return True


def read_replay(config: ConfigPaths) -> t.List[str]:
    """The commands file, validated again: a tampered file cannot inject other commands."""
    text = read_text(config.limits_file)
    if not text:
        return []
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        words = line.split()
        if words[0] not in REPLAYABLE:
            raise MpsError('%s line %d: %r is not a limit command; refusing to replay it' % (config.limits_file, number, line))
        commands.append(command(*words))
    return commands


def uuids_from_environ(pid: int) -> t.Optional[t.List[str]]:
    """``CUDA_VISIBLE_DEVICES`` of a running daemon not started by this collection (None when unreadable)."""
    try:
        with open('/proc/%d/environ' % pid, 'rb') as handle:
            entries = handle.read().split(b'\0')
    except OSError:
        return None
    for entry in entries:
        if entry.startswith(b'CUDA_VISIBLE_DEVICES='):
            return [item.strip() for item in entry.split(b'=', 1)[1].decode('utf-8', 'replace').split(',') if item.strip()]
    return None
