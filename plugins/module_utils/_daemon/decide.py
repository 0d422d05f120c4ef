# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a resource's running daemon is the wanted one, decided from what was observed. No I/O.

:class:`DaemonSeen` is what a run read of the daemon - its state, its start record, its environment file, whether
systemd runs its unit, which ``/dev/shm`` it sees - and :func:`daemon_differences` is a pure function of it and of the
wanted daemon: the reasons for a restart, empty when the running daemon is the wanted one. :func:`decide_run` turns
them into the one thing a started resource's run does. Tested as tables in
``tests/unit/plugins/module_utils/test_daemon_decide.py``.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._gpus import Gpu
from .._resource.record import StartRecord
from .._supervisor.liveness import Liveness
from .._supervisor.unit import RESTART_ENV


@dataclass(frozen=True)
class DaemonSeen:
    """What one run observed of a resource's daemon."""

    liveness: Liveness
    record: t.Optional[StartRecord] = None
    # The environment file as it is (systemd), parsed; the unit's activity, asked only when the record is missing.
    env: t.Mapping[str, str] = field(default_factory=dict)
    unit_active: t.Optional[bool] = None
    # Which /dev/shm the daemon's own mount namespace shows: the resource's tmpfs, the host's, or None (unknown).
    dev_shm: t.Optional[str] = None
    # Why the start record that is there is none (not JSON, not a mapping); '' when it is one, or there is none.
    corrupt: str = ''


@dataclass(frozen=True)
class WantedDaemon:
    """The wanted daemon as the restart decision compares it."""

    record: t.Mapping[str, t.Any]  # devices (UUIDs, in order), multiuser, supervisor, shm
    env: t.Mapping[str, str] = field(default_factory=dict)  # what the environment file would start it with
    shm_dir: str = ''
    # The driver version NVML reports now ('' unknown): a daemon started under another one restarts.
    driver_version: str = ''
    # Static SM partitioning (-S) wanted: the mode is fixed when a daemon starts, so a change is a restart.
    static: bool = False

    @property
    def shm(self) -> bool:
        return bool(self.record.get('shm'))

    @property
    def supervisor(self) -> str:
        return str(self.record.get('supervisor'))


def env_restart_keys(wanted: WantedDaemon, seen: DaemonSeen) -> t.List[str]:
    """The values the daemon is started with that the environment file has otherwise than wanted (only these restart it)."""
    return [key for key in RESTART_ENV if seen.env.get(key) != wanted.env.get(key)]


def _shm_difference(wanted: WantedDaemon, seen: DaemonSeen) -> t.List[str]:
    if not seen.liveness.pid:
        return []
    if wanted.shm and seen.dev_shm != wanted.shm_dir:
        return ['the daemon does not see the current %s as its /dev/shm (mounted anew since it started?)' % wanted.shm_dir]
    if not wanted.shm and seen.dev_shm == wanted.shm_dir:
        return ['shm: the daemon uses %s as its /dev/shm' % wanted.shm_dir]
    return []


def daemon_differences(wanted: WantedDaemon, seen: DaemonSeen, started_file: str = '.started',
                       env_file: str = 'the environment file') -> t.List[str]:
    """Why the running daemon is not the wanted one (each reason a restart's); empty when it is, or when none runs."""
    current, record = seen.liveness, seen.record
    if not current.running:
        return []
    if record is None:
        # The record lives in /run: lost at boot while systemd brought the daemon back from the file this module wrote.
        if wanted.supervisor == 'systemd' and seen.unit_active and not env_restart_keys(wanted, seen):
            return _shm_difference(wanted, seen)
        if seen.corrupt:
            return ['its %s record is corrupt (%s): what the running daemon was started with is unknown' % (started_file, seen.corrupt)]
        return ['no %s record for the running daemon' % started_file]
    found = []
    have = record.daemon_view()
    for key in ('devices', 'multiuser', 'supervisor'):
        if have[key] != wanted.record[key]:
            found.append('%s: %s -> %s' % (key, have[key], wanted.record[key]))
    # MPS v3: the protocol, the server's name and owner are fixed at start (legacy records have none of them).
    for key, legacy in (('protocol', 'legacy'), ('server', None), ('uid', None)):
        if have.get(key) != wanted.record.get(key):
            found.append('%s: %s -> %s' % (key, have.get(key, legacy), wanted.record.get(key, legacy)))
    if record.shm != wanted.shm:
        found.append('shm: %s -> %s' % (record.shm, wanted.shm))
    else:
        found += _shm_difference(wanted, seen)
    if record.driver_version and wanted.driver_version and record.driver_version != wanted.driver_version:
        found.append('driver: the daemon was started under driver %s and NVML now reports %s (its servers would run the '
                     'old driver\'s user-space libraries against the new kernel module)' % (record.driver_version, wanted.driver_version))
    if record.static_partitioning != wanted.static:
        found.append('static SM partitioning (-S): %s -> %s (%s)' % (
            'on' if record.static_partitioning else 'off', 'on' if wanted.static else 'off',
            'its limits create SM partitions' if wanted.static else 'its limits create no SM partitions'))
    if wanted.supervisor == 'none' and record.pid not in (None, current.pid):
        found.append('pid: the record names pid %s but pid %s runs' % (record.pid, current.pid))
    if wanted.supervisor == 'systemd':
        changed = env_restart_keys(wanted, seen)
        if changed:
            found.append('environment file %s differs in %s' % (env_file, ', '.join(changed)))
    return found


def decide_run(state: str, current: Liveness, differences: t.Sequence[str], restart_reason: str = '') -> t.Tuple[str, str]:
    """What a run that wants the daemon up does: (``keep`` | ``restart`` | ``recover`` | ``start``, why)."""
    if current.running and state == 'started' and not differences:
        return 'keep', ''
    if current.running:
        return 'restart', '; '.join(differences) if differences else (restart_reason or 'state=restarted')
    if current.stale:
        return 'recover', 'it had died and left files behind (%s)' % ', '.join(current.leftovers)
    return 'start', 'not running'


def compute_mode_changes(devices: t.Sequence[Gpu], mode: str) -> t.List[Gpu]:
    """The GPUs of ``devices`` whose compute mode must become ``mode`` (``unchanged``: none).

    NVML has no compute mode for a MIG device, nor for a GPU in MIG mode (one whose MIG mode was enabled under a running
    daemon: it is given back as it is); a GPU already in ``mode`` is no change.
    """
    if mode == 'unchanged':
        return []
    return [gpu for gpu in devices if not (gpu.is_mig or gpu.mig_enabled) and gpu.compute_mode != mode]


def releasable(gpus: t.Sequence[Gpu], dropped: t.Collection[str], still_used: t.Collection[str], keep: t.Collection[str],
               claims: t.Mapping[str, t.Any]) -> t.Tuple[t.List[Gpu], t.List[str]]:
    """Of the ``dropped`` GPUs, those whose compute mode may go back to DEFAULT, and what is said of the others.

    Not one that another resource of the root still uses (``still_used``), that the same host plan keeps in MPS use
    (``keep``: a GPU moving to another resource), or that an MPS control daemon of another root or tool serves
    (``claims``: UUID -> that daemon, named in a warning when the GPU is not in DEFAULT).
    """
    given, warnings = [], []
    for gpu in gpus:
        if gpu.uuid not in dropped or gpu.uuid in still_used or gpu.uuid in keep:
            continue
        if gpu.uuid in claims:
            if gpu.compute_mode != 'default':
                warnings.append('GPU %d (%s) keeps compute mode %s: another MPS control daemon serves it, %s' % (
                    gpu.index, gpu.uuid, gpu.compute_mode.upper(), claims[gpu.uuid].describe()))
            continue
        given.append(gpu)
    return given, warnings
