# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The start and the stop of a resource's daemon, planned into the outcome and run by its apply()."""

from __future__ import annotations

import datetime
import os
import typing as t

from .._gpus import all_devices
from .._io import ensure_dir, remove, restorer, untraversable
from .._errors import InvalidParameterError
from .._limits.store import persist, read_persisted, read_replay, write_replay
from .._protocol.commands import SET_DEFAULT_PRIORITY, SM_PARTITION
from .._outcome import Outcome
from .._resource.record import StartRecord, write_record
from .._resource.store import wants_static
from .._selinux import plan_type
from .._supervisor.liveness import PIPE_DIR_FILES, DaemonState
from .model import DaemonOutcome, Wanted


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds').replace('+00:00', 'Z')


class DaemonActions:
    """Of :class:`DaemonManager`: the actions that start and stop the daemon."""

    # --- actions: planned into the outcome, run by its apply() ------------------------------------
    def _prepare_dirs(self, out: Outcome) -> None:
        out.step(lambda: (ensure_dir(self.paths.pipe_dir, 0o755), ensure_dir(self.paths.log_dir, self.daemon.log_mode)))
        self._label(out)
        blocked = untraversable(self.view.paths, self.paths.pipe_dir)
        if blocked:
            out.warnings.append('%s cannot be traversed by other users: MPS clients that do not run as root will fail to '
                                'connect (chmod o+x, or run clients as root)' % ', '.join(blocked))

    def _label(self, out: Outcome) -> None:
        """Give the pipe directory its SELinux type (planned once: after the directory exists, or now to repair it)."""
        if self._label_planned:
            return
        self._label_planned = True
        current = plan_type(self.paths.pipe_dir, self.selinux_type, out, self.view)
        if self.selinux_type and self.view.selinux and isinstance(out, DaemonOutcome):
            out.selinux = {'before': current, 'after': self.selinux_type}

    def _repair_log_mode(self, out: Outcome) -> None:
        """Give an existing log directory the wanted mode (no restart: the daemon keeps its open files)."""
        current = self.view.mode(self.paths.log_dir)
        if current is None:
            return
        wanted = self.daemon.log_mode
        if current != wanted:
            out.act('chmod %s %s (was %s)' % (format(wanted, '04o'), self.paths.log_dir, format(current, '04o')),
                    lambda: os.chmod(self.paths.log_dir, wanted))

    def _write_record(self, wanted: Wanted, pid: t.Optional[int], out: Outcome) -> None:
        """Record what the daemon (pid) was started with; called when that is known (planning or applying)."""
        record = StartRecord(devices=[gpu.uuid for gpu in wanted.devices], multiuser=wanted.multiuser, supervisor=wanted.supervisor,
                             shm=wanted.shm, pid=pid, started_at=_now(), compute_mode=wanted.compute_mode,
                             control_binary=self.daemon.binary,
                             driver_version=getattr(wanted.devices[0], 'driver_version', None) if wanted.devices else None,
                             static_partitioning=wanted.static)
        write_record(self.paths, record)
        out.started_at = record.started_at
        out.pid = pid

    def _start(self, wanted: Wanted, out: Outcome, restart: bool) -> None:
        self._refuse_foreign(wanted.devices, out)
        self._set_compute_modes(wanted.devices, wanted.compute_mode, out)
        self._prepare_dirs(out)
        replay = self._replay_for(wanted, out)
        if self.supervisor == 'systemd':
            self._install_unit(wanted, out)
            out.act('%s %s' % ('restart' if restart else 'start', self.unit), lambda: self._start_unit(wanted, out, restart))
        else:
            out.act('start the MPS control daemon', lambda: self._write_record(
                wanted, self.daemon.start([gpu.uuid for gpu in wanted.devices], wanted.multiuser, replay), out))

    def _replay_for(self, wanted: Wanted, out: Outcome) -> t.List[str]:
        """The persisted limits as commands for this daemon's device order (commands file rewritten to match)."""
        uuids = [gpu.uuid for gpu in wanted.devices]
        if self.host.limits_planned:
            # mps_host: its plan persists these limits (and, for a known device order, their commands file) first.
            planned = self.host.limits
            if planned is None or planned.empty:
                return []
            view = self.view  # the files as the run read them
            if self.host.limits_replay_for != uuids and write_replay(self.config, planned, uuids, check_mode=True, reader=view.text):
                change = out.act('write %s for the new device order' % self.config.limits_file, lambda: (
                    ensure_dir(self.config.config_dir, 0o755), write_replay(self.config, planned, uuids, check_mode=False)))
                change.undo = restorer(self.config.limits_file, (view.text(self.config.limits_file), view.mode(self.config.limits_file)))
            return planned.commands(uuids)
        view = self.view
        limits = read_persisted(self.config, view.text)
        if limits is None:
            return self._offered(read_replay(self.config, view.text))
        added = limits.add_replica_shares(wanted.devices, all_devices(view.gpus))
        if added:
            out.warnings.append('the persisted limits of %s had no pinned memory limit for %s: %s from replicas=%d' % (
                self.paths.name, ', '.join(gpu.label for gpu in added), ', '.join(
                    '%dM' % limits.pinned_device_mem_limit[gpu.uuid] for gpu in added), limits.replicas))
        # the record holds only its own GPUs: shares persisted before they were known go with the start that knows them
        dropped = limits.own_shares(wanted.devices, all_devices(view.gpus))
        if added or dropped:
            change = out.act('write %s' % self.config.limits_json, lambda: (
                ensure_dir(self.config.config_dir, 0o755), persist(self.config, limits, check_mode=False)))
            change.undo = restorer(self.config.limits_json, (view.text(self.config.limits_json), view.mode(self.config.limits_json)))
        if write_replay(self.config, limits, uuids, check_mode=True, reader=view.text):
            change = out.act('write %s for the new device order' % self.config.limits_file, lambda: (
                ensure_dir(self.config.config_dir, 0o755), write_replay(self.config, limits, uuids, check_mode=False)))
            change.undo = restorer(self.config.limits_file, (view.text(self.config.limits_file), view.mode(self.config.limits_file)))
        return self._offered(limits.commands(uuids))

    def _offered(self, commands: t.List[str]) -> t.List[str]:
        """The replay, refused before the daemon is stopped or started where the binary lacks one of its commands.

        Only client priority is missing from some binaries; its help text is read (once) only when the replay has it.
        """
        if any(cmd.split()[0] == SET_DEFAULT_PRIORITY for cmd in commands) and self.offered(SET_DEFAULT_PRIORITY) is False:
            raise InvalidParameterError('client_priority', 'the persisted limits of %s (%s) set a client priority, and the help '
                                        'text of %s lists no %s: this binary has no client priority. Nothing was started or '
                                        'stopped; unset it with gpufleet.mps.mps_limits (client_priority: normal) under a '
                                        'binary that has it, or remove it from the resource' % (
                                            self.paths.name, self.config.limits_json, self.daemon.binary, SET_DEFAULT_PRIORITY))
        if wants_static(commands) and self.offered(SM_PARTITION) is False:
            raise InvalidParameterError('sm_partitions', 'the persisted limits of %s (%s) create static SM partitions, and the '
                                        'help text of %s lists no %s: this binary has no static partitioning (that needs '
                                        'the control binary of CUDA 13.1, 13010, or later). Nothing was started or stopped; '
                                        'remove them with gpufleet.mps.mps_limits (sm_partitions: []) or from the resource' % (
                                            self.paths.name, self.config.limits_json, self.daemon.binary, SM_PARTITION))
        return commands

    def _stop_process(self, state: DaemonState, record: t.Optional[StartRecord], out: Outcome) -> None:
        """Stop the running daemon through whoever supervises it."""
        by_systemd = record is not None and record.supervisor == 'systemd' and self.systemctl is not None
        self._unit_stop_planned = self._unit_stop_planned or by_systemd

        def stop() -> None:
            if by_systemd:
                self.systemctl.stop(self.unit)  # type: ignore[union-attr]
            else:
                out.forced = self.daemon.stop(state.pid)
            # Whether a clean quit removes the pipe-dir files is undocumented; remove what is left so a
            # stopped daemon never looks like a crashed one.
            self.daemon.clean_stale()

        out.act('stop the MPS control daemon (pid %s)' % state.pid, stop, ends_clients=self._ends_clients)
        # What the stop removes, later steps (state=absent) must not list a second time.
        self._would_remove += [os.path.join(self.paths.pipe_dir, name) for name in PIPE_DIR_FILES]

    def _stop(self, state: DaemonState, record: t.Optional[StartRecord], out: Outcome) -> None:
        """Stop a running daemon, reset the compute mode of GPUs nobody else uses, drop the record."""
        self._stop_process(state, record, out)
        self._release(record, out)

    def _release(self, record: t.Optional[StartRecord], out: Outcome) -> None:
        if self.reset_on_stop and record and record.compute_mode != 'unchanged':
            self._set_compute_modes(self._releasable(set(record.devices), out), 'default', out)
        if self.view.paths.lexists(self.paths.started_file) and self.paths.started_file not in self._would_remove:
            out.act('remove %s' % self.paths.started_file, lambda: remove(self.paths.started_file))
            self._would_remove.append(self.paths.started_file)

    def _clean_stale(self, out: Outcome) -> None:
        out.act('remove stale files of a dead daemon', self.daemon.clean_stale)
        self._would_remove += [os.path.join(self.paths.pipe_dir, name) for name in PIPE_DIR_FILES]
