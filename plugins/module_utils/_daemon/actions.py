# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The start and the stop of a resource's daemon, planned into the outcome and run by its apply()."""

from __future__ import annotations

import os
import shutil
import typing as t

from .._gpus import all_devices
from .._io import ensure_dir, remove, restorer, untraversable
from .._errors import InvalidParameterError
from .._limits.store import persist, read_persisted, read_replay, write_replay
from .._observe.reader import env_server
from .._protocol.commands import SET_DEFAULT_PRIORITY, SM_PARTITION
from .._outcome import Outcome
from .._resource.record import StartRecord
from .._resource.store import wants_static
from .._selinux import plan_type
from .._supervisor.liveness import PIPE_DIR_FILES, Liveness
from .devices import DeviceChoice
from .model import DaemonOutcome, DaemonRun, Wanted, record_start
from .systemd import UnitFiles


class DaemonActions:
    """The start and the stop of a resource's daemon, planned into the outcome and run by its apply()."""

    def __init__(self, run: DaemonRun, devices: DeviceChoice, unit: UnitFiles) -> None:
        self.run = run
        self.devices = devices
        self.unit = unit

    def prepare_dirs(self, out: Outcome) -> None:
        paths = self.run.paths
        log_mode = self.run.daemon.log_mode
        out.step(lambda: (ensure_dir(paths.pipe_dir, 0o755), ensure_dir(paths.log_dir, log_mode)))
        self.label(out)
        blocked = untraversable(self.run.view.paths, paths.pipe_dir)
        if blocked:
            out.warnings.append('%s cannot be traversed by other users: MPS clients that do not run as root will fail to '
                                'connect (chmod o+x, or run clients as root)' % ', '.join(blocked))

    def label(self, out: Outcome) -> None:
        """Give the pipe directory its SELinux type (planned once: after the directory exists, or now to repair it)."""
        run = self.run
        if run.planned.label:
            return
        run.planned.label = True
        current = plan_type(run.paths.pipe_dir, run.selinux_type, out, run.view)
        if run.selinux_type and run.view.selinux and isinstance(out, DaemonOutcome):
            out.selinux = {'before': current, 'after': run.selinux_type}

    def repair_log_mode(self, out: Outcome) -> None:
        """Give an existing log directory the wanted mode (no restart: the daemon keeps its open files)."""
        log_dir = self.run.paths.log_dir
        current = self.run.view.mode(log_dir)
        if current is None:
            return
        wanted = self.run.daemon.log_mode
        if current != wanted:
            out.act('chmod %s %s (was %s)' % (format(wanted, '04o'), log_dir, format(current, '04o')),
                    lambda: os.chmod(log_dir, wanted))

    def start(self, wanted: Wanted, out: Outcome, *, restart: bool) -> None:
        run = self.run
        self.devices.refuse_foreign(wanted.devices, out)
        self.devices.set_compute_modes(wanted.devices, wanted.compute_mode, out)
        self.prepare_dirs(out)
        replay = self._replay_for(wanted, out)
        if run.supervisor == 'systemd':
            self.unit.install(wanted, out)
            out.act('%s %s' % ('restart' if restart else 'start', run.unit), lambda: self.unit.start(wanted, out, restart=restart))
        else:
            v3_config = run.config.v3_config if wanted.v3 is not None else ''
            out.act('start the MPS control daemon' + (' (MPS v3, server %s)' % wanted.v3.server if v3_config else ''),
                    lambda: record_start(run, wanted, run.daemon.start([gpu.uuid for gpu in wanted.devices], multiuser=wanted.multiuser,
                                                                       replay=replay, v3_config=v3_config), out))

    def _replay_for(self, wanted: Wanted, out: Outcome) -> t.List[str]:
        """The persisted limits as commands for this daemon's device order (commands file rewritten to match)."""
        run = self.run
        config = run.config
        view = run.view  # the files as the run read them
        uuids = [gpu.uuid for gpu in wanted.devices]
        if run.host.limits_planned:
            # mps_host: its plan persists these limits (and, for a known device order, their commands file) first.
            planned = run.host.limits
            if planned is None or planned.empty:
                return []
            if run.host.limits_replay_for != uuids and write_replay(config, planned, uuids, check_mode=True, reader=view.text):
                change = out.act('write %s for the new device order' % config.limits_file, lambda: (
                    ensure_dir(config.config_dir, 0o755), write_replay(config, planned, uuids, check_mode=False)))
                change.undo = restorer(config.limits_file, (view.text(config.limits_file), view.mode(config.limits_file)))
            return planned.commands(uuids)
        limits = read_persisted(config, view.text)
        if limits is None:
            return self._offered(read_replay(config, view.text))
        added = limits.add_replica_shares(wanted.devices, all_devices(view.gpus))
        if added:
            out.warnings.append('the persisted limits of %s had no pinned memory limit for %s: %s from replicas=%d' % (
                run.paths.name, ', '.join(gpu.label for gpu in added), ', '.join(
                    '%dM' % limits.pinned_device_mem_limit[gpu.uuid] for gpu in added), limits.replicas))
        # the record holds only its own GPUs: shares persisted before they were known go with the start that knows them
        dropped = limits.own_shares(wanted.devices, all_devices(view.gpus))
        if added or dropped:
            change = out.act('write %s' % config.limits_json, lambda: (
                ensure_dir(config.config_dir, 0o755), persist(config, limits, check_mode=False)))
            change.undo = restorer(config.limits_json, (view.text(config.limits_json), view.mode(config.limits_json)))
        if write_replay(config, limits, uuids, check_mode=True, reader=view.text):
            change = out.act('write %s for the new device order' % config.limits_file, lambda: (
                ensure_dir(config.config_dir, 0o755), write_replay(config, limits, uuids, check_mode=False)))
            change.undo = restorer(config.limits_file, (view.text(config.limits_file), view.mode(config.limits_file)))
        return self._offered(limits.commands(uuids))

    def _offered(self, commands: t.List[str]) -> t.List[str]:
        """The replay, refused before the daemon is stopped or started where the binary lacks one of its commands.

        Only client priority is missing from some binaries; its help text is read (once) only when the replay has it.
        """
        run = self.run
        binary = run.daemon.binary
        if any(cmd.split()[0] == SET_DEFAULT_PRIORITY for cmd in commands) and run.view.offers(binary, SET_DEFAULT_PRIORITY) is False:
            raise InvalidParameterError('client_priority', 'the persisted limits of %s (%s) set a client priority, and the help '
                                        'text of %s lists no %s: this binary has no client priority. Nothing was started or '
                                        'stopped; unset it with gpufleet.mps.mps_limits (client_priority: normal) under a '
                                        'binary that has it, or remove it from the resource' % (
                                            run.paths.name, run.config.limits_json, binary, SET_DEFAULT_PRIORITY))
        if wants_static(commands) and run.view.offers(binary, SM_PARTITION) is False:
            raise InvalidParameterError('sm_partitions', 'the persisted limits of %s (%s) create static SM partitions, and the '
                                        'help text of %s lists no %s: this binary has no static partitioning (that needs '
                                        'the control binary of CUDA 13.1, 13010, or later). Nothing was started or stopped; '
                                        'remove them with gpufleet.mps.mps_limits (sm_partitions: []) or from the resource' % (
                                            run.paths.name, run.config.limits_json, binary, SM_PARTITION))
        return commands

    def stop_process(self, state: Liveness, record: t.Optional[StartRecord], out: Outcome) -> None:
        """Stop the running daemon through whoever supervises it."""
        run = self.run
        systemctl = run.systemctl
        by_systemd = record is not None and record.supervisor == 'systemd' and systemctl is not None
        run.planned.unit_stop = run.planned.unit_stop or by_systemd
        # A daemon started with protocol 3 takes -q, not the legacy quit (the record says so, else its own process).
        v3 = (record is not None and record.protocol == 3) or run.view.protocols.get(state.pid) == 3
        server_dir = self._server_dir(record) if v3 else ''

        # a v3 stop that ends clients (busy=terminate) deletes the server with --force first (-q's way with them is unknown)
        end_server = os.path.basename(server_dir) if server_dir and run.planned.ends_clients else ''

        def stop() -> None:
            if end_server:
                run.daemon.end_v3_server(end_server)
            if by_systemd:
                systemctl.stop(run.unit)  # type: ignore[union-attr]
            else:
                out.forced = run.daemon.stop(state.pid, v3=v3)
            # Whether a clean quit removes the pipe-dir files is undocumented; remove what is left so a
            # stopped daemon never looks like a crashed one.
            run.daemon.clean_stale()
            _remove_tree(server_dir)

        out.act('stop the MPS control daemon (pid %s)' % state.pid, stop, ends_clients=run.planned.ends_clients)
        # What the stop removes, later steps (state=absent) must not list a second time.
        run.planned.would_remove += [os.path.join(run.paths.pipe_dir, name) for name in PIPE_DIR_FILES] + (
            [server_dir] if server_dir else [])

    def stop(self, state: Liveness, record: t.Optional[StartRecord], out: Outcome) -> None:
        """Stop a running daemon, reset the compute mode of GPUs nobody else uses, drop the record."""
        self.stop_process(state, record, out)
        self.release(record, out)

    def release(self, record: t.Optional[StartRecord], out: Outcome) -> None:
        run = self.run
        started = run.paths.started_file
        if run.planned.reset_on_stop and record and record.compute_mode != 'unchanged':
            self.devices.set_compute_modes(self.devices.releasable_gpus(set(record.devices), out), 'default', out)
        if run.view.paths.lexists(started) and started not in run.planned.would_remove:
            out.act('remove %s' % started, lambda: remove(started))
            run.planned.would_remove.append(started)

    def _server_dir(self, record: t.Optional[StartRecord]) -> str:
        """The directory a v3 daemon made for the resource's server in the pipe directory (its sockets, namespaces and log
        FIFO [ref 1.9]): the record's server, else the listed entry's; '' for a legacy daemon."""
        run = self.run
        server = record.server if record is not None and record.protocol == 3 else ''
        if record is None:
            # its record lost (a boot): the listed entry's server, else the one its environment file names
            server = run.daemon.v3_server or env_server(run.view, run.config)
        return os.path.join(run.paths.pipe_dir, server) if server else ''

    def clean_stale(self, out: Outcome, record: t.Optional[StartRecord] = None) -> None:
        run = self.run
        server_dir = self._server_dir(record)

        def clean() -> None:
            run.daemon.clean_stale()
            _remove_tree(server_dir)

        out.act('remove stale files of a dead daemon', clean)
        run.planned.would_remove += [os.path.join(run.paths.pipe_dir, name) for name in PIPE_DIR_FILES] + (
            [server_dir] if server_dir else [])


def _remove_tree(path: str) -> None:
    """A v3 server's directory under the pipe directory, gone (never through a symbolic link)."""
    if path and os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
