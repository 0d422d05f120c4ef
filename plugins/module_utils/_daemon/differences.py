# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a running daemon differs from the wanted one: observed here, decided by :mod:`.decide` (no I/O there)."""

from __future__ import annotations

import os
import typing as t

from .._limits.store import read_persisted
from .._resource.record import StartRecord
from .._supervisor.liveness import DaemonState
from .._supervisor.unit import parse_env
from .decide import DaemonSeen, WantedDaemon, daemon_differences, env_restart_keys
from .model import Wanted


class Differences:
    """Of :class:`DaemonManager`: why the running daemon must restart."""

    def _wanted_daemon(self, wanted: Wanted) -> WantedDaemon:
        return WantedDaemon(wanted.record(), self._env_values(wanted) if wanted.supervisor == 'systemd' else {},
                            self.paths.shm_dir, (getattr(wanted.devices[0], 'driver_version', None) or '') if wanted.devices else '',
                            wanted.static)

    def _static_wanted(self) -> bool:
        """Whether the daemon starts with -S: the limits it starts with (a host plan's, else the persisted) create SM partitions."""
        if self.host.limits_planned:
            return bool(self.host.limits is not None and self.host.limits.sm_partitions)
        limits = read_persisted(self.config, self.view.text)
        return bool(limits is not None and limits.sm_partitions)

    def _seen(self, wanted: WantedDaemon, current: DaemonState, record: t.Optional[StartRecord]) -> DaemonSeen:
        """Read what the decision needs, and only that: the environment file and the unit under systemd, /dev/shm of a
        running daemon, the unit's activity only when the record is missing and the environment file is as wanted."""
        view = self.view
        text = view.text(self.config.env_file, 'the environment file of %s' % self.paths.name)
        env = parse_env(text or '') if wanted.supervisor == 'systemd' else {}
        dev_shm = view.answered(view.dev_shm, current.pid, 'the /dev/shm of pid %s' % current.pid) if current.running and current.pid else None
        corrupt = view.resource(self.paths.name).corrupt
        seen = DaemonSeen(current, record, env, None, dev_shm, corrupt)
        if (current.running and record is None and wanted.supervisor == 'systemd' and self.systemctl is not None
                and not env_restart_keys(wanted, seen)):
            seen = DaemonSeen(current, record, env, view.unit(self.unit)[0], dev_shm, corrupt)
        return seen

    def _differences(self, wanted: Wanted, current: DaemonState, record: t.Optional[StartRecord]) -> t.List[str]:
        if not current.running:
            return []
        want = self._wanted_daemon(wanted)
        return daemon_differences(want, self._seen(want, current, record), os.path.basename(self.paths.started_file),
                                  self.config.env_file)
