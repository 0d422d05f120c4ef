# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The persisted limits of a resource: one writer for both of its files in the config directory.

``<instance>.limits.json``
    The truth: what was asked for, device memory keyed by GPU UUID (or ``*`` for every GPU of the
    daemon), so it stays right whatever order the daemon's devices have.
``<instance>.limits``
    The same as control commands for the daemon's current device order, one per line, fed to the
    control UI by the systemd unit after every start. Derived; rewritten whenever either changes.
``<instance>.limits-env``
    The default thread percentage as the daemon's start environment (an EnvironmentFile of the unit;
    the direct start sets the same): NVIDIA documents ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the
    control daemon's environment as the default of every server it spawns, so it is in force from the
    first client, before the replay. The pinned memory limit has no such documented form for the
    daemon (only "in passing"): it comes from the replay alone, right after the daemon answers.
    Derived with the commands file; absent when there is no percentage.
"""

from __future__ import annotations

import typing as t

from .._errors import MpsError
from .._io import atomic_write, parse_json, read_text, remove
from .._protocol.commands import PRIORITY_NAMES, REPLAYABLE, command
from .._resource.layout import ConfigPaths
from .._resource.store import STATIC_ARGS_ENV, STATIC_OPTION, start_environment
from .model import Limits


def start_env_text(commands: t.Sequence[str], *, static: bool = False) -> str:
    """The start environment file of a daemon that replays ``commands`` (``static``: started with -S whatever they hold)."""
    env = start_environment(commands)
    if static:
        env[STATIC_ARGS_ENV] = STATIC_OPTION
    if not env:
        return ''
    return ('# Managed by gpufleet.mps (mps_limits): the defaults the MPS control daemon starts with.\n'
            + ''.join('%s=%s\n' % item for item in sorted(env.items())))


def persisted_facts(limits: t.Optional[Limits]) -> t.Optional[t.Dict[str, t.Any]]:
    """The persisted limits as mps_info and mps_host report them (memory in MiB by GPU UUID, ``*`` for every GPU)."""
    if limits is None:
        return None
    return {
        'active_thread_percentage': limits.active_thread_percentage,
        'pinned_device_mem_limit_mib': dict(sorted(limits.pinned_device_mem_limit.items())),
        'replicas': limits.replicas,
        'client_priority': PRIORITY_NAMES.get(limits.client_priority) if limits.client_priority is not None else None,
        'sm_partitions': list(limits.sm_partitions),
    }


Reader = t.Callable[[str], t.Optional[str]]


def read_persisted(config: ConfigPaths, reader: t.Optional[Reader] = None) -> t.Optional[Limits]:
    """The persisted wanted limits, or None when there are none (or the file is unreadable).

    ``reader``: where a plan reads files from (a run's view of the host, _observe.view.HostView.text); None: the disk.
    """
    return Limits.from_data(parse_json((reader or read_text)(config.limits_json)))


def rendered(config: ConfigPaths, limits: t.Optional[Limits], device_uuids: t.Optional[t.Sequence[str]]) -> t.List[t.Tuple[str, str]]:
    """The files rendered from a resource's record, (path, text; '' for a file that must not exist): the commands file for
    ``device_uuids``, the daemon's device order, and the start environment. Where the order is not known (None) the
    commands file cannot be rendered, so none is left to go stale (the next start renders it for its own order); the
    start environment needs no order."""
    if device_uuids is None:
        cmds = limits.commands([]) if limits else []
        return [(config.limits_file, ''), (config.limits_env, start_env_text(cmds, static=bool(limits and limits.sm_partitions)))]
    cmds = limits.commands(device_uuids) if limits else []
    return [(config.limits_file, ''.join(cmd + '\n' for cmd in cmds)), (config.limits_env, start_env_text(cmds))]


def write_replay(config: ConfigPaths, limits: t.Optional[Limits], device_uuids: t.Optional[t.Sequence[str]], *, check_mode: bool,
                 reader: t.Optional[Reader] = None) -> bool:
    """(Re)write the files :func:`rendered` from the record, each removed when empty; True when one changed (or would)."""
    changed = False
    for path, text in rendered(config, limits, device_uuids):
        changed = _write_or_remove(path, text, check_mode=check_mode, reader=reader) or changed
    return changed


def _write_or_remove(path: str, text: str, *, check_mode: bool, reader: t.Optional[Reader] = None) -> bool:
    current = (reader or read_text)(path)
    if not text:
        if current is None:
            return False
        if not check_mode:
            remove(path)
        return True
    if current == text:
        return False
    if not check_mode:
        atomic_write(path, text, 0o644)
    return True


def persist(config: ConfigPaths, limits: Limits, *, check_mode: bool, reader: t.Optional[Reader] = None) -> bool:
    """Write the wanted limits (JSON); True when the file changed (or would)."""
    text = limits.to_json()
    if (reader or read_text)(config.limits_json) == text:
        return False
    if not check_mode:
        atomic_write(config.limits_json, text, 0o644)
    return True


def read_replay(config: ConfigPaths, reader: t.Optional[Reader] = None) -> t.List[str]:
    """The commands file, validated again: a tampered file cannot inject other commands."""
    text = (reader or read_text)(config.limits_file)
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
