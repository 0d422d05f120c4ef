# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""state=absent: remove what this collection created for a resource, and name what it kept."""

from __future__ import annotations

import os
import typing as t

from .._io import remove, rmdir_if_empty
from .._observe.scan import scan_config, scan_resources
from .._outcome import Outcome
from .._resource.layout import SHM_DIR, config_paths
from .._resource.lock import RESOURCE_LOCK
from .._supervisor.liveness import LOCK_FILE, PIPE_DIR_FILES
from .._supervisor.process import LOG_FILES
from .._supervisor.unit import UNIT_NAME


class Absent:
    """Of :class:`DaemonManager`: the removals of state=absent."""

    # --- absent ----------------------------------------------------------------------------------
    def created_files(self) -> t.List[str]:
        """Every file this collection creates for the resource (logs aside), in removal order."""
        unit_d = os.path.dirname(self.dropin_path)
        return [
            self.config.env_file, self.config.limits_file, self.config.limits_json, self.config.limits_env,
            self.dropin_path, self.foreground_dropin_path, self.pidfile_dropin_path, self.order_dropin_path, os.path.join(unit_d),
            self.paths.started_file,
        ] + [os.path.join(self.paths.pipe_dir, name) for name in PIPE_DIR_FILES + (LOCK_FILE,)] + [
            self.paths.pipe_dir,
        ]

    def removal_paths(self) -> t.List[str]:
        """Every path a removal looks at (a run that removes the resource reads them first)."""
        return self.created_files() + [os.path.join(self.unit_dir, UNIT_NAME)]

    def _purge(self, out: Outcome) -> None:
        """After the stop: remove what this collection created for the resource, and nothing else.

        Files are removed by name; a directory only when it is empty afterwards, so anything another
        tool keeps there stays. The logs stay unless ``remove_logs``. The resource's lock file goes last
        (it is held until the module ends); the template unit goes with the last resource of its config
        directory.
        """
        view = self.view.paths
        if self.systemctl is not None and not self._disable_planned and self.view.unit(self.unit)[1]:
            # Enabled by an earlier run with supervisor=systemd: it would start again at boot.
            self._apply_enabled(False, out)
        logs = [os.path.join(self.paths.log_dir, name) for name in LOG_FILES] + [self.paths.log_dir] if self.remove_logs else []
        lock = os.path.join(self.paths.resource_dir, RESOURCE_LOCK)
        unit_path = os.path.join(self.unit_dir, UNIT_NAME)
        removed_unit_files = False
        for path in self.created_files() + logs:
            if self._remove(path, out) and path.startswith(self.unit_dir + os.sep):
                removed_unit_files = True
        if self._lock_existed:
            self._remove(lock, out)
        elif self.own_lock:
            out.step(lambda: remove(lock))  # this run's own lock, on a directory that was there: no change of the host
            self._would_remove.append(lock)
        parents = [self.paths.resource_dir]
        if os.path.dirname(self.paths.resource_dir) != self.paths.root:
            parents.append(os.path.dirname(self.paths.resource_dir))
        for directory in parents + [self.paths.root, self.config.config_dir]:
            self._remove(directory, out)
        self._name_foreign(out)
        if view.exists(unit_path) and not self.host.keep_template and not self._other_instances():
            removed_unit_files = self._remove(unit_path, out) or removed_unit_files
        if removed_unit_files and self.systemctl is not None:
            out.act('systemctl daemon-reload', self.systemctl.daemon_reload)

    def _name_foreign(self, out: Outcome) -> None:
        """Warn about what absent kept because this collection did not create it (never removed, never silent).

        Another resource's directory or files, the logs kept without ``remove_logs``, ``<root>/shm`` (mps_shm's)
        and ``<root>/.ready`` (the fleet role's) belong to the collection and are not named.
        """
        gone = set(self._would_remove)
        ours: t.Set[str] = set()
        # Every resource of the root, one whose logs alone are left (pruned, logs kept) included, at both levels
        # of a nested name (example.com/infer): its directory is this collection's, not a foreign file.
        view = self.view.paths
        for name in scan_resources(view, self.paths.root, with_logs=True):
            ours.add(os.path.join(self.paths.root, name.split('/')[0]))
            ours.add(os.path.join(self.paths.root, name))
            # another resource's own entries, a nested name's parent resource's included
            ours |= {os.path.join(self.paths.root, name, entry) for entry in ('pipe', 'log', '.started', RESOURCE_LOCK)}
        ours |= {os.path.join(self.paths.root, SHM_DIR), os.path.join(self.paths.root, '.ready'), self.paths.log_dir}
        ours |= {os.path.join(self.paths.resource_dir, name) for name in ('pipe', RESOURCE_LOCK)}
        for name in scan_config(view, self.config.config_dir):
            other = config_paths(self.config.config_dir, name)
            ours |= {other.env_file, other.limits_file, other.limits_json, other.limits_env}
        checked = [self.paths.pipe_dir, self.paths.resource_dir]
        if os.path.dirname(self.paths.resource_dir) != self.paths.root:
            checked.append(os.path.dirname(self.paths.resource_dir))
        checked += [self.paths.root, self.config.config_dir]
        if self.remove_logs:
            checked.append(self.paths.log_dir)
            ours.discard(self.paths.log_dir)
        for directory in checked:
            if directory in gone or not view.isdir(directory) or view.ismount(directory):
                continue
            try:
                entries = sorted(view.listdir(directory))
            except OSError:
                continue
            foreign = [name for name in entries
                       if os.path.join(directory, name) not in gone and os.path.join(directory, name) not in ours
                       and os.path.join(directory, name) not in checked]
            if foreign:
                out.warnings.append('state=absent kept %s: it holds what this collection did not create (%s%s)' % (
                    directory, ', '.join(foreign[:5]), ', ...' if len(foreign) > 5 else ''))

    def _other_instances(self) -> bool:
        """Another resource of this config directory still has an environment file: the template unit stays."""
        try:
            names = self.view.listdir(self.config.config_dir)
        except OSError:
            return False
        gone = set(self._would_remove)
        return any(name.endswith('.env') and os.path.join(self.config.config_dir, name) not in gone | {self.config.env_file}
                   for name in names)

    def _remove(self, path: str, out: Outcome) -> bool:
        """Plan the removal of a file, or of a directory that is empty once what is planned before is removed."""
        view = self.view.paths
        if path in self._would_remove or not view.lexists(path):
            return False
        if view.isdir(path) and not view.islink(path):
            gone = set(self._would_remove)
            if view.ismount(path) or any(os.path.join(path, name) not in gone for name in view.listdir(path)):
                return False  # a mount point is not the collection's to remove, nor a directory with others' files
            out.act('remove directory %s' % path, lambda: rmdir_if_empty(path))
        else:
            out.act('remove %s' % path, lambda: remove(path))
        self._would_remove.append(path)
        return True
