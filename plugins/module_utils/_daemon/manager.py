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
from .._io import refuse_unsafe_dirs, remove
from .._proc import replaced_binary_warning
from .._observe.reader import Wants
from .._observe.scan import orphan_warnings
from .._container import with_engine
from .._resource.layout import ConfigPaths, ResourcePaths, config_paths, container_view, managed_dirs, resource_paths, validate_log_mode
from .._resource.lock import RESOURCE_LOCK, resource_lock
from .._resource.record import StartRecord
from .._selinux import validate_type as validate_selinux_type
from .._supervisor.liveness import Liveness
from .._supervisor.process import Daemon
from .._supervisor.unit import UNIT_DIR, Systemctl, systemd_is_pid1, validate_units
from .absent import Absent
from .actions import DaemonActions
from .busy import BusyClients
from .decide import decide_run
from .devices import DeviceChoice
from .differences import differences, static_wanted
from .model import DaemonOutcome, DaemonRun, HostContext, Planned, Wanted, record_start
from .observe import check_shm_start, observe, probe, wants
from .systemd import UnitFiles


class DaemonManager:
    """Start, stop or restart the daemon of one resource: its parts (devices, actions, unit files, busy clients,
    removals) hold the run's one :class:`.model.DaemonRun`; what a decision planned so far is its ``planned``."""

    def __init__(self, paths: ResourcePaths, config: ConfigPaths, daemon: Daemon, nvml: Nvml, supervisor: str, *,
                 check_mode: bool, systemctl: t.Optional[Systemctl] = None, nvidia_smi: t.Optional[str] = None,
                 unit_dir: str = UNIT_DIR, host: t.Optional['HostContext'] = None, busy: str = 'refuse',
                 busy_timeout: int = DEFAULT_BUSY_TIMEOUT, selinux_type: str = '', unit_before: t.Sequence[str] = (),
                 unit_after: t.Sequence[str] = ()) -> None:
        host = host or HostContext()
        self.run = run = DaemonRun(paths, config, daemon, nvml, supervisor, check_mode, systemctl, nvidia_smi, unit_dir, host,
                                   busy, busy_timeout, selinux_type, tuple(unit_before), tuple(unit_after))
        self.unit_files = UnitFiles(run)
        self.devices = DeviceChoice(run)
        self.clients = BusyClients(run)
        self.actions = DaemonActions(run, self.devices, self.unit_files)
        self.absent = Absent(run, self.unit_files)

    @property
    def paths(self) -> ResourcePaths:
        return self.run.paths

    @property
    def daemon(self) -> Daemon:
        return self.run.daemon

    @property
    def view(self) -> t.Any:
        """The run's sealed view of the host (_observe.view.HostView): every decision of this manager reads it."""
        return self.run.view

    # --- reading -------------------------------------------------------------------------------
    def wants(self, *, shm: bool, state: str = 'started') -> Wants:
        """Every path a decision about this resource may look at, beyond its own directories and persisted files."""
        return wants(self.run, self.unit_files, self.absent.removal_paths, shm=shm, state=state)

    def removal_paths(self) -> t.List[str]:
        return self.absent.removal_paths()

    def probe(self, view: t.Any, state: str, *, shm: bool, ordinals: t.Optional[int]) -> None:
        probe(self.run, view, state, shm=shm, ordinals=ordinals)

    def _observe(self, state: str, *, shm: bool, remove_logs: bool) -> None:
        self.run.host.view = observe(self.run, self.wants(shm=shm, state=state), state, shm=shm, remove_logs=remove_logs)

    @staticmethod
    def describe(state: Liveness, record: t.Optional[StartRecord]) -> t.Dict[str, t.Any]:
        """The before/after view used for diff."""
        view: t.Dict[str, t.Any] = {'state': state.label}
        if record:
            view.update(record.daemon_view())
        return view

    # --- entry points ----------------------------------------------------------------------------
    def validate(self, state: str, compute_mode: str, *, foreground: bool) -> None:
        """Options checked without the host: raises before anything is read or changed."""
        if compute_mode not in COMPUTE_MODE_CHOICES:
            raise InvalidParameterError('compute_mode', 'must be one of %s' % ', '.join(COMPUTE_MODE_CHOICES))
        if foreground and self.run.supervisor != 'systemd' and state not in ('stopped', 'absent'):
            raise InvalidParameterError('foreground', 'needs supervisor=systemd (systemd keeps the foreground daemon and sends '
                                        'its output to the journal); a daemon this module starts itself must detach (-d)')

    def _prepare(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool,
                 remove_logs: bool, foreground: bool, v3: t.Optional[t.Any] = None) -> t.Optional[Wanted]:
        """Check every option against the view and set up the decision; raises before any side effect."""
        run = self.run
        self.validate(state, compute_mode, foreground=foreground)
        refuse_unsafe_dirs(managed_dirs(run.paths, run.config.config_dir), self.view.paths)
        if state == 'absent':
            enabled = False
        run.planned = Planned(would_remove=run.host.would_remove, remove_logs=remove_logs, enabled=enabled,
                              reset_on_stop=compute_mode != 'unchanged',
                              lock_existed=self.view.paths.lexists(os.path.join(run.paths.resource_dir, RESOURCE_LOCK)) and not run.own_lock)
        if state in ('stopped', 'absent'):
            return None
        wanted = self.devices.wanted(selectors, multiuser=multiuser, compute_mode=compute_mode, enabled=enabled, shm=shm,
                                     foreground=foreground)
        wanted.static = static_wanted(run)
        wanted.v3 = v3
        record = self.view.resource(run.paths.name).record
        found = self.view.v3.get(run.paths.name)  # read with v3 words: its record, or its environment file, names its server
        if v3 is None and not run.host.limits_planned and ((record is not None and record.protocol == 3) or found is not None):
            raise InvalidParameterError('name', '%s runs MPS v3 (server %s), started by gpufleet.mps.mps_host from an entry with '
                                        'protocol: 3: mps_daemon starts and restarts legacy daemons only - manage it with '
                                        'mps_host, or stop it here (state=stopped or absent) first' % (
                                            run.paths.name, record.server if record is not None and record.server else found[1].server))
        if run.supervisor == 'systemd':
            self.unit_files.render(wanted)  # a value no unit file can carry is refused now, before any side effect
        return wanted

    def plan(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
             remove_logs: bool = False, foreground: bool = False, v3: t.Optional[t.Any] = None) -> 'DaemonOutcome':
        """Every change that brings the resource to ``state``, decided from the view alone, unapplied (``v3``: a v3
        resource's record, _v3.spec.V3Spec)."""
        return self._decide(state, self._prepare(state, selectors, multiuser=multiuser, compute_mode=compute_mode, enabled=enabled,
                                                 shm=shm, remove_logs=remove_logs, foreground=foreground, v3=v3))

    def ensure(self, state: str, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
               remove_logs: bool = False, foreground: bool = False) -> Outcome:
        """Bring the resource to ``state`` (started, stopped, restarted or absent): read the host under the resource's
        lock, decide, and (unless in check mode) execute exactly what was decided."""
        run = self.run
        self.validate(state, compute_mode, foreground=foreground)
        options = dict(multiuser=multiuser, compute_mode=compute_mode, enabled=enabled, shm=shm, remove_logs=remove_logs,
                       foreground=foreground)
        # Imported here: mps_host, which imports this module on every run, executes through its own caller.
        from .._execute import execute  # pylint: disable=import-outside-toplevel
        if run.check_mode:
            self._observe(state, shm=shm, remove_logs=remove_logs)
            out = self.plan(state, selectors, **options)  # the plan, and nothing else
            out.warnings += orphan_warnings(self.view.orphans(), all_devices(self.view.gpus))
            return out
        if state == 'absent' and not os.path.isdir(run.paths.resource_dir):
            # Nothing under the root to serialise, and absent must not create the directories it removes.
            self._observe(state, shm=shm, remove_logs=remove_logs)
            out = self.plan(state, selectors, **options)
            execute(out)
            return out
        with resource_lock(run.paths) as lock:
            # What was read before the lock may be stale: a concurrent run on this resource may just have set the
            # compute modes. The host is read under the lock, once.
            run.own_lock = lock.path in lock.created  # this run's own lock file: no change of the host
            run.nvml.refresh()
            self._observe(state, shm=shm, remove_logs=remove_logs)
            try:
                out = self.plan(state, selectors, **options)
            except MpsError:
                lock.discard()  # a refused run leaves nothing behind, not even the lock it made
                raise
            out.warnings += orphan_warnings(self.view.orphans(), all_devices(self.view.gpus))
            execute(out)
            return out

    def _decide(self, state: str, wanted: t.Optional[Wanted]) -> 'DaemonOutcome':
        """Decide every action from the view; nothing is read or changed here."""
        run = self.run
        out = DaemonOutcome()
        out.warnings.extend(run.planned.warnings)
        seen = self.view.resource(run.paths.name)
        current = seen.liveness
        run.planned.own_pid = current.pid
        if current.conflict:
            raise MpsError('the MPS control daemon for %s: %s' % (run.paths.name, current.conflict), pid=current.pid)
        record = seen.record
        if seen.corrupt:
            out.warnings.append('the start record %s of %s is corrupt (%s): it is treated as missing and written anew' % (
                run.paths.started_file, run.paths.name, seen.corrupt))
        out.before = self.describe(current, record)
        if wanted is None:
            self._ensure_stopped(current, record, out)
            if state == 'absent':
                self.absent.purge(out)
        else:
            self._ensure_running(state, wanted, current, record, out)
        out.after = {'state': state} if wanted is None else dict(wanted.record(), state='running')
        if run.planned.compute_mode_note and wanted is not None:
            out.notes.append('compute mode ' + run.planned.compute_mode_note)
            out.before['compute_mode'] = out.after['compute_mode'] = 'not applicable (MIG device)'
        self.devices.report_gone(record, wanted, out)
        if out.selinux is not None:
            out.before['selinux_type'] = out.selinux['before']
            out.after['selinux_type'] = out.selinux['after']
        return out

    def _ensure_stopped(self, current: Liveness, record: t.Optional[StartRecord], out: Outcome) -> None:
        run = self.run
        if current.running:
            self.clients.plan(current, out, 'the stop')
            self.actions.stop(current, record, out)
        elif current.stale:
            out.warnings.append('the MPS control daemon for %s was not running but left files behind (%s); cleaned up' % (
                run.paths.name, ', '.join(current.leftovers)))
            self.actions.clean_stale(out, record)
            self.actions.release(record, out)
        if run.supervisor == 'systemd' and run.systemctl is not None:
            self.unit_files.stop_unit(out)
            if not run.planned.enabled:
                # Stopping never enables a unit; it disables one when asked to.
                self.unit_files.apply_enabled(out, enabled=False)

    def _ensure_running(self, state: str, wanted: Wanted, current: Liveness, record: t.Optional[StartRecord],
                        out: Outcome) -> None:
        run = self.run
        actions = self.actions
        out.devices = [gpu.summary() for gpu in wanted.devices]
        v3_file = run.config.v3_config
        if wanted.v3 is None and self.view.paths.lexists(v3_file):
            # the file of a resource that ran MPS v3 and no longer does: nothing applies it any more
            out.act('remove %s' % v3_file, lambda: remove(v3_file), reason='the resource no longer runs MPS v3')
        actions.repair_log_mode(out)
        if self.view.paths.isdir(run.paths.pipe_dir):
            actions.label(out)
        # Observed, then decided (.decide, no I/O): keep, restart, recover or start.
        action, why = decide_run(state, current, differences(run, self.unit_files, wanted, current, record), run.host.restart_reason)
        if wanted.shm and action != 'keep':
            check_shm_start(run, wanted)
        if action == 'keep':
            # Healthy and as wanted: only the compute mode may have drifted (it resets at reboot).
            replaced = self.view.replaced.get(current.pid) if current.pid else None
            if replaced:
                out.warnings.append(replaced_binary_warning(run.paths.name, current.pid, replaced))
            claims = self.devices.foreign()[0]
            for gpu in wanted.devices:
                if gpu.uuid in claims:
                    out.warnings.append('%s of %s is also served by another MPS control daemon, %s: stop one of '
                                        'them' % (gpu.label, run.paths.name, claims[gpu.uuid].describe()))
            self.devices.set_compute_modes(wanted.devices, wanted.compute_mode, out)
            if run.supervisor == 'systemd':
                self.unit_files.install(wanted, out)
            if record is None or (run.supervisor == 'systemd' and record.pid != current.pid):
                # systemd brought the daemon back from the environment file this module wrote, as asked
                # for: at boot /run lost the record, after a crash the record names the dead process.
                # Record the running daemon; no restart.
                out.act('write %s for the daemon systemd started' % run.paths.started_file,
                        lambda: record_start(run, wanted, current.pid, out))
                out.pid = current.pid
                return
            out.pid = current.pid
            out.started_at = record.started_at
            return
        if action == 'restart' and run.host.split_restart:
            self._split_restart(wanted, current, record, why, out)
            return
        if action == 'restart':
            self.clients.plan(current, out, 'the restart (%s)' % why)
            out.restarting = True
            out.restart_why = why
            out.act('restart: %s' % why)
            handover = record is not None and (record.supervisor or wanted.supervisor) != wanted.supervisor
            if wanted.supervisor == 'systemd' and not handover:
                actions.start(wanted, out, restart=True)
            else:
                actions.stop_process(current, record, out)
                actions.start(wanted, out, restart=False)
            self.devices.release_dropped(wanted, record, out)
            return
        if action == 'recover':
            out.warnings.append('recovered the MPS control daemon for %s: %s' % (run.paths.name, why))
            actions.clean_stale(out, record)
        actions.start(wanted, out, restart=False)

    def _split_restart(self, wanted: Wanted, current: Liveness, record: t.Optional[StartRecord], why: str,
                       out: 'DaemonOutcome') -> None:
        """A restart a host plan splits, decided once: its stop half in ``out.first`` (every stop of the plan comes before
        any start: GPU moves, swaps, renames in one run), its start half in ``out``, planned as the stop leaves the host."""
        first = DaemonOutcome(before=dict(out.before))
        self.clients.plan(current, first, 'the restart (%s)' % why)
        first.act('restart: %s' % why, kind='restart')
        first.restarting = True
        self.actions.stop(current, record, first)
        if self.run.supervisor == 'systemd':
            self.unit_files.stop_unit(first)
        out.first = first
        out.restarting = True
        out.restart_why = why
        out.clients = first.clients
        self.actions.start(wanted, out, restart=False)


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
            container: t.Optional[t.Dict[str, t.Any]] = with_engine(container_view(paths, params['container_root'], shm=params['shm']))
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

    def manager(self, nvml: Nvml, *, check_mode: bool, host: t.Optional[HostContext] = None) -> 'DaemonManager':
        return DaemonManager(self.paths, self.config, self.daemon, nvml, self.supervisor, check_mode=check_mode, systemctl=self.systemctl,
                             nvidia_smi=self.nvidia_smi, unit_dir=self.unit_dir, host=host, busy=self.busy,
                             busy_timeout=self.busy_timeout, selinux_type=self.selinux_type, unit_before=self.unit_before,
                             unit_after=self.unit_after)
