# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host as one run read it: one value, read once by one reader (:mod:`.reader`), then sealed.

Every decision of every module is a function of a request and of this view. It holds, per resource, its daemon (lock
holder, process, start record), its files and directories with their types and texts, its unit, the limits, servers
and clients its daemon reported; per host the GPUs, every MPS control daemon process classified as this root's, another
root's or tool's, or an orphan of this root, the files around the daemons, the mounts, what the control binary offers.

Once sealed a view answers from memory only: a question it was not read for is an internal error (:class:`ViewMiss`),
never a read, so a decision can neither depend on more than the run observed nor see the host change under it.
"""

from __future__ import annotations

import json
import typing as t
from dataclasses import dataclass, field

from .._errors import MpsError
from .._gpus import Gpu
from .._resource.layout import ResourcePaths
from .._resource.record import StartRecord
from .._supervisor.liveness import Liveness
from .paths import PathView, ViewMiss

CORRUPT = 'corrupt'


@dataclass
class ResourceView:
    """One resource as the run found it: its daemon's state (lock, pid file, process, socket) and its start record."""

    paths: ResourcePaths
    liveness: Liveness
    # the record's problem, raised where a decision reads the record: a directory where it belongs, an unreadable file
    problem: t.Optional[MpsError] = None
    _record: t.Optional[StartRecord] = None
    # why the record is no record although a file is there (not JSON, not a mapping): said, and treated as missing
    corrupt: str = ''

    @property
    def record(self) -> t.Optional[StartRecord]:
        if self.problem is not None:
            raise self.problem
        return self._record


def parse_record(text: t.Optional[str]) -> t.Tuple[t.Optional[StartRecord], str]:
    """(the start record in ``text``, why the text is no record); (None, '') for no text."""
    if text is None:
        return None, ''
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, 'not JSON (%s)' % exc
    record = StartRecord.from_data(data)
    if record is None:
        return None, 'not a JSON object'
    return record, ''


@dataclass
class HostView:
    """The host as one run observed it; :meth:`seal`\\ ed before anything is decided."""

    gpus: t.List[Gpu] = field(default_factory=list)
    paths: PathView = field(default_factory=lambda: PathView({}))
    resources: t.Dict[str, ResourceView] = field(default_factory=dict)
    # The one /proc scan: the host's control daemons outside the root (GPUs known, unreadable), and the root's orphans among
    # the first (_observe.scan.foreign_daemons).
    daemons: t.Tuple[t.List[t.Any], t.List[t.Any]] = field(default_factory=lambda: ([], []))
    # Each running daemon's state as its one control batch read it (_protocol.batch.DaemonReadout), by resource, with the
    # (device count, pid) it was read for.
    readouts: t.Dict[str, t.Tuple[t.Tuple[int, t.Optional[int]], t.Any]] = field(default_factory=dict)
    # The clients connected to each running daemon's servers, from the same batch, by resource: (daemon pid, clients).
    clients: t.Dict[str, t.Tuple[t.Optional[int], t.List[t.Dict[str, t.Any]]]] = field(default_factory=dict)
    # The MPS servers of each orphaned control daemon of the root, by its pid.
    orphan_servers: t.Dict[int, t.List[int]] = field(default_factory=dict)
    # systemd: unit -> (active, enabled), from one systemctl show
    units: t.Dict[str, t.Tuple[bool, bool]] = field(default_factory=dict)
    # Whether a control binary's help text lists a command, by (binary, command) (None: unreadable help); read only where
    # a resource wants a feature that older binaries lack and no daemon of it answered for it.
    offered: t.Dict[t.Tuple[str, str], t.Optional[bool]] = field(default_factory=dict)
    # Per running daemon pid: which /dev/shm it sees (the resource's tmpfs, the host's, None), its CUDA_VISIBLE_DEVICES
    # (a daemon without a start record), whether it was started with -S (likewise).
    dev_shm: t.Dict[int, t.Optional[str]] = field(default_factory=dict)
    environ_uuids: t.Dict[int, t.Optional[t.List[str]]] = field(default_factory=dict)
    static_args: t.Dict[int, t.Optional[bool]] = field(default_factory=dict)
    # Per running daemon pid: the MPS protocol it was started with (2, 3; None: unreadable), read before its control batch.
    protocols: t.Dict[int, t.Optional[int]] = field(default_factory=dict)
    # Each running v3 daemon's server as its lists showed it (_v3.readout.V3Readout), by resource: (pid, readout).
    v3: t.Dict[str, t.Tuple[int, t.Any]] = field(default_factory=dict)
    # Per running daemon pid: the path of its program when that file was replaced or removed since it started, '' when it
    # was not, None when unreadable.
    replaced: t.Dict[int, t.Optional[str]] = field(default_factory=dict)
    # mps_info: whose each client process is (_attribution.attribute), by pid, read with its daemon's servers.
    owners: t.Dict[int, t.Dict[str, t.Any]] = field(default_factory=dict)
    # The mount table as this process sees it (None: not read: no decision of the run needs it), and the real path of
    # each path a decision compares with its mount points (the kernel names mount points by their real path).
    mountinfo: t.Optional[str] = None
    realpaths: t.Dict[str, str] = field(default_factory=dict)
    # SELinux: enabled (None: not asked), and the type of each path whose label a decision compares.
    selinux: t.Optional[bool] = None
    labels: t.Dict[str, t.Optional[str]] = field(default_factory=dict)
    # mps_info: why a running daemon could not be asked (it is reported, not raised), and each server's uid.
    failures: t.Dict[str, str] = field(default_factory=dict)
    uids: t.Dict[int, t.Optional[int]] = field(default_factory=dict)
    # Whether a daemon can be given <root>/shm as its /dev/shm here: '' yes, the reason when not; None: not tried.
    shm_namespace: t.Optional[str] = None
    sealed: bool = False

    def seal(self) -> 'HostView':
        self.sealed = True
        return self

    # --- files -----------------------------------------------------------------------------------------
    def text(self, path: str, what: str = 'a file') -> t.Optional[str]:
        """The file's text as read (None: absent); a directory there is refused naming ``what`` it should be."""
        return self.paths.text(path, what)

    def listdir(self, path: str) -> t.List[str]:
        return self.paths.listdir(path)

    def mode(self, path: str) -> t.Optional[int]:
        return self.paths.mode(path)

    # --- the rest ----------------------------------------------------------------------------------------
    def resource(self, name: str) -> ResourceView:
        found = self.resources.get(name)
        if found is None:
            raise ViewMiss('resource %s' % name)
        return found

    def unit(self, unit: str) -> t.Tuple[bool, bool]:
        """(active, enabled) of a systemd unit as read."""
        found = self.units.get(unit)
        if found is None:
            raise ViewMiss('systemd unit %s' % unit)
        return found

    def offers(self, binary: str, word: str) -> t.Optional[bool]:
        key = (binary, word)
        if key not in self.offered:
            raise ViewMiss('the help text of %s (for %s)' % (binary, word))
        return self.offered[key]

    def answered(self, table: t.Mapping[t.Any, t.Any], key: t.Any, what: str) -> t.Any:
        if key not in table:
            raise ViewMiss(what)
        return table[key]

    def mounts(self) -> str:
        if self.mountinfo is None:
            raise ViewMiss('the mount table')
        return self.mountinfo

    def realpath(self, path: str) -> str:
        if path not in self.realpaths:
            raise ViewMiss('the real path of %s' % path)
        return self.realpaths[path]

    def label(self, path: str) -> t.Optional[str]:
        if path not in self.labels:
            raise ViewMiss('the SELinux label of %s' % path)
        return self.labels[path]

    def live(self, exclude: t.Collection[str] = ()) -> t.Dict[str, t.Tuple[Liveness, StartRecord]]:
        """The root's resources whose daemon runs (or may: its evidence disagrees), with their records."""
        found = {}
        for name, seen in sorted(self.resources.items()):
            if name in exclude or not (seen.liveness.running or seen.liveness.conflict) or seen.problem is not None:
                continue
            if seen.record is not None:
                found[name] = (seen.liveness, seen.record)
        return found

    def orphans(self) -> t.List[t.Any]:
        """The orphaned control daemons of this root: their pipe directory no longer leads to them."""
        return [daemon for daemon in self.daemons[0] if daemon.orphan]
