# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a running daemon differs from the wanted one: what makes a restart."""

from __future__ import annotations

import os
import typing as t

from .._io import read_text
from .._proc import daemon_dev_shm
from .._resource.record import StartRecord
from .._supervisor.liveness import DaemonState
from .._supervisor.unit import RESTART_ENV, parse_env
from .model import Wanted


class Differences:
    """Of :class:`ResourceManager`: why the running daemon must restart."""

    def _env_restart_keys(self, wanted: Wanted) -> t.List[str]:
        """The values the running daemon was started with that the environment file has otherwise than wanted.

        Only these force a restart; the others (compute mode, timeouts, log mode, paths of helpers) are
        rewritten in place and used from the next start.
        """
        current_env = parse_env(read_text(self.config.env_file) or '')
        wanted_env = self._env_values(wanted)
        return [key for key in RESTART_ENV if current_env.get(key) != wanted_env.get(key)]

    def _systemd_runs_as_wanted(self, wanted: Wanted) -> bool:
        """The unit is active and was started with what is wanted now (the record was lost: /run at boot)."""
        if wanted.supervisor != 'systemd' or self.systemctl is None:
            return False
        return not self._env_restart_keys(wanted) and self.systemctl.is_active(self.unit)

    def _shm_difference(self, wanted: Wanted, current: DaemonState) -> t.List[str]:
        """What the daemon's own mount namespace says of its /dev/shm, against what is wanted."""
        if not current.pid:
            return []
        seen = daemon_dev_shm(current.pid, self.paths.shm_dir)
        if wanted.shm and seen != self.paths.shm_dir:
            return ['the daemon does not see the current %s as its /dev/shm (mounted anew since it started?)' % self.paths.shm_dir]
        if not wanted.shm and seen == self.paths.shm_dir:
            return ['shm: the daemon uses %s as its /dev/shm' % self.paths.shm_dir]
        return []

    def _differences(self, wanted: Wanted, current: DaemonState, record: t.Optional[StartRecord]) -> t.List[str]:
        if not current.running:
            return []
        if record is None:
            if self._systemd_runs_as_wanted(wanted):
                return self._shm_difference(wanted, current)
            return ['no %s record for the running daemon' % os.path.basename(self.paths.started_file)]
        found = []
        want = wanted.record()
        have = record.daemon_view()
        for key in ('devices', 'multiuser', 'supervisor'):
            if have[key] != want[key]:
                found.append('%s: %s -> %s' % (key, have[key], want[key]))
        if record.shm != wanted.shm:
            found.append('shm: %s -> %s' % (record.shm, wanted.shm))
        else:
            found += self._shm_difference(wanted, current)
        if wanted.supervisor == 'none' and record.pid not in (None, current.pid):
            found.append('pid: the record names pid %s but pid %s runs' % (record.pid, current.pid))
        if wanted.supervisor == 'systemd':
            changed = self._env_restart_keys(wanted)
            if changed:
                found.append('environment file %s differs in %s' % (self.config.env_file, ', '.join(changed)))
        return found
