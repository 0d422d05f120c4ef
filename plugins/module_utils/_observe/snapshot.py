# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one run observes of the host, once, before it decides anything.

A host plan asks the same questions from several places - a resource's limits, its daemon, the stop half of a restart,
the files around the daemons, the result - and each used to read the host again: a no-op of two resources inspected the
daemons a dozen times and read each persisted limits file three times. :func:`observe` reads it all once, under the
host lock: every resource under the root (daemon state, start record), ``/proc/locks`` once for all of them, the one
``/proc`` scan of the host's control daemons, and the files the plan compares with what it wants (each resource's
persisted limits and environment file, the health check, log rotation and local facts files). The plan's parts take
their answers from it; only a run that changed something observes again, for its result.

A file the plan asks :class:`HostSeen` for that was not observed is read then, and named in ``unobserved``: a unit test
holds that list empty for every scenario, so that deciding stays a function of the observation.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass, field

from .._gpus import Gpu
from .._io import read_text
from .._proc import child_pids, process_uid, read_locks
from .._protocol.state import read_state
from .._resource.layout import ResourcePaths, resource_paths
from .._resource.record import StartRecord, read_record
from .._supervisor.liveness import DaemonState, inspect
from .scan import ForeignDaemon, foreign_daemons, scan_resources


@dataclass(frozen=True)
class ResourceSeen:
    """One resource as the run found it: its daemon's state (pipe directory, lock, pid file, socket) and start record."""

    state: DaemonState
    record: t.Optional[StartRecord]


def file_mode(path: str) -> t.Optional[int]:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return None


@dataclass
class HostSeen:
    """The host as one run observed it."""

    resources: t.Dict[str, ResourceSeen] = field(default_factory=dict)
    # The one /proc scan: the host's control daemons outside the root (GPUs known, unreadable), the root's orphans among
    # the first (_observe.scan.foreign_daemons).
    daemons: t.Tuple[t.List[ForeignDaemon], t.List[ForeignDaemon]] = field(default_factory=lambda: ([], []))
    texts: t.Dict[str, t.Optional[str]] = field(default_factory=dict)
    modes: t.Dict[str, t.Optional[int]] = field(default_factory=dict)
    # Each running daemon's limits as its one control batch read them (_protocol.state.DaemonReadout), by resource, with the
    # (device count, pid) they were read for.
    readouts: t.Dict[str, t.Tuple[t.Tuple[int, t.Optional[int]], t.Any]] = field(default_factory=dict)
    # The clients connected to each running daemon's servers, from the same batch, by resource.
    clients: t.Dict[str, t.Tuple[t.Optional[int], t.List[t.Dict[str, t.Any]]]] = field(default_factory=dict)
    # orphans=stop: the MPS servers of each orphaned control daemon of the root, by its pid.
    orphan_servers: t.Dict[int, t.List[int]] = field(default_factory=dict)
    # Directory listings (sorted; None: not a readable directory).
    listings: t.Dict[str, t.Optional[t.List[str]]] = field(default_factory=dict)
    # Files the plan read that observe had not: read when asked, and named here (a test holds it empty).
    unobserved: t.List[str] = field(default_factory=list)
    # Whether a control binary's help text lists a command, by (binary, command): read in the observe stage only where a
    # resource wants a feature that older binaries lack and no daemon of it runs (client priority, SM partitions); and
    # whether a daemon without a start record was started with -S, by (pid, '-S') - its arguments, read once.
    offered: t.Dict[t.Tuple[str, str], t.Optional[bool]] = field(default_factory=dict)

    def text(self, path: str) -> t.Optional[str]:
        """The file's text as observed (None: absent or unreadable)."""
        if path not in self.texts:
            self.unobserved.append(path)
            self.texts[path] = read_text(path)
        return self.texts[path]

    def listdir(self, path: str) -> t.List[str]:
        """As os.listdir (OSError when it is no readable directory), as observed."""
        if path not in self.listings:
            self.unobserved.append(path + '/')
            self.listings[path] = _listing(path)
        found = self.listings[path]
        if found is None:
            raise OSError('%s is not a readable directory' % path)
        return list(found)

    def mode(self, path: str) -> t.Optional[int]:
        if path not in self.modes:
            self.unobserved.append(path)
            self.modes[path] = file_mode(path)
        return self.modes[path]

    def read_daemon(self, name: str, query: t.Callable[[t.List[str]], t.Any], ordinals: int, pid: int,
                    partitions: bool = False) -> t.Any:
        """Observe a running daemon (``pid``) of resource ``name`` in one control batch: its defaults for ``ordinals``
        devices, its servers with their limits and clients (:func:`clients_of`), its SM partitions where ``partitions``."""
        readout = read_state(query, ordinals, child_pids(pid), partitions)
        self.readouts[name] = ((ordinals, pid), readout)
        self.clients[name] = (pid, clients_of(readout))
        return readout

    def live(self, exclude: t.Collection[str] = ()) -> t.Dict[str, t.Tuple[DaemonState, StartRecord]]:
        """As :func:`.scan.live_daemons`: the root's other resources whose daemon runs (or may), with their records."""
        return {name: (seen.state, seen.record) for name, seen in sorted(self.resources.items())
                if name not in exclude and seen.record is not None and (seen.state.running or seen.state.conflict)}


def _listing(path: str) -> t.Optional[t.List[str]]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def clients_of(readout: t.Any) -> t.List[t.Dict[str, t.Any]]:
    """The clients of a daemon's servers as one control batch listed them (_protocol.state.DaemonReadout)."""
    return [{'pid': client, 'uid': process_uid(client), 'server': server.pid}
            for server in readout.servers for client in server.clients]


def observe(paths: t.Iterable[ResourcePaths], locks: t.Optional[t.List[str]] = None) -> t.Dict[str, ResourceSeen]:
    """Each resource of ``paths``, read once: name -> what was found (``locks``: ``/proc/locks``, read once for all)."""
    paths = list(paths)
    if locks is None and paths:
        locks = read_locks()
    return {item.name: ResourceSeen(inspect(item, locks), read_record(item)) for item in paths}


def observe_host(root: str, paths: t.Iterable[ResourcePaths], gpus: t.Sequence[Gpu], files: t.Iterable[str],
                 dirs: t.Iterable[str] = ()) -> HostSeen:
    """The host, once: ``paths`` and every other resource under ``root``, the /proc scan, the texts of ``files``, and
    the listings of ``dirs`` and of every resource's directories."""
    listed = {item.name: item for item in paths}
    for name in scan_resources(root):
        if name not in listed:
            listed[name] = resource_paths(root, name, check_length=False)
    seen = HostSeen(observe(listed.values()), foreign_daemons(None, gpus, outside=root))
    seen.listings[root] = _listing(root)
    # The root's directories (the first level of nested names, and whatever else is there), every resource's own.
    wanted = [os.path.join(root, name) for name in seen.listings[root] or [] if os.path.isdir(os.path.join(root, name))]
    wanted += list(dirs)
    for item in listed.values():
        wanted += [item.resource_dir, item.pipe_dir, item.log_dir, os.path.dirname(item.resource_dir)]
    for path in wanted:
        if path not in seen.listings:
            seen.listings[path] = _listing(path)
    for path in files:
        seen.texts[path] = read_text(path)
        seen.modes[path] = file_mode(path) if seen.texts[path] is not None else None
    return seen
