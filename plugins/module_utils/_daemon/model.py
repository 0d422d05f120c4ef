# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a run of a resource's daemon is asked for, what a host plan tells it, and what the run leaves."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._gpus import Gpu
from .._outcome import Outcome


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
