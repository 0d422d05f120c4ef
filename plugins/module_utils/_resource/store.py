# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The persisted limits of a resource: one writer for both of its files in the config directory.

``<instance>.limits.json``
    The truth: what was asked for, device memory keyed by GPU UUID (or ``*`` for every GPU of the
    daemon), so it stays right whatever order the daemon's devices have.
``<instance>.limits``
    The same as control commands for the daemon's current device order, one per line, fed to the
    control UI by the systemd unit after every start. Derived; rewritten whenever either changes.
"""

from __future__ import annotations

import typing as t

from .._errors import MpsError
from .._io import atomic_write, read_json, read_text, remove
from .._limits.model import Limits
from .._protocol.commands import command
from .layout import ConfigPaths


REPLAYABLE = ('set_default_active_thread_percentage', 'set_default_device_pinned_mem_limit')


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
