# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A resource's daemon brought to the wanted state: GPUs, compute mode, supervisor, record.

``DaemonManager`` reads the current state, compares it with the wanted one, and acts only outside
check mode. The ``.started`` record (JSON) says what the running daemon was started with; idempotence
compares the wanted daemon with it, never guesses from processes.
"""

from __future__ import annotations

import os
import shutil
import typing as t
from dataclasses import dataclass

from .._options import BUSY_CHOICES, COMPUTE_MODE_CHOICES, DEFAULT_BUSY_TIMEOUT
from .._errors import InvalidParameterError, MpsError
from .._gpus import Nvml, all_devices
from .._outcome import Outcome
from .._io import refuse_unsafe_dirs
from .._observe.scan import ForeignDaemon, orphan_warnings
from .._container import with_engine
from .._resource.layout import ConfigPaths, ResourcePaths, config_paths, container_view, managed_dirs, resource_paths, validate_log_mode
from .._resource.lock import RESOURCE_LOCK, resource_lock
from .._resource.record import StartRecord
from .._selinux import validate_type as validate_selinux_type
from .._supervisor.liveness import DaemonState
from .._supervisor.process import Daemon
from .._supervisor.unit import UNIT_DIR, Systemctl, instance_unit, systemd_is_pid1, validate_units
from .absent import Absent
from .actions import DaemonActions
from .busy import BusyClients
from .decide import decide_run
from .devices import DeviceChoice
from .differences import Differences
from .model import DaemonOutcome, HostContext, Wanted
from .observe import DaemonObserve
from .systemd import SystemdUnit


class DaemonManager(DaemonObserve, DeviceChoice, DaemonActions, SystemdUnit, BusyClients, Differences, Absent):
    """Start, stop or restart the daemon of one resource."""

    def __init__(self, paths: ResourcePaths, config: ConfigPaths, daemon: Daemon, nvml: Nvml, supervisor: str,
                 check_mode: bool, *, systemctl: t.Optional[Systemctl] = None, nvidia_smi: t.Optional[str] = None,
                 unit_dir: str = UNIT_DIR, host: t.Optional['HostContext'] = None, busy: str = 'refuse',
                 busy_timeout: int = DEFAULT_BUSY_TIMEOUT, selinux_type: str = '', unit_before: t.Sequence[str] = (),
                 unit_after: t.Sequence[str] = ()) -> None:
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
        # mps_host: GPUs that a listed resource keeps in MPS use, whose compute mode a stop leaves as it is.
        self.keep_modes: t.FrozenSet[str] = host.keep_modes
        self.shm_planned = host.shm_planned
        self.host = host
        self._lock_existed = False
        # The resource's lock file was made by this run's own lock (mps_daemon): no change of the host.
        self.own_lock = False
        self._unit_stop_planned = False
        self._disable_planned = False
        # What to do about clients connected to a daemon that must stop (a restart, a stop, absent).
        self.busy = busy
        self.busy_timeout = busy_timeout
        # The pid of this resource's own daemon (set when the state is read) and, read once per run, the
        # other MPS control daemons of the host by the GPUs they serve.
        self._own_pid: t.Optional[int] = None
        # The SELinux type of the pipe directory ('' leaves labels alone), and whether its labelling is planned.
        self.selinux_type = selinux_type
        self._label_planned = False
        # Units the daemon's unit is ordered before and after (supervisor=systemd).
        self.unit_before: t.Tuple[str, ...] = tuple(unit_before)
        self.unit_after: t.Tuple[str, ...] = tuple(unit_after)
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
    @property
    def view(self) -> t.Any:
        """The run's sealed view of the host (_observe.view.HostView): every decision of this manager reads it."""
        if self.host.view is None:
            raise MpsError('internal error: %s was decided without a view of the host' % self.paths.name)
        return self.host.view

    def describe(self, state: DaemonState, record: t.Optional[StartRecord]) -> t.Dict[str, t.Any]:
        """The before/after view used for diff."""
        view: t.Dict[str, t.Any] = {'state': state.label}
        if record:
            view.update(record.daemon_view())
        return view

    # --- entry points ----------------------------------------------------------------------------
    def validate(self, state: str, compute_mode: str, foreground: bool) -> None:
        """Options checked without the host: raises before anything is read or changed."""
        if compute_mode not in COMPUTE_MODE_CHOICES:
            raise InvalidParameterError('compute_mode', 'must be one of %s' % ', '.join(COMPUTE_MODE_CHOICES))
        if foreground and self.supervisor != 'systemd' and state not in ('stopped', 'absent'):
            raise InvalidParameterError('foreground', 'needs supervisor=systemd (systemd keeps the foreground daemon and sends '
                                        'its output to the journal); a daemon this module starts itself must detach (-d)')

    def _prepare(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool,
                 remove_logs: bool, foreground: bool) -> t.Optional[Wanted]:
        """Check every option against the view and set up the decision; raises before any side effect."""
        self.validate(state, compute_mode, foreground)
        refuse_unsafe_dirs(managed_dirs(self.paths, self.config.config_dir), self.view.paths)
        self.remove_logs = remove_logs
        if state == 'absent':
            enabled = False
        wanted = self.wanted(selectors, multiuser, compute_mode, enabled, shm, foreground) if state not in ('stopped', 'absent') else None
        if wanted is not None:
            wanted.static = self._static_wanted()
        if wanted is not None and self.supervisor == 'systemd':
            self._systemd_files(wanted)  # a value no unit file can carry is refused now, before any side effect
        self.reset_on_stop = compute_mode != 'unchanged'
        self.enabled = enabled
        self._lock_existed = self.view.paths.lexists(os.path.join(self.paths.resource_dir, RESOURCE_LOCK)) and not self.own_lock
        return wanted

    def plan(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
             remove_logs: bool = False, foreground: bool = False) -> 'DaemonOutcome':
        """Every change that brings the resource to ``state``, decided from the view alone, unapplied."""
        return self._ensure(state, self._prepare(state, selectors, multiuser=multiuser, compute_mode=compute_mode, enabled=enabled,
                                                 shm=shm, remove_logs=remove_logs, foreground=foreground))

    def ensure(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
               remove_logs: bool = False, foreground: bool = False) -> Outcome:
        """Bring the resource to ``state`` (started, stopped, restarted or absent): read the host under the resource's
        lock, decide, and (unless in check mode) execute exactly what was decided."""
        self.validate(state, compute_mode, foreground)
        options = dict(multiuser=multiuser, compute_mode=compute_mode, enabled=enabled, shm=shm, remove_logs=remove_logs,
                       foreground=foreground)
        # Imported here: mps_host, which imports this module on every run, executes through its own caller.
        from .._execute import execute  # pylint: disable=import-outside-toplevel
        if self.check_mode:
            self.host.view = self.observe(state, shm, remove_logs)
            out = self.plan(state, selectors, **options)  # the plan, and nothing else
            out.warnings += orphan_warnings(self.view.orphans(), all_devices(self.view.gpus))
            return out
        if state == 'absent' and not os.path.isdir(self.paths.resource_dir):
            # Nothing under the root to serialise, and absent must not create the directories it removes.
            self.host.view = self.observe(state, shm, remove_logs)
            out = self.plan(state, selectors, **options)
            execute(out)
            return out
        with resource_lock(self.paths) as lock:
            # What was read before the lock may be stale: a concurrent run on this resource may just have set the
            # compute modes. The host is read under the lock, once.
            self.own_lock = lock.path in lock.created  # this run's own lock file: no change of the host
            self.nvml.refresh()
            self.host.view = self.observe(state, shm, remove_logs)
            try:
                out = self.plan(state, selectors, **options)
            except MpsError:
                lock.discard()  # a refused run leaves nothing behind, not even the lock it made
                raise
            out.warnings += orphan_warnings(self.view.orphans(), all_devices(self.view.gpus))
            execute(out)
            return out

    def _ensure(self, state: str, wanted: t.Optional[Wanted]) -> 'DaemonOutcome':
        """Decide every action from the view; nothing is read or changed here."""
        out = DaemonOutcome()
        out.warnings.extend(self.pending_warnings)
        seen = self.view.resource(self.paths.name)
        current = seen.state
        self._own_pid = current.pid
        if current.conflict:
            raise MpsError('the MPS control daemon for %s: %s' % (self.paths.name, current.conflict), pid=current.pid)
        record = seen.record
        if seen.corrupt:
            out.warnings.append('the start record %s of %s is corrupt (%s): it is treated as missing and written anew' % (
                self.paths.started_file, self.paths.name, seen.corrupt))
        out.before = self.describe(current, record)
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

    def _ensure_stopped(self, current: DaemonState, record: t.Optional[StartRecord], out: Outcome) -> None:
        if current.running:
            self._plan_busy(current, out, 'the stop')
            self._stop(current, record, out)
        elif current.stale:
            out.warnings.append('the MPS control daemon for %s was not running but left files behind (%s); cleaned up' % (
                self.paths.name, ', '.join(current.leftovers)))
            self._clean_stale(out)
            self._release(record, out)
        if self.supervisor == 'systemd' and self.systemctl is not None:
            if not self._unit_stop_planned and self.view.unit(self.unit)[0]:
                out.act('stop %s' % self.unit, lambda: self.systemctl.stop(self.unit))  # type: ignore[union-attr]
            if not self.enabled:
                # Stopping never enables a unit; it disables one when asked to.
                self._apply_enabled(False, out)

    def _ensure_running(self, state: str, wanted: Wanted, current: DaemonState, record: t.Optional[StartRecord],
                        out: Outcome) -> None:
        out.devices = [gpu.summary() for gpu in wanted.devices]
        self._repair_log_mode(out)
        if self.view.paths.isdir(self.paths.pipe_dir):
            self._label(out)
        # Observed, then decided (.decide, no I/O): keep, restart, recover or start.
        action, why = decide_run(state, current, self._differences(wanted, current, record), self.restart_reason)
        if wanted.shm and action != 'keep':
            self._check_shm_start(wanted)
        if action == 'keep':
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
        if action == 'restart' and self.host.split_restart:
            self._split_restart(wanted, current, record, why, out)
            return
        if action == 'restart':
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
        if action == 'recover':
            out.warnings.append('recovered the MPS control daemon for %s: %s' % (self.paths.name, why))
            self._clean_stale(out)
        self._start(wanted, out, restart=False)

    def _split_restart(self, wanted: Wanted, current: DaemonState, record: t.Optional[StartRecord], why: str,
                       out: 'DaemonOutcome') -> None:
        """A restart a host plan splits, decided once: its stop half in ``out.first`` (every stop of the plan comes before
        any start: GPU moves, swaps, renames in one run), its start half in ``out``, planned as the stop leaves the host."""
        first = DaemonOutcome(before=dict(out.before))
        self._plan_busy(current, first, 'the restart (%s)' % why)
        first.act('restart: %s' % why, kind='restart')
        first.restarting = True
        self._stop(current, record, first)
        if self.supervisor == 'systemd' and self.systemctl is not None and not self._unit_stop_planned and self.view.unit(self.unit)[0]:
            first.act('stop %s' % self.unit, lambda: self.systemctl.stop(self.unit))  # type: ignore[union-attr]
        out.first = first
        out.restarting = True
        out.restart_why = why
        out.clients = first.clients
        self._start(wanted, out, restart=False)


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
    unit_before: t.Tuple[str, ...] = ()
    unit_after: t.Tuple[str, ...] = ()
    # where the units live (tests give a directory of their own)
    unit_dir: str = UNIT_DIR

    @classmethod
    def from_params(cls, params: t.Mapping[str, t.Any], binary: t.Callable[[t.Optional[str]], str],
                    unit_dir: str = UNIT_DIR) -> 'DaemonSetup':
        """Refuse bad input, naming the option, before anything is touched; pick the supervisor (its units in
        ``unit_dir``)."""
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
            container: t.Optional[t.Dict[str, t.Any]] = with_engine(container_view(paths, params['container_root'], params['shm']))
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
        before = validate_units(params.get('unit_before'), 'unit_before')
        after = validate_units(params.get('unit_after'), 'unit_after')
        both = [name for name in after if name in before]
        if both:
            raise InvalidParameterError('unit_after', '%s %s in unit_before too: the daemon cannot start both before and after a '
                                        'unit' % (', '.join(both), 'is' if len(both) == 1 else 'are'))
        if (before or after) and supervisor != 'systemd' and not leaving:
            raise InvalidParameterError('unit_before' if before else 'unit_after', 'needs supervisor=systemd (it orders the '
                                        "daemon's systemd unit); the daemons here run with supervisor=%s" % supervisor)
        return cls(paths, config, container, daemon, supervisor, systemctl, nvidia_smi, params['busy'], params['busy_timeout'],
                   selinux_type, before, after, unit_dir=unit_dir)

    def manager(self, nvml: Nvml, check_mode: bool, host: t.Optional[HostContext] = None) -> 'DaemonManager':
        return DaemonManager(self.paths, self.config, self.daemon, nvml, self.supervisor, check_mode, systemctl=self.systemctl,
                             nvidia_smi=self.nvidia_smi, unit_dir=self.unit_dir, host=host, busy=self.busy,
                             busy_timeout=self.busy_timeout, selinux_type=self.selinux_type, unit_before=self.unit_before,
                             unit_after=self.unit_after)
