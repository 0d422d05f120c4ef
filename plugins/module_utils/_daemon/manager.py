# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A resource's daemon brought to the wanted state: GPUs, compute mode, supervisor, record.

``ResourceManager`` reads the current state, compares it with the wanted one, and acts only outside
check mode. The ``.started`` record (JSON) says what the running daemon was started with; idempotence
compares the wanted daemon with it, never guesses from processes.
"""

from __future__ import annotations

import datetime
import errno
import os
import shutil
import stat
import time
import typing as t
from dataclasses import dataclass, field

from .._errors import DeviceSelectionError, InvalidParameterError, MpsError
from .._gpus import VOLTA_CC, Gpu, Nvml, all_devices, is_mig_uuid, resolve_devices
from .._outcome import Outcome
from .._io import atomic_write, ensure_dir, read_text, refuse_unsafe_dirs, remove, restorer, untraversable_parents
from .._proc import child_pids, daemon_dev_shm, process_uid
from .._protocol.state import read_state
from .._resource.layout import (
    SHM_DIR, ConfigPaths, ResourcePaths, config_paths, container_view, managed_dirs, resource_paths, validate_log_mode,
)
from .._resource.lock import RESOURCE_LOCK, resource_lock
from .._resource.record import StartRecord, read_record, write_record
from .._resource.scan import ForeignDaemon, foreign_daemons, gpu_claims, live_daemons, scan_config, scan_resources
from .._resource.store import persist, read_persisted, read_replay, write_replay
from .._selinux import enabled as selinux_enabled, plan_type, validate_type as validate_selinux_type
from .._shm import check_unit_path, mounted_at, shm_persisted
from .._supervisor.process import LOCK_FILE, LOG_FILES, PID_FILE, PIPE_DIR_FILES, Daemon, DaemonState, inspect
from .._supervisor.unit import (
    FOREGROUND_DROPIN,
    PIDFILE_DROPIN,
    RESTART_ENV,
    SHM_DROPIN,
    Systemctl,
    instance_unit,
    parse_env,
    render_env,
    render_foreground_dropin,
    render_pidfile_dropin,
    render_shm_dropin,
    render_unit,
    UNIT_DIR,
    UNIT_NAME,
    systemd_is_pid1,
    unit_environment,
)

COMPUTE_MODE_CHOICES = ('exclusive_process', 'default', 'unchanged')
BUSY_CHOICES = ('refuse', 'wait', 'terminate')
DEFAULT_BUSY_TIMEOUT = 600
BUSY_POLL = 0.5


@dataclass
class Wanted:
    """The daemon the task asks for."""

    devices: t.List[Gpu]
    multiuser: bool
    supervisor: str
    compute_mode: str
    enabled: bool
    shm: bool = False
    foreground: bool = False

    def record(self) -> t.Dict[str, t.Any]:
        return {
            'devices': [gpu.uuid for gpu in self.devices],
            'multiuser': self.multiuser,
            'supervisor': self.supervisor,
            'shm': self.shm,
        }


@dataclass
class HostContext:
    """What a host plan tells each resource's manager: the resources it plans itself, what it removes, what it keeps."""

    # Resources of the same root whose GPUs do not count as taken: mps_host checks that its listed resources share
    # no GPU and stops removed and restarted daemons before it starts any.
    ignore_owners: t.FrozenSet[str] = frozenset()
    would_remove: t.List[str] = field(default_factory=list)
    assume_stopped: bool = False
    keep_modes: t.FrozenSet[str] = frozenset()
    restart_for: str = ''
    restart_onto: t.Sequence[Gpu] = ()
    restart_reason: str = ''
    # The same plan mounts <root>/shm (and persists it) before any daemon starts: not mounted yet is no refusal.
    shm_planned: bool = False
    # The limits the same plan persists before the start, and the device order it writes their commands file in.
    limits: t.Optional[t.Any] = None
    limits_replay_for: t.Optional[t.List[str]] = None
    limits_planned: bool = False


@dataclass
class DaemonOutcome(Outcome):
    """What the run did (or, in check mode, would do), and the daemon it leaves."""

    pid: t.Optional[int] = None
    started_at: t.Optional[str] = None
    devices: t.List[t.Dict[str, t.Any]] = field(default_factory=list)
    forced: bool = False
    # The clients connected when the daemon had to stop: ended (busy=terminate) or waited for (busy=wait).
    clients: t.List[t.Dict[str, t.Any]] = field(default_factory=list)
    # The pipe directory's SELinux type before and after, where SELinux is enabled and a type is wanted.
    selinux: t.Optional[t.Dict[str, t.Optional[str]]] = None
    # Whether a running daemon is (or would be) stopped and started again for this run's change, and why.
    restarting: bool = False
    restart_why: str = ''
    # What the run could not do as asked and why, without failing (a compute mode on a MIG device).
    notes: t.List[str] = field(default_factory=list)
    # Recorded devices NVML no longer reports (a MIG instance destroyed or created again), with what to do.
    gone: t.List[t.Dict[str, str]] = field(default_factory=list)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds').replace('+00:00', 'Z')


class ResourceManager:
    """Start, stop or restart the daemon of one resource."""

    def __init__(self, paths: ResourcePaths, config: ConfigPaths, daemon: Daemon, nvml: Nvml, supervisor: str,
                 check_mode: bool, systemctl: t.Optional[Systemctl] = None, nvidia_smi: t.Optional[str] = None,
                 unit_dir: str = UNIT_DIR, host: t.Optional['HostContext'] = None) -> None:
        self.paths = paths
        self.config = config
        self.daemon = daemon
        self.nvml = nvml
        self.supervisor = supervisor
        self.check_mode = check_mode
        self.systemctl = systemctl
        self.nvidia_smi = nvidia_smi
        self.unit_dir = unit_dir
        self.unit = instance_unit(config.instance)
        self.reset_on_stop = True
        self.enabled = True
        self.remove_logs = False
        self.pending_warnings: t.List[str] = []
        host = host or HostContext()
        # What state=absent removed, or in check mode would have: a directory emptied by it counts as empty. A host
        # plan shares one list between its resources, so a directory emptied by several of them counts as empty too.
        self._would_remove: t.List[str] = host.would_remove
        # mps_host: the daemon is planned as stopped by an earlier change of the same plan (the first half of its restart).
        self.assume_stopped = host.assume_stopped
        # mps_host: GPUs that a listed resource keeps in MPS use, whose compute mode a stop leaves as it is.
        self.keep_modes: t.FrozenSet[str] = host.keep_modes
        # mps_host: the stop is the first half of a restart, for this reason, onto these devices.
        self.restart_for = host.restart_for
        self.restart_onto: t.List[Gpu] = list(host.restart_onto)
        self.shm_planned = host.shm_planned
        self.host = host
        self._lock_existed = False
        self._unit_stop_planned = False
        self._disable_planned = False
        # What to do about clients connected to a daemon that must stop (a restart, a stop, absent).
        self.busy = 'refuse'
        self.busy_timeout = DEFAULT_BUSY_TIMEOUT
        # The pid of this resource's own daemon (set when the state is read) and, read once per run, the
        # other MPS control daemons of the host by the GPUs they serve.
        self._own_pid: t.Optional[int] = None
        # The SELinux type of the pipe directory ('' leaves labels alone), and whether its labelling is planned.
        self.selinux_type = ''
        self._label_planned = False
        self._foreign: t.Optional[t.Tuple[t.Dict[str, ForeignDaemon], t.List[ForeignDaemon]]] = None
        # Resources of the same root whose GPUs do not count as taken: mps_host plans a whole host, checks
        # that its listed resources share no GPU and stops removed and changed daemons before it starts any.
        self.ignore_owners: t.FrozenSet[str] = host.ignore_owners
        # Why the compute mode asked for is not applied (a MIG device); shown in the diff and the result.
        self.compute_mode_note = ''
        # Why state=restarted was asked for, when the caller knows (mps_host: a limit only a restart drops).
        self.restart_reason = host.restart_reason
        # Whether the stop this run plans ends connected clients (busy=terminate with clients connected).
        self._ends_clients = False

    # --- reading -------------------------------------------------------------------------------
    def record(self) -> t.Optional[StartRecord]:
        return read_record(self.paths)

    def owned_elsewhere(self) -> t.Dict[str, str]:
        """UUID -> resource, for GPUs of the other live daemons under the same root."""
        others = live_daemons(self.paths.root, exclude=self.paths.name)
        return {uuid: names[0] for uuid, names in gpu_claims({name: found[1] for name, found in others.items()
                                                              if name not in self.ignore_owners}).items()}

    def foreign(self) -> t.Tuple[t.Dict[str, ForeignDaemon], t.List[ForeignDaemon]]:
        """(GPU UUID -> a daemon not of this root that serves it, daemons whose GPUs cannot be told).

        Daemons under the same root are told by their start records (:meth:`owned_elsewhere`, which names
        the resource); the processes show the others: under another root, started by hand, the device
        plugin's.
        """
        if self._foreign is None:
            # A resource of this root is left to its record (owned_elsewhere names the resource).
            known, unreadable = foreign_daemons(self.paths.pipe_dir, self.nvml.gpus(), self._own_pid, outside=self.paths.root)
            claims: t.Dict[str, ForeignDaemon] = {}
            for daemon in known:
                for uuid in daemon.uuids:
                    claims.setdefault(uuid, daemon)
            self._foreign = (claims, unreadable)
        return self._foreign

    def _refuse_foreign(self, devices: t.Sequence[Gpu], out: Outcome) -> None:
        """Never take a GPU that an MPS daemon of another root, or of another tool, serves."""
        claims, unreadable = self.foreign()
        taken = [(gpu, claims[gpu.uuid]) for gpu in devices if gpu.uuid in claims]
        if taken:
            raise DeviceSelectionError(
                'devices: %s; one GPU served by two MPS control daemons breaks both (and stopping one resets the other\'s '
                'compute mode). Stop that daemon (echo quit | CUDA_MPS_PIPE_DIRECTORY=<its pipe directory> '
                'nvidia-cuda-mps-control) or choose other devices; nothing was done' % '; '.join(
                    '%s is served by another MPS control daemon: %s' % (gpu.label, daemon.describe())
                    for gpu, daemon in taken))
        for daemon in unreadable:
            out.warnings.append('another MPS control daemon runs, %s, and this run cannot read its environment to tell which '
                                'GPUs it serves (run as root): make sure it does not serve %s' % (
                                    daemon.describe(), ', '.join(gpu.label for gpu in devices)))

    @property
    def dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, SHM_DROPIN)

    @property
    def foreground_dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, FOREGROUND_DROPIN)

    @property
    def pidfile_dropin_path(self) -> str:
        return os.path.join(self.unit_dir, '%s.d' % self.unit, PIDFILE_DROPIN)

    def wanted(self, selectors: t.Any, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
               foreground: bool = False) -> Wanted:
        """Resolve and check the requested devices; raises before any side effect."""
        if foreground and self.supervisor != 'systemd':
            raise InvalidParameterError('foreground', 'needs supervisor=systemd (systemd keeps the foreground daemon and sends '
                                        'its output to the journal); a daemon this module starts itself must detach (-d)')
        devices = resolve_devices(selectors, self.nvml.gpus(), warnings=self.pending_warnings)
        if compute_mode != 'unchanged' and any(gpu.is_mig for gpu in devices):
            # NVML refuses compute modes on MIG devices and on a GPU in MIG mode: MIG isolates the instance instead.
            self.compute_mode_note = ('%s not applied: %s is a MIG device, and NVML has no compute mode for MIG devices (nor '
                                      'for a GPU in MIG mode); the instance is isolated by MIG instead' % (
                                          compute_mode.upper(), devices[0].label))
            compute_mode = 'unchanged'
        old = [gpu for gpu in devices if gpu.compute_capability < VOLTA_CC]
        if multiuser and old:
            raise InvalidParameterError('multiuser', 'needs GPUs of compute capability 7.0 (Volta) or newer: %s %s older. The '
                                        'driver starts -multiuser-server below it, but clients that are not root then fail '
                                        'to connect; use multiuser=false (one server per user) on these GPUs' % (
                                            ', '.join('GPU %d (%s, %s, %d.%d)' % ((gpu.index, gpu.uuid, gpu.name) + gpu.compute_capability)
                                                      for gpu in old), 'is' if len(old) == 1 else 'are'))
        owners = self.owned_elsewhere()
        taken = [(gpu, owners[gpu.uuid]) for gpu in devices if gpu.uuid in owners]
        if taken:
            raise DeviceSelectionError('devices: %s already used by another MPS daemon under %s' % (
                '; '.join('%s by resource %r' % (gpu.label, owner) for gpu, owner in taken), self.paths.root))
        if shm and not self.shm_planned and mounted_at(self.paths.shm_dir) is None:
            message = ('%s does not exist or is not mounted: mount the shared tmpfs with gpufleet.mps.mps_shm before '
                       'starting daemons with shm=true' % self.paths.shm_dir)
            if not self.check_mode:
                raise InvalidParameterError('shm', message)
            self.pending_warnings.append(message + ' (check mode carries on)')
        if shm and self.supervisor == 'systemd' and not self.shm_planned and not shm_persisted(self.paths.shm_dir, self.unit_dir):
            self.pending_warnings.append(
                '%s is mounted but neither a mount unit nor an fstab line brings it back at boot: the unit %s needs it '
                '(RequiresMountsFor=, BindPaths=) and will fail to start after a reboot; mount it with '
                'gpufleet.mps.mps_shm persist=systemd' % (self.paths.shm_dir, self.unit))
        return Wanted(devices, multiuser, self.supervisor, compute_mode, enabled, shm, foreground)

    def _report_gone(self, record: t.Optional[StartRecord], wanted: t.Optional[Wanted], out: 'DaemonOutcome') -> None:
        """Name the devices the daemon was started on that NVML no longer reports: a MIG instance destroyed, or
        destroyed and created again with a new UUID (nvidia-mig-parted re-partitioning). Nothing is reset for them."""
        if record is None:
            return
        known = {gpu.uuid for gpu in all_devices(self.nvml.gpus())}
        onto = wanted.devices if wanted is not None else self.restart_onto
        for uuid in record.devices:
            if uuid in known:
                continue
            if onto:
                then = 'The daemon restarts on %s.' % ', '.join(gpu.label for gpu in onto)
            elif self._own_pid:
                then = 'The daemon is stopped; nothing is reset for the device.'
            else:
                then = 'Nothing is reset for it.'
            if is_mig_uuid(uuid):
                what = ('MIG device %s, which resource %r was started on, no longer exists: its instance was destroyed (or '
                        're-created by re-partitioning, with a new UUID), and clients of the daemon on it fail. %s%s' % (
                            uuid, self.paths.name, then, '' if onto else
                            ' To serve the new instance, list the resource with its MIG device (nvidia-smi -L lists them).'))
            else:
                what = 'GPU %s, which resource %r was started on, is no longer reported by NVML (removed, or fallen off the bus). %s' % (
                    uuid, self.paths.name, then)
            out.gone.append({'uuid': uuid, 'message': what})
            out.warnings.append(what)

    def describe(self, state: DaemonState, record: t.Optional[StartRecord]) -> t.Dict[str, t.Any]:
        """The before/after view used for diff."""
        view: t.Dict[str, t.Any] = {'state': state.label}
        if record:
            view.update(record.daemon_view())
        return view

    # --- systemd files ---------------------------------------------------------------------------
    def _env_values(self, wanted: Wanted) -> t.Dict[str, str]:
        return unit_environment(self.paths, self.config, [gpu.uuid for gpu in wanted.devices], wanted.multiuser,
                                wanted.compute_mode, self.daemon.binary, self.nvidia_smi, self.daemon.stop_timeout,
                                self.daemon.log_mode, self.selinux_type, wanted.foreground)

    def _systemd_files(self, wanted: Wanted) -> t.Dict[str, t.Optional[str]]:
        """Path -> wanted content; None for a file that must not exist."""
        return {
            os.path.join(self.unit_dir, UNIT_NAME): render_unit(self.config.config_dir, int(self.daemon.start_timeout), self.daemon.stop_timeout),
            self.config.env_file: render_env(self.paths.name, self._env_values(wanted)),
            self.dropin_path: render_shm_dropin(self.paths.shm_dir) if wanted.shm else None,
            self.foreground_dropin_path: render_foreground_dropin(int(self.daemon.start_timeout)) if wanted.foreground else None,
            self.pidfile_dropin_path: (None if wanted.foreground else
                                       render_pidfile_dropin(os.path.join(self.paths.pipe_dir, PID_FILE))),
        }

    # --- actions: planned into the outcome, run by its apply() ------------------------------------
    def _set_compute_modes(self, devices: t.Sequence[Gpu], mode: str, out: Outcome) -> None:
        if mode == 'unchanged':
            return
        for gpu in devices:
            if gpu.is_mig or gpu.mig_enabled:
                # NVML has no compute mode for a MIG device (wanted() says so in the diff), nor for a GPU in MIG mode (one
                # whose MIG mode was enabled under a running daemon: it is given back as it is).
                continue
            if gpu.compute_mode != mode:
                change = out.act('set compute mode %s on GPU %d (%s)' % (mode.upper(), gpu.index, gpu.uuid),
                                 lambda gpu=gpu: self.nvml.set_compute_mode(gpu, mode))
                change.undo = lambda gpu=gpu, was=gpu.compute_mode: self.nvml.set_compute_mode(gpu, was)

    def _prepare_dirs(self, out: Outcome) -> None:
        out.step(lambda: (ensure_dir(self.paths.pipe_dir, 0o755), ensure_dir(self.paths.log_dir, self.daemon.log_mode)))
        self._label(out)
        blocked = untraversable_parents(self.paths.pipe_dir)
        if blocked:
            out.warnings.append('%s cannot be traversed by other users: MPS clients that do not run as root will fail to '
                                'connect (chmod o+x, or run clients as root)' % ', '.join(blocked))

    def _label(self, out: Outcome) -> None:
        """Give the pipe directory its SELinux type (planned once: after the directory exists, or now to repair it)."""
        if self._label_planned:
            return
        self._label_planned = True
        current = plan_type(self.paths.pipe_dir, self.selinux_type, out)
        if self.selinux_type and selinux_enabled() and isinstance(out, DaemonOutcome):
            out.selinux = {'before': current, 'after': self.selinux_type}

    def _repair_log_mode(self, out: Outcome) -> None:
        """Give an existing log directory the wanted mode (no restart: the daemon keeps its open files)."""
        try:
            current = stat.S_IMODE(os.lstat(self.paths.log_dir).st_mode)
        except OSError:
            return
        wanted = self.daemon.log_mode
        if current != wanted:
            out.act('chmod %s %s (was %s)' % (format(wanted, '04o'), self.paths.log_dir, format(current, '04o')),
                    lambda: os.chmod(self.paths.log_dir, wanted))

    def _write_record(self, wanted: Wanted, pid: t.Optional[int], out: Outcome) -> None:
        """Record what the daemon (pid) was started with; called when that is known (planning or applying)."""
        record = StartRecord(devices=[gpu.uuid for gpu in wanted.devices], multiuser=wanted.multiuser, supervisor=wanted.supervisor,
                             shm=wanted.shm, pid=pid, started_at=_now(), compute_mode=wanted.compute_mode,
                             control_binary=self.daemon.binary)
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

    def _start_unit(self, wanted: Wanted, out: Outcome, restart: bool) -> None:
        if self.systemctl is None:
            return
        (self.systemctl.restart if restart else self.systemctl.start)(self.unit)
        self.daemon.wait_ready()
        self._write_record(wanted, inspect(self.paths).pid or self.systemctl.main_pid(self.unit), out)

    def _replay_for(self, wanted: Wanted, out: Outcome) -> t.List[str]:
        """The persisted limits as commands for this daemon's device order (commands file rewritten to match)."""
        uuids = [gpu.uuid for gpu in wanted.devices]
        if self.host.limits_planned:
            # mps_host: its plan persists these limits (and, for a known device order, their commands file) first.
            planned = self.host.limits
            if planned is None or planned.empty:
                return []
            if self.host.limits_replay_for != uuids and write_replay(self.config, planned, uuids, check_mode=True):
                change = out.act('write %s for the new device order' % self.config.limits_file, lambda: (
                    ensure_dir(self.config.config_dir, 0o755), write_replay(self.config, planned, uuids, check_mode=False)))
                change.undo = restorer(self.config.limits_file)
            return planned.commands(uuids)
        limits = read_persisted(self.config)
        if limits is None:
            return read_replay(self.config)
        added = limits.add_replica_shares(wanted.devices, all_devices(self.nvml.gpus()))
        if added:
            out.warnings.append('the persisted limits of %s had no pinned memory limit for %s: %s from replicas=%d' % (
                self.paths.name, ', '.join(gpu.label for gpu in added), ', '.join(
                    '%dM' % limits.pinned_device_mem_limit[gpu.uuid] for gpu in added), limits.replicas))
            out.act('write %s' % self.config.limits_json, lambda: (
                ensure_dir(self.config.config_dir, 0o755), persist(self.config, limits, check_mode=False)))
        if write_replay(self.config, limits, uuids, check_mode=True):
            out.act('write %s for the new device order' % self.config.limits_file, lambda: (
                ensure_dir(self.config.config_dir, 0o755), write_replay(self.config, limits, uuids, check_mode=False)))
        return limits.commands(uuids)

    def _install_unit(self, wanted: Wanted, out: Outcome) -> None:
        unit_path = os.path.join(self.unit_dir, UNIT_NAME)
        reload_needed = False
        for path, content in self._systemd_files(wanted).items():
            if read_text(path) == content:
                continue
            if content is None:
                out.act('remove %s' % path, lambda path=path: remove(path))
            else:
                out.act('write %s' % path, lambda path=path, content=content: (
                    ensure_dir(os.path.dirname(path), 0o755), atomic_write(path, content, 0o644)))
            reload_needed = reload_needed or path in (unit_path, self.dropin_path, self.pidfile_dropin_path, self.foreground_dropin_path)
        if reload_needed:
            out.act('systemctl daemon-reload', self.systemctl.daemon_reload if self.systemctl else None)
        self._apply_enabled(wanted.enabled, out)

    def _apply_enabled(self, enabled: t.Optional[bool], out: Outcome) -> None:
        if enabled is None or self.systemctl is None:
            return
        if self.systemctl.is_enabled(self.unit) != enabled:
            self._disable_planned = self._disable_planned or not enabled
            systemctl = self.systemctl
            out.act('%s %s' % ('enable' if enabled else 'disable', self.unit),
                    lambda: (systemctl.enable if enabled else systemctl.disable)(self.unit))

    def connected_clients(self, pid: t.Optional[int]) -> t.List[t.Dict[str, t.Any]]:
        """The clients of the daemon's servers, as the daemon lists them (one UI process)."""
        readout = read_state(self.daemon.query, 0, child_pids(pid) if pid else [])
        return [{'pid': client, 'uid': process_uid(client), 'server': server.pid}
                for server in readout.servers for client in server.clients]

    def _plan_busy(self, current: DaemonState, out: Outcome, change: str) -> None:
        """Connected clients would be ended by this stop: refuse (the default), wait for them, or go on and end them."""
        clients = self.connected_clients(current.pid)
        if not clients:
            return
        if isinstance(out, DaemonOutcome):
            out.clients = clients
        named = ', '.join('pid %d (uid %s) on server %d' % (client['pid'], client['uid'], client['server']) for client in clients)
        if self.busy == 'refuse':
            raise MpsError('busy: %s of the MPS control daemon for %s (pid %s) would end its %d connected client(s) - %s; '
                           'nothing was done. Set busy=wait to wait up to busy_timeout seconds for them to leave, or '
                           'busy=terminate to end them' % (change, self.paths.name, current.pid, len(clients), named),
                           clients=clients)
        self._ends_clients = self.busy == 'terminate'
        if self.busy == 'wait':
            out.act('wait up to %ds for %d connected client(s) to leave - %s' % (self.busy_timeout, len(clients), named),
                    lambda: self._wait_idle(current.pid, change))
        else:
            out.warnings.append('%s of the MPS control daemon for %s ends its %d connected client(s) (busy=terminate) - %s' % (
                change, self.paths.name, len(clients), named))

    def _wait_idle(self, pid: t.Optional[int], change: str) -> None:
        deadline = time.monotonic() + self.busy_timeout
        while True:
            clients = self.connected_clients(pid)
            if not clients:
                return
            if time.monotonic() >= deadline:
                raise MpsError('busy: the MPS control daemon for %s (pid %s) still has %d connected client(s) after %ds - %s; '
                               '%s was not done (busy=wait)' % (
                                   self.paths.name, pid, len(clients), self.busy_timeout,
                                   ', '.join('pid %d' % client['pid'] for client in clients), change), clients=clients)
            self.daemon.sleep(BUSY_POLL)

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

    def _release_dropped(self, wanted: Wanted, record: t.Optional[StartRecord], out: Outcome) -> None:
        """After a restart on fewer GPUs, give the dropped ones back to non-MPS users."""
        if not record or record.compute_mode == 'unchanged':
            return
        dropped = set(record.devices) - {gpu.uuid for gpu in wanted.devices}
        self._set_compute_modes(self._releasable(dropped, out), 'default', out)

    def _releasable(self, uuids: t.Set[str], out: Outcome) -> t.List[Gpu]:
        """The GPUs of ``uuids`` whose compute mode may go back to DEFAULT: no other MPS daemon serves them."""
        still_used = set(self.owned_elsewhere())
        claims = self.foreign()[0]
        gpus = []
        for gpu in self.nvml.gpus():
            if gpu.uuid not in uuids or gpu.uuid in still_used or gpu.uuid in self.keep_modes:
                continue
            if gpu.uuid in claims:
                if gpu.compute_mode != 'default':
                    out.warnings.append('GPU %d (%s) keeps compute mode %s: another MPS control daemon serves it, %s' % (
                        gpu.index, gpu.uuid, gpu.compute_mode.upper(), claims[gpu.uuid].describe()))
                continue
            gpus.append(gpu)
        return gpus

    def _release(self, record: t.Optional[StartRecord], out: Outcome) -> None:
        if self.reset_on_stop and record and record.compute_mode != 'unchanged':
            self._set_compute_modes(self._releasable(set(record.devices), out), 'default', out)
        if os.path.exists(self.paths.started_file) and self.paths.started_file not in self._would_remove:
            out.act('remove %s' % self.paths.started_file, lambda: remove(self.paths.started_file))
            self._would_remove.append(self.paths.started_file)

    # --- entry points ----------------------------------------------------------------------------
    def _prepare(self, state: str, selectors: t.Any, multiuser: bool, compute_mode: str, enabled: bool, shm: bool,
                 remove_logs: bool, foreground: bool) -> t.Optional[Wanted]:
        """Check every option against the host and set up the run; raises before any side effect."""
        if compute_mode not in COMPUTE_MODE_CHOICES:
            raise InvalidParameterError('compute_mode', 'must be one of %s' % ', '.join(COMPUTE_MODE_CHOICES))
        refuse_unsafe_dirs(managed_dirs(self.paths, self.config.config_dir))
        self.remove_logs = remove_logs
        if state == 'absent':
            enabled = False
        wanted = self.wanted(selectors, multiuser, compute_mode, enabled, shm, foreground) if state not in ('stopped', 'absent') else None
        if wanted is not None and self.supervisor == 'systemd':
            self._systemd_files(wanted)  # a value no unit file can carry is refused now, before any side effect
        self.reset_on_stop = compute_mode != 'unchanged'
        self.enabled = enabled
        self._lock_existed = os.path.exists(os.path.join(self.paths.resource_dir, RESOURCE_LOCK))
        return wanted

    def plan(self, state: str, selectors: t.Any, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
             remove_logs: bool = False, foreground: bool = False) -> 'DaemonOutcome':
        """Every change that brings the resource to ``state``, unapplied (mps_host executes a whole host's plan)."""
        return self._ensure(state, self._prepare(state, selectors, multiuser, compute_mode, enabled, shm, remove_logs, foreground))

    def ensure(self, state: str, selectors: t.Any, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
               remove_logs: bool = False, foreground: bool = False) -> Outcome:
        """Bring the resource to ``state`` (started, stopped, restarted or absent)."""
        wanted = self._prepare(state, selectors, multiuser, compute_mode, enabled, shm, remove_logs, foreground)
        if self.check_mode:
            return self._ensure(state, wanted)  # the plan, and nothing else
        if state == 'absent' and not os.path.isdir(self.paths.resource_dir):
            # Nothing under the root to serialise, and absent must not create the directories it removes.
            out = self._ensure(state, wanted)
            out.apply()
            return out
        with resource_lock(self.paths):
            # What was read before the lock may be stale: a concurrent run on this resource may just have
            # set the compute modes. Read the GPUs again under the lock, so only one run reports the change.
            self.nvml.refresh()
            if wanted is not None:
                by_uuid = {gpu.uuid: gpu for gpu in all_devices(self.nvml.gpus())}
                wanted.devices = [by_uuid.get(gpu.uuid, gpu) for gpu in wanted.devices]
            out = self._ensure(state, wanted)
            out.apply()
            return out

    def _ensure(self, state: str, wanted: t.Optional[Wanted]) -> 'DaemonOutcome':
        """Read the state and plan every action; nothing is changed here."""
        out = DaemonOutcome()
        out.warnings.extend(self.pending_warnings)
        # A daemon the same plan stops first (the first half of its restart) is planned as stopped, without a record.
        current = DaemonState(False, None, None) if self.assume_stopped else inspect(self.paths)
        self._own_pid = current.pid
        if current.conflict:
            raise MpsError('the MPS control daemon for %s: %s' % (self.paths.name, current.conflict), pid=current.pid)
        record = None if self.assume_stopped else self.record()
        out.before = self.describe(current, record)
        if current.running and not self.daemon.answered:
            # One UI process: does it answer at all? A hung daemon fails here, naming pid and log. (mps_host has
            # just read its limits in one: that answer counts.)
            self.daemon.ping()
        if wanted is None:
            self._ensure_stopped(current, record, out)
            if state == 'absent':
                self._purge(out)
        else:
            self._ensure_running(state, wanted, current, record, out)
        out.after = {'state': state} if wanted is None else dict(wanted.record(), state='running')
        if self.compute_mode_note and wanted is not None:
            out.notes.append('compute mode ' + self.compute_mode_note)
            out.before['compute_mode'] = out.after['compute_mode'] = 'not applicable (MIG device)'
        self._report_gone(record, wanted, out)
        if out.selinux is not None:
            out.before['selinux_type'] = out.selinux['before']
            out.after['selinux_type'] = out.selinux['after']
        return out

    # --- absent ----------------------------------------------------------------------------------
    def created_files(self) -> t.List[str]:
        """Every file this collection creates for the resource (logs aside), in removal order."""
        unit_d = os.path.dirname(self.dropin_path)
        return [
            self.config.env_file, self.config.limits_file, self.config.limits_json, self.config.limits_env,
            self.dropin_path, self.foreground_dropin_path, self.pidfile_dropin_path, os.path.join(unit_d),
            self.paths.started_file,
        ] + [os.path.join(self.paths.pipe_dir, name) for name in PIPE_DIR_FILES + (LOCK_FILE,)] + [
            self.paths.pipe_dir,
        ]

    def _purge(self, out: Outcome) -> None:
        """After the stop: remove what this collection created for the resource, and nothing else.

        Files are removed by name; a directory only when it is empty afterwards, so anything another
        tool keeps there stays. The logs stay unless ``remove_logs``. The resource's lock file goes last
        (it is held until the module ends); the template unit goes with the last resource of its config
        directory.
        """
        if self.systemctl is not None and not self._disable_planned and self.systemctl.is_enabled(self.unit):
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
        elif os.path.lexists(lock):
            out.step(lambda: remove(lock))  # this run's own lock, on a directory that was there: no change of the host
            self._would_remove.append(lock)
        parents = [self.paths.resource_dir]
        if os.path.dirname(self.paths.resource_dir) != self.paths.root:
            parents.append(os.path.dirname(self.paths.resource_dir))
        for directory in parents + [self.paths.root, self.config.config_dir]:
            self._remove(directory, out)
        self._name_foreign(out)
        if os.path.exists(unit_path) and not self._other_instances():
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
        for name in scan_resources(self.paths.root, with_logs=True):
            ours.add(os.path.join(self.paths.root, name.split('/')[0]))
            ours.add(os.path.join(self.paths.root, name))
        ours |= {os.path.join(self.paths.root, SHM_DIR), os.path.join(self.paths.root, '.ready'), self.paths.log_dir}
        ours |= {os.path.join(self.paths.resource_dir, name) for name in ('pipe', RESOURCE_LOCK)}
        for name in scan_config(self.config.config_dir):
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
            if directory in gone or not os.path.isdir(directory) or os.path.ismount(directory):
                continue
            try:
                entries = sorted(os.listdir(directory))
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
            names = os.listdir(self.config.config_dir)
        except OSError:
            return False
        gone = set(self._would_remove)
        return any(name.endswith('.env') and os.path.join(self.config.config_dir, name) not in gone | {self.config.env_file}
                   for name in names)

    def _remove(self, path: str, out: Outcome) -> bool:
        """Plan the removal of a file, or of a directory that is empty once what is planned before is removed."""
        if path in self._would_remove or not os.path.lexists(path):
            return False
        if os.path.isdir(path) and not os.path.islink(path):
            gone = set(self._would_remove)
            if os.path.ismount(path) or any(os.path.join(path, name) not in gone for name in os.listdir(path)):
                return False  # a mount point is not the collection's to remove, nor a directory with others' files
            out.act('remove directory %s' % path, lambda: _rmdir_if_empty(path))
        else:
            out.act('remove %s' % path, lambda: remove(path))
        self._would_remove.append(path)
        return True

    def _ensure_stopped(self, current: DaemonState, record: t.Optional[StartRecord], out: Outcome) -> None:
        if current.running and self.restart_for:
            # The first half of a restart that a host plan splits (every stop before any start: GPU moves, swaps).
            self._plan_busy(current, out, 'the restart (%s)' % self.restart_for)
            out.act('restart: %s' % self.restart_for, kind='restart')
            if isinstance(out, DaemonOutcome):
                out.restarting = True
            self._stop(current, record, out)
        elif current.running:
            self._plan_busy(current, out, 'the stop')
            self._stop(current, record, out)
        elif current.stale:
            out.warnings.append('the MPS control daemon for %s was not running but left files behind (%s); cleaned up' % (
                self.paths.name, ', '.join(current.leftovers)))
            self._clean_stale(out)
            self._release(record, out)
        if self.supervisor == 'systemd' and self.systemctl is not None:
            if not self._unit_stop_planned and self.systemctl.is_active(self.unit):
                out.act('stop %s' % self.unit, lambda: self.systemctl.stop(self.unit))  # type: ignore[union-attr]
            if not self.enabled:
                # Stopping never enables a unit; it disables one when asked to.
                self._apply_enabled(False, out)

    def _clean_stale(self, out: Outcome) -> None:
        out.act('remove stale files of a dead daemon', self.daemon.clean_stale)
        self._would_remove += [os.path.join(self.paths.pipe_dir, name) for name in PIPE_DIR_FILES]

    def _ensure_running(self, state: str, wanted: Wanted, current: DaemonState, record: t.Optional[StartRecord],
                        out: Outcome) -> None:
        out.devices = [gpu.summary() for gpu in wanted.devices]
        self._repair_log_mode(out)
        if os.path.isdir(self.paths.pipe_dir):
            self._label(out)
        differences = self._differences(wanted, current, record)
        if wanted.shm and not self.check_mode and not (current.running and state == 'started' and not differences):
            # A daemon is about to be (re)started with the tmpfs as /dev/shm: find out now, before the old one
            # is stopped or a compute mode changed, whether that can work here.
            if wanted.supervisor == 'systemd':
                check_unit_path(self.paths.shm_dir, 'root')
            elif not self.shm_planned or mounted_at(self.paths.shm_dir) is not None:
                self.daemon.check_shm_namespace()  # (a tmpfs the same plan mounts first is tried by the start itself)
        if current.running and state == 'started' and not differences:
            # Healthy and as wanted: only the compute mode may have drifted (it resets at reboot).
            claims = self.foreign()[0]
            for gpu in wanted.devices:
                if gpu.uuid in claims:
                    out.warnings.append('%s of %s is also served by another MPS control daemon, %s: stop one of '
                                        'them' % (gpu.label, self.paths.name, claims[gpu.uuid].describe()))
            self._set_compute_modes(wanted.devices, wanted.compute_mode, out)
            if self.supervisor == 'systemd':
                self._install_unit(wanted, out)
            if record is None or (self.supervisor == 'systemd' and record.pid != current.pid):
                # systemd brought the daemon back from the environment file this module wrote, as asked
                # for: at boot /run lost the record, after a crash the record names the dead process.
                # Record the running daemon; no restart.
                out.act('write %s for the daemon systemd started' % self.paths.started_file,
                        lambda: self._write_record(wanted, current.pid, out))
                out.pid = current.pid
                return
            out.pid = current.pid
            out.started_at = record.started_at
            return
        if current.running:
            why = '; '.join(differences) if differences else (self.restart_reason or 'state=restarted')
            self._plan_busy(current, out, 'the restart (%s)' % why)
            out.restarting = True
            out.restart_why = why
            out.act('restart: %s' % why)
            handover = record is not None and (record.supervisor or wanted.supervisor) != wanted.supervisor
            if wanted.supervisor == 'systemd' and not handover:
                self._start(wanted, out, restart=True)
            else:
                self._stop_process(current, record, out)
                self._start(wanted, out, restart=False)
            self._release_dropped(wanted, record, out)
            return
        if current.stale:
            out.warnings.append('recovered the MPS control daemon for %s: it had died and left files behind (%s)' % (
                self.paths.name, ', '.join(current.leftovers)))
            self._clean_stale(out)
        self._start(wanted, out, restart=False)

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


def _rmdir_if_empty(path: str) -> None:
    """Remove a directory planned as empty; something put there (or a mount) since the plan keeps it."""
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY, errno.ENOENT):
            raise MpsError('cannot remove the directory %s: %s' % (path, exc.strerror), path=path) from exc


@dataclass
class DaemonSetup:
    """Everything a run of mps_daemon needs before NVML is opened, validated from the module's options."""

    paths: ResourcePaths
    config: ConfigPaths
    container: t.Optional[t.Dict[str, t.Any]]
    daemon: Daemon
    supervisor: str
    systemctl: t.Optional[Systemctl]
    nvidia_smi: t.Optional[str]
    busy: str = 'refuse'
    busy_timeout: int = DEFAULT_BUSY_TIMEOUT
    selinux_type: str = ''

    @classmethod
    def from_params(cls, params: t.Mapping[str, t.Any], binary: t.Callable[[t.Optional[str]], str]) -> 'DaemonSetup':
        """Refuse bad input, naming the option, before anything is touched; pick the supervisor."""
        for timeout in ('start_timeout', 'stop_timeout', 'busy_timeout'):
            if params[timeout] < 0 or (timeout != 'stop_timeout' and params[timeout] == 0):
                raise InvalidParameterError(timeout, 'must be a positive number of seconds, got %d' % params[timeout])
        if params['busy'] not in BUSY_CHOICES:
            raise InvalidParameterError('busy', 'must be one of %s' % ', '.join(BUSY_CHOICES))
        devices = params['devices']
        if not (devices == 'all' or isinstance(devices, list)):
            raise InvalidParameterError('devices', 'must be "all" or a list of GPU indices, UUIDs or unique UUID prefixes, '
                                        'or of one MIG device (<gpu index>:<mig index> or MIG-<uuid>)')
        log_mode = validate_log_mode(params['log_mode'])
        leaving = params['state'] in ('stopped', 'absent')
        # A resource that an older version accepted (a pipe directory of 88 to 99 bytes) can still be stopped and removed.
        paths = resource_paths(params['root'], params['name'], check_length=not leaving)
        try:
            container: t.Optional[t.Dict[str, t.Any]] = container_view(paths, params['container_root'], params['shm'])
        except InvalidParameterError:
            if not leaving:
                raise
            container = None
        config = config_paths(params['config_dir'], params['name'])
        control = binary(params['control_binary'])
        supervisor = params['supervisor']
        if supervisor == 'auto':
            supervisor = 'systemd' if systemd_is_pid1() else 'none'
        systemctl = None
        nvidia_smi = None
        systemctl_path = shutil.which('systemctl')
        if supervisor == 'systemd':
            if not systemctl_path:
                raise InvalidParameterError('supervisor', 'systemd was asked for but systemctl is not installed')
            systemctl = Systemctl(systemctl_path)
            nvidia_smi = shutil.which('nvidia-smi') or '/usr/bin/nvidia-smi'
        elif params['state'] == 'absent' and systemctl_path and systemd_is_pid1():
            # A unit an earlier run enabled (supervisor=systemd) is disabled, whatever supervises now.
            systemctl = Systemctl(systemctl_path)
        daemon = Daemon(paths, control, start_timeout=params['start_timeout'], stop_timeout=params['stop_timeout'],
                        log_mode=log_mode, shm_dir=paths.shm_dir if params['shm'] else None)
        selinux_type = validate_selinux_type(params.get('selinux_type'))
        return cls(paths, config, container, daemon, supervisor, systemctl, nvidia_smi, params['busy'], params['busy_timeout'],
                   selinux_type)

    def manager(self, nvml: Nvml, check_mode: bool, host: t.Optional[HostContext] = None) -> ResourceManager:
        manager = ResourceManager(self.paths, self.config, self.daemon, nvml, self.supervisor, check_mode,
                                  systemctl=self.systemctl, nvidia_smi=self.nvidia_smi, host=host)
        manager.busy, manager.busy_timeout = self.busy, self.busy_timeout
        manager.selinux_type = self.selinux_type
        return manager
