# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a running daemon differs from the wanted one: observed here, decided by :mod:`.decide` (no I/O there)."""

from __future__ import annotations

import os
import typing as t

from .._limits.store import read_persisted
from .._resource.record import StartRecord
from .._supervisor.liveness import Liveness
from .._supervisor.unit import parse_env
from .decide import DaemonSeen, WantedDaemon, daemon_differences, env_restart_keys
from .model import DaemonRun, Wanted
from .systemd import UnitFiles


def static_wanted(run: DaemonRun) -> bool:
    """Whether the daemon starts with -S: the limits it starts with (a host plan's, else the persisted) create SM partitions."""
    if run.host.limits_planned:
        return bool(run.host.limits is not None and run.host.limits.sm_partitions)
    limits = read_persisted(run.config, run.view.text)
    return bool(limits is not None and limits.sm_partitions)


def _wanted_daemon(run: DaemonRun, unit: UnitFiles, wanted: Wanted) -> WantedDaemon:
    return WantedDaemon(wanted.record(), unit.env_values(wanted) if wanted.supervisor == 'systemd' else {},
                        run.paths.shm_dir, (getattr(wanted.devices[0], 'driver_version', None) or '') if wanted.devices else '',
                        wanted.static)


def _seen(run: DaemonRun, wanted: WantedDaemon, current: Liveness, record: t.Optional[StartRecord]) -> DaemonSeen:
    """What the decision needs, and only that: the environment file and the unit under systemd, /dev/shm of a running
    daemon, the unit's activity only when the record is missing and the environment file is as wanted."""
    view = run.view
    text = view.text(run.config.env_file, 'the environment file of %s' % run.paths.name)
    env = parse_env(text or '') if wanted.supervisor == 'systemd' else {}
    dev_shm = view.answered(view.dev_shm, current.pid, 'the /dev/shm of pid %s' % current.pid) if current.running and current.pid else None
    corrupt = view.resource(run.paths.name).corrupt
    seen = DaemonSeen(current, record, env, None, dev_shm, corrupt)
    if (current.running and record is None and wanted.supervisor == 'systemd' and run.systemctl is not None
            and not env_restart_keys(wanted, seen)):
        seen = DaemonSeen(current, record, env, view.unit(run.unit)[0], dev_shm, corrupt)
    return seen


def differences(run: DaemonRun, unit: UnitFiles, wanted: Wanted, current: Liveness,
                record: t.Optional[StartRecord]) -> t.List[str]:
    """Why the running daemon differs from the wanted one (nothing for a daemon that does not run)."""
    if not current.running:
        return []
    want = _wanted_daemon(run, unit, wanted)
    return daemon_differences(want, _seen(run, want, current, record), os.path.basename(run.paths.started_file),
                              run.config.env_file)
