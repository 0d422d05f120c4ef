# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""state=absent: remove what this collection created for a resource, and name what it kept."""

from __future__ import annotations

import os
import typing as t

from .._bytecode import CACHE_DIR as BYTECODE_DIR
from .._io import remove, rmdir_if_empty
from .._observe.scan import scan_config, scan_resources
from .._outcome import Outcome
from .._resource.layout import SHM_DIR, config_paths
from .._resource.lock import RESOURCE_LOCK
from .._supervisor.liveness import LOCK_FILE, PIPE_DIR_FILES
from .._supervisor.process import LOG_FILES
from .model import DaemonRun
from .systemd import UnitFiles


class Absent:
    """The removals of state=absent: what this collection created for a resource, and nothing else."""

    def __init__(self, run: DaemonRun, unit: UnitFiles) -> None:
        self.run = run
        self.unit = unit

    def created_files(self) -> t.List[str]:
        """Every file this collection creates for the resource (logs aside), in removal order."""
        run = self.run
        unit = self.unit
        return [
            run.config.env_file, run.config.limits_file, run.config.limits_json, run.config.limits_env, run.config.v3_config,
            unit.dropin_path, unit.foreground_dropin_path, unit.pidfile_dropin_path, unit.order_dropin_path, unit.v3_dropin_path,
            os.path.dirname(unit.dropin_path), run.paths.started_file,
        ] + [os.path.join(run.paths.pipe_dir, name) for name in PIPE_DIR_FILES + (LOCK_FILE,)] + [
            run.paths.pipe_dir,
        ]

    def removal_paths(self) -> t.List[str]:
        """Every path a removal looks at (a run that removes the resource reads them first)."""
        return self.created_files() + [self.unit.template_path]

    def purge(self, out: Outcome) -> None:
        """After the stop: remove what this collection created for the resource, and nothing else.

        Files are removed by name; a directory only when it is empty afterwards, so anything another
        tool keeps there stays. The logs stay unless ``remove_logs``. The resource's lock file goes last
        (it is held until the module ends); the template unit goes with the last resource of its config
        directory.
        """
        run = self.run
        paths = run.paths
        planned = run.planned
        if run.systemctl is not None and not planned.disable and run.view.unit(run.unit)[1]:
            # Enabled by an earlier run with supervisor=systemd: it would start again at boot.
            self.unit.apply_enabled(out, enabled=False)
        logs = [os.path.join(paths.log_dir, name) for name in LOG_FILES] + [paths.log_dir] if planned.remove_logs else []
        lock = os.path.join(paths.resource_dir, RESOURCE_LOCK)
        unit_path = self.unit.template_path
        removed_unit_files = False
        for path in self.created_files() + logs:
            if self.plan_removal(path, out) and path.startswith(run.unit_dir + os.sep):
                removed_unit_files = True
        if planned.lock_existed:
            self.plan_removal(lock, out)
        elif run.own_lock:
            out.step(lambda: remove(lock))  # this run's own lock, on a directory that was there: no change of the host
            planned.would_remove.append(lock)
        parents = [paths.resource_dir]
        if os.path.dirname(paths.resource_dir) != paths.root:
            parents.append(os.path.dirname(paths.resource_dir))
        for directory in parents + [paths.root, run.config.config_dir]:
            self.plan_removal(directory, out)
        self._name_foreign(out)
        if run.view.paths.exists(unit_path) and not run.host.keep_template and not self._other_instances():
            removed_unit_files = self.plan_removal(unit_path, out) or removed_unit_files
        if removed_unit_files and run.systemctl is not None:
            out.act('systemctl daemon-reload', run.systemctl.daemon_reload)

    def _name_foreign(self, out: Outcome) -> None:
        """Warn about what absent kept because this collection did not create it (never removed, never silent).

        Another resource's directory or files, the logs kept without ``remove_logs``, ``<root>/shm`` (mps_shm's),
        ``<root>/.ready`` (the fleet role's) and ``<root>/.bytecode`` (mps_host's cache) belong to the collection and are
        not named.
        """
        run = self.run
        paths = run.paths
        config = run.config
        gone = set(run.planned.would_remove)
        ours: t.Set[str] = set()
        # Every resource of the root, one whose logs alone are left (pruned, logs kept) included, at both levels
        # of a nested name (example.com/infer): its directory is this collection's, not a foreign file.
        view = run.view.paths
        for name in scan_resources(view, paths.root, with_logs=True):
            ours.add(os.path.join(paths.root, name.split('/')[0]))
            ours.add(os.path.join(paths.root, name))
            # another resource's own entries, a nested name's parent resource's included
            ours |= {os.path.join(paths.root, name, entry) for entry in ('pipe', 'log', '.started', RESOURCE_LOCK)}
        ours |= {os.path.join(paths.root, SHM_DIR), os.path.join(paths.root, '.ready'), os.path.join(paths.root, BYTECODE_DIR),
                 paths.log_dir}
        ours |= {os.path.join(paths.resource_dir, name) for name in ('pipe', RESOURCE_LOCK)}
        for name in scan_config(view, config.config_dir):
            other = config_paths(config.config_dir, name)
            ours |= {other.env_file, other.limits_file, other.limits_json, other.limits_env, other.v3_config}
        checked = [paths.pipe_dir, paths.resource_dir]
        if os.path.dirname(paths.resource_dir) != paths.root:
            checked.append(os.path.dirname(paths.resource_dir))
        checked += [paths.root, config.config_dir]
        if run.planned.remove_logs:
            checked.append(paths.log_dir)
            ours.discard(paths.log_dir)
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
        run = self.run
        config = run.config
        try:
            names = run.view.listdir(config.config_dir)
        except OSError:
            return False
        gone = set(run.planned.would_remove)
        return any(name.endswith('.env') and os.path.join(config.config_dir, name) not in gone | {config.env_file}
                   for name in names)

    def plan_removal(self, path: str, out: Outcome) -> bool:
        """Plan the removal of a file, or of a directory that is empty once what is planned before is removed."""
        would_remove = self.run.planned.would_remove
        view = self.run.view.paths
        if path in would_remove or not view.lexists(path):
            return False
        if view.isdir(path) and not view.islink(path):
            gone = set(would_remove)
            if view.ismount(path) or any(os.path.join(path, name) not in gone for name in view.listdir(path)):
                return False  # a mount point is not the collection's to remove, nor a directory with others' files
            out.act('remove directory %s' % path, lambda: rmdir_if_empty(path))
        else:
            out.act('remove %s' % path, lambda: remove(path))
        would_remove.append(path)
        return True
