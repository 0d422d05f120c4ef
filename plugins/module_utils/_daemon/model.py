# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run of a resource's daemon is asked for, what a host plan tells it, and what the run leaves."""

from __future__ import annotations

import datetime
import typing as t
from dataclasses import dataclass, field

from .._errors import MpsError
from .._options import DEFAULT_BUSY_TIMEOUT
from .._gpus import Gpu
from .._outcome import Outcome
from .._resource.layout import ConfigPaths, ResourcePaths
from .._resource.record import StartRecord, write_record
from .._supervisor.unit import UNIT_DIR, instance_unit


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
    # Started with -S: the limits it is started with (persisted, or a host plan's) create static SM partitions.
    static: bool = False
    # A v3 resource (_v3.spec.V3Spec): started with -p 3 -a <its file>; None: the legacy protocol.
    v3: t.Optional[t.Any] = None

    def record(self) -> t.Dict[str, t.Any]:
        found = {
            'devices': [gpu.uuid for gpu in self.devices],
            'multiuser': self.multiuser,
            'supervisor': self.supervisor,
            'shm': self.shm,
        }
        if self.v3 is not None:
            found.update(protocol=3, **self.v3.identity())
        return found


@dataclass
class HostContext:
    """What a host plan tells each resource's manager: the resources it plans itself, what it removes, what it keeps."""

    # Resources of the same root whose GPUs do not count as taken: mps_host checks that its listed resources share
    # no GPU and stops removed and restarted daemons before it starts any.
    ignore_owners: t.FrozenSet[str] = frozenset()
    would_remove: t.List[str] = field(default_factory=list)
    # GPUs that a listed resource keeps in MPS use: a stop leaves their compute mode as it is.
    keep_modes: t.FrozenSet[str] = frozenset()
    restart_reason: str = ''
    # Orphaned daemons of the root the same plan ends first (orphans=stop): their GPUs are not taken.
    ending_pids: t.FrozenSet[int] = frozenset()
    # The same plan mounts <root>/shm (and persists it) before any daemon starts: not mounted yet is no refusal.
    shm_planned: bool = False
    # The limits the same plan persists before the start, and the device order it writes their commands file in.
    limits: t.Optional[t.Any] = None
    limits_replay_for: t.Optional[t.List[str]] = None
    limits_planned: bool = False
    # The same plan starts daemons of other resources under systemd: the template unit stays whatever is removed.
    keep_template: bool = False
    # The plan runs every stop before any start: a restart is decided once, its stop half apart (DaemonOutcome.first).
    split_restart: bool = False
    # The run's one view of the host (_observe.view.HostView), sealed: every decision reads it and nothing else.
    view: t.Optional[t.Any] = None


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
    # The stop half of a restart a host plan splits (HostContext.split_restart); this outcome is then its start half.
    first: t.Optional['DaemonOutcome'] = None


@dataclass
class Planned:
    """What one decision about a daemon has planned so far, which its later steps look at (made anew by each plan)."""

    # What state=absent removes, or in check mode would: a directory emptied by it counts as empty. A host plan shares
    # one list between its resources (HostContext.would_remove), so a directory emptied by several counts as empty too.
    would_remove: t.List[str] = field(default_factory=list)
    # Warnings found while the request was resolved, reported with the decision.
    warnings: t.List[str] = field(default_factory=list)
    # What the request asks of a stop: reset the compute modes (compute_mode != unchanged), keep the unit enabled,
    # remove the logs with the resource.
    reset_on_stop: bool = True
    enabled: bool = True
    remove_logs: bool = False
    # The resource's lock file was there before this run (state=absent removes it as a change of the host).
    lock_existed: bool = False
    # The pid of the resource's own daemon, as the view read it.
    own_pid: t.Optional[int] = None
    # Why the compute mode asked for is not applied (a MIG device); shown in the diff and the result.
    compute_mode_note: str = ''
    # Steps planned once per decision: the pipe directory's SELinux label, the unit's stop, its disabling.
    label: bool = False
    unit_stop: bool = False
    disable: bool = False
    # The stop this decision plans ends connected clients (busy=terminate with clients connected).
    ends_clients: bool = False


@dataclass
class DaemonRun:
    """One run of one resource's daemon: what it was given. Every part of the decision holds it and reads it; what
    the decision has planned so far is in ``planned``."""

    paths: ResourcePaths
    config: ConfigPaths
    daemon: t.Any  # _supervisor.process.Daemon
    nvml: t.Any  # _gpus.Nvml
    supervisor: str
    check_mode: bool
    systemctl: t.Optional[t.Any] = None  # _supervisor.unit.Systemctl
    nvidia_smi: t.Optional[str] = None
    unit_dir: str = UNIT_DIR
    host: HostContext = field(default_factory=HostContext)
    # What to do about clients connected to a daemon that must stop (a restart, a stop, absent).
    busy: str = 'refuse'
    busy_timeout: int = DEFAULT_BUSY_TIMEOUT
    # The SELinux type of the pipe directory ('' leaves labels alone).
    selinux_type: str = ''
    # Units the daemon's unit is ordered before and after (supervisor=systemd).
    unit_before: t.Tuple[str, ...] = ()
    unit_after: t.Tuple[str, ...] = ()
    # The resource's lock file was made by this run's own lock (mps_daemon): no change of the host.
    own_lock: bool = False
    # Made anew by each plan; until then, one that shares the host plan's list of removals (HostContext.would_remove).
    planned: t.Optional[Planned] = None

    def __post_init__(self) -> None:
        if self.planned is None:
            self.planned = Planned(would_remove=self.host.would_remove)

    @property
    def unit(self) -> str:
        return instance_unit(self.config.instance)

    @property
    def view(self) -> t.Any:
        """The run's sealed view of the host (_observe.view.HostView): every decision of this run reads it."""
        if self.host.view is None:
            raise MpsError('internal error: %s was decided without a view of the host' % self.paths.name)
        return self.host.view


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds').replace('+00:00', 'Z')


def record_start(run: DaemonRun, wanted: Wanted, pid: t.Optional[int], out: t.Any) -> None:
    """Record what the daemon (pid) was started with; called when that is known (planning or applying)."""
    record = StartRecord(devices=[gpu.uuid for gpu in wanted.devices], multiuser=wanted.multiuser, supervisor=wanted.supervisor,
                         shm=wanted.shm, pid=pid, started_at=_now(), compute_mode=wanted.compute_mode,
                         control_binary=run.daemon.binary,
                         driver_version=getattr(wanted.devices[0], 'driver_version', None) if wanted.devices else None,
                         static_partitioning=wanted.static)
    if wanted.v3 is not None:
        record.protocol, record.server, record.uid = 3, wanted.v3.server, wanted.v3.owner
    write_record(run.paths, record)
    out.started_at = record.started_at
    out.pid = pid
