# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of the host: every module reads what its decisions may look at here, once, into a :class:`HostView`.

:func:`read_host` reads the root (every resource under it, two levels deep, with its daemon's state and start record),
the config directory, the files each decision compares, and the host's control daemons from ``/proc``. The probes below
add what only some runs need - one control batch per running daemon, systemd's unit states, a binary's help text, a
daemon's ``/dev/shm`` and environment, SELinux labels - before the view is sealed.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass, field

from .._errors import DaemonProtocolError, MpsError
from .._gpus import Gpu
from .._io import ancestors
from .._proc import (child_pids, daemon_dev_shm, read_locks, read_mountinfo, replaced_binary, started_protocol, started_static,
                     uuids_from_environ)
from .._protocol.batch import read_batch
from .._resource.layout import OWN_ENTRIES, SHM_DIR, ConfigPaths, ResourcePaths, config_paths, resource_paths
from .._supervisor.liveness import LOCK_FILE, PIPE_DIR_FILES, inspect
from .paths import DIRECTORY, FILE, PathView, read_paths
from .scan import RESOURCE_MARKS, foreign_daemons, scan_config, scan_resources
from .view import HostView, ResourceView, parse_record

# What a resource's directory holds that this collection made (the lock every writer takes).
RESOURCE_LOCK = '.lock'
LOG_FILES = ('control.log', 'server.log')


@dataclass
class Wants:
    """Paths a decision may look at: files (read), directories (listed), others (type, mode and owner only)."""

    files: t.Set[str] = field(default_factory=set)
    dirs: t.Set[str] = field(default_factory=set)
    others: t.Set[str] = field(default_factory=set)
    mounts: bool = False

    def add(self, files: t.Iterable[t.Optional[str]] = (), dirs: t.Iterable[t.Optional[str]] = (),
            others: t.Iterable[t.Optional[str]] = ()) -> 'Wants':
        self.files.update(path for path in files if path)
        self.dirs.update(path for path in dirs if path)
        self.others.update(path for path in others if path)
        return self

    def merge(self, other: 'Wants') -> 'Wants':
        self.add(other.files, other.dirs, other.others)
        self.mounts = self.mounts or other.mounts
        return self


def resource_wants(paths: ResourcePaths, config: t.Optional[ConfigPaths] = None) -> Wants:
    """What a decision about one resource may look at: its directories and files, and its persisted files."""
    wants = Wants().add(
        files=[paths.started_file],
        dirs=[paths.root, paths.resource_dir, paths.pipe_dir, paths.log_dir, os.path.dirname(paths.resource_dir)],
        others=[os.path.join(paths.resource_dir, RESOURCE_LOCK)]
        + [os.path.join(paths.pipe_dir, name) for name in PIPE_DIR_FILES + (LOCK_FILE,)]
        + [os.path.join(paths.log_dir, name) for name in LOG_FILES] + ancestors(paths.pipe_dir))
    if config is not None:
        wants.add(files=[config.env_file, config.limits_json, config.limits_file, config.limits_env, config.v3_config], dirs=[config.config_dir])
    return wants


def read_root(root: str, mountinfo: t.Optional[str] = None) -> PathView:
    """The paths that tell which resources are under ``root`` (:func:`.scan.scan_resources`), two levels deep."""
    tree = read_paths(dirs=[root], others=[os.path.join(root, SHM_DIR), os.path.join(root, '.ready')], mountinfo=mountinfo)
    parents = [root]
    for _level in range(2):
        level = Wants()
        for parent in parents:
            try:
                names = tree.listdir(parent)
            except OSError:
                continue
            for name in names:
                child = os.path.join(parent, name)
                level.add(dirs=[child], others=[] if name in OWN_ENTRIES or name.startswith('.') else [
                    os.path.join(child, mark) for mark in RESOURCE_MARKS])
        tree = tree.merged(read_paths(level.files, level.dirs, level.others, mountinfo=mountinfo))
        parents = sorted(path for path in level.dirs if tree.isdir(path) and not tree.islink(path))
    return tree


def _unread(tree: PathView, wants: Wants) -> Wants:
    """What of ``wants`` the tree has not read yet (a file's text, a directory's entries, a path at all)."""
    def done(path: str, need: str) -> bool:
        if path not in tree:
            return False
        entry = tree.entry(path)
        if need == 'text':
            return entry.text is not None or (entry.target or entry.kind) != FILE
        if need == 'entries':
            return entry.entries is not None or (entry.target or entry.kind) != DIRECTORY
        return True
    return Wants().add([path for path in wants.files if not done(path, 'text')],
                       [path for path in wants.dirs if not done(path, 'entries')],
                       [path for path in wants.others if not done(path, '')])


def read_host(root: str, gpus: t.Sequence[Gpu], resources: t.Iterable[t.Tuple[ResourcePaths, t.Optional[ConfigPaths]]],
              wants: t.Optional[Wants] = None, *, with_logs: bool = False, config_dir: t.Optional[str] = None) -> HostView:
    """The host, once: every resource under ``root`` and those of ``resources`` (paths, config), their daemons' states and
    records, the /proc scan, and ``wants``. With ``config_dir``, every resource with files there too, and every resource's
    persisted files (a host's run, which removes what is no longer listed). Not sealed: the probes may add to it."""
    wants = wants or Wants()
    named = {paths.name: (paths, config) for paths, config in resources}
    view = HostView(list(gpus))
    view.mountinfo = read_mountinfo() if wants.mounts else None
    if wants.mounts:
        shm_dir = os.path.join(root, SHM_DIR)
        view.realpaths[shm_dir] = os.path.join(os.path.realpath(root), SHM_DIR)
    tree = read_root(root, view.mountinfo)
    found = scan_resources(tree, root, with_logs=with_logs)
    if config_dir is not None:
        tree = tree.merged(read_paths(dirs=[config_dir], mountinfo=view.mountinfo))
        found = sorted(set(found) | set(scan_config(tree, config_dir)))
    for name in found:
        if name not in named:
            named[name] = (resource_paths(root, name, check_length=False),
                           config_paths(config_dir, name) if config_dir is not None else None)
    every = Wants().merge(wants)
    for paths, config in named.values():
        every.merge(resource_wants(paths, config))
    rest = _unread(tree, every)
    view.paths = tree.merged(read_paths(rest.files, rest.dirs, rest.others, mountinfo=view.mountinfo))
    locks = read_locks() if named else None
    for name, (paths, _config) in sorted(named.items()):
        view.resources[name] = _resource_view(view, paths, locks)
    view.daemons = foreign_daemons(None, gpus, outside=root)
    return view


def _resource_view(view: HostView, paths: ResourcePaths, locks: t.Optional[t.List[str]]) -> ResourceView:
    state = inspect(paths, locks)
    try:
        record, corrupt = parse_record(view.text(paths.started_file, 'the start record of %s (a JSON file)' % paths.name))
    except MpsError as exc:
        return ResourceView(paths, state, problem=exc)
    return ResourceView(paths, state, None, record, corrupt)


# --- probes: what only some runs need, read before the view is sealed ---------------------------------------------
def read_daemon(view: HostView, name: str, query: t.Callable[[t.List[str]], t.Any], ordinals: int, pid: int, *,
                partitions: bool = False, servers: bool = True, client: t.Optional[t.Any] = None,
                config: t.Optional[t.Any] = None, server: str = '') -> t.Any:
    """A running daemon of resource ``name`` in one control batch: its defaults for ``ordinals`` devices, its servers with
    their limits and clients (``servers``: every child asked about; else the server list alone), its SM partitions
    where ``partitions``.

    A daemon started with MPS protocol 3 is refused here, before any command is sent: the batch is legacy words, which a
    v3 daemon does not take as such (shared/mps-v3-reference.md 1.1), and every module reads a running daemon through
    this one function before it decides anything - unless its start record says this collection started it with protocol
    3 (a v3 resource): then it is read with v3 words through ``client`` (its server's lists, _v3.control.read_v3), and a
    caller that has no ``client`` (a module that manages no v3 resource) is refused. A record that says protocol 3 over a
    daemon started with the legacy protocol is refused the same way. Without a start record (``/run`` lost it at a boot
    while systemd started the daemon again; a start that failed after the daemon came up) a daemon started with protocol 3
    is the resource's own v3 daemon where ``server`` (the listed entry's) or the environment file this collection wrote
    for it (``config``: MPS_V3_SERVER) names its server."""
    if pid not in view.protocols:
        view.protocols[pid] = started_protocol(pid)
    seen = view.resources.get(name)
    record = seen.record if seen is not None else None
    if record is not None and record.protocol == 3:
        return _read_v3(view, name, pid, record.server, client)
    if record is None and view.protocols[pid] == 3:
        server = server or env_server(view, config)
        if server:
            return _read_v3(view, name, pid, server, client)
    if view.protocols[pid] == 3:
        raise DaemonProtocolError(
            'the MPS control daemon of %s (pid %d) was started with MPS protocol 3 (MPS v3: -p 3 or CUDA_MPS_PROTOCOL_VERSION=3), '
            'and this resource is managed with the legacy protocol: it was neither asked nor changed. Stop it with '
            '"nvidia-cuda-mps-control -q" with CUDA_MPS_PIPE_DIRECTORY set to its pipe directory (or by whatever started '
            'it), then run again' % (name, pid), resource=name, pid=pid, protocol=3)
    readout = read_batch(query, ordinals, child_pids(pid) if servers else [], partitions=partitions)
    view.readouts[name] = ((ordinals, pid), readout)
    view.clients[name] = (pid, clients_of(readout))
    return readout


def env_server(view: HostView, config: t.Optional[t.Any]) -> str:
    """The v3 server the resource's environment file (supervisor=systemd) names; '' where it names none or was not read."""
    if config is None:
        return ''
    from .._supervisor.unit import parse_env  # pylint: disable=import-outside-toplevel
    try:
        return parse_env(view.text(config.env_file) or '').get('MPS_V3_SERVER', '')
    except (MpsError, KeyError):
        return ''


def _read_v3(view: HostView, name: str, pid: int, server: t.Optional[str], client: t.Optional[t.Any]) -> t.Any:
    if view.protocols[pid] == 2:
        raise DaemonProtocolError(
            'the start record of %s says its daemon runs MPS v3 (server %s), but the daemon running there (pid %d) was started '
            'with the legacy protocol: it was neither asked nor changed. Stop it by whatever started it, then run '
            'again' % (name, server, pid), resource=name, pid=pid, protocol=2)
    if client is None or not server:
        raise DaemonProtocolError(
            'the MPS control daemon of %s (pid %d) runs MPS v3 (server %s), which this module does not manage: manage the '
            'resource with gpufleet.mps.mps_host (protocol: 3 in its entry)' % (name, pid, server),
            resource=name, pid=pid, protocol=3)
    from .._proc import process_uid  # pylint: disable=import-outside-toplevel
    from .._v3.control import read_v3  # pylint: disable=import-outside-toplevel
    readout = read_v3(client, server)
    view.v3[name] = (pid, readout)
    view.clients[name] = (pid, [{'pid': found, 'uid': process_uid(found), 'server': server, 'namespace': namespace}
                                for found, namespace in readout.clients])
    return readout


def clients_of(readout: t.Any) -> t.List[t.Dict[str, t.Any]]:
    """The clients of a daemon's servers as one control batch listed them (_protocol.batch.DaemonReadout)."""
    from .._proc import process_uid  # pylint: disable=import-outside-toplevel
    return [{'pid': client, 'uid': process_uid(client), 'server': server.pid}
            for server in readout.servers for client in server.clients]


def read_process(view: HostView, pid: int, shm_dir: t.Optional[str], *, record_known: bool) -> None:
    """What a running daemon's process shows: its /dev/shm (``shm_dir``: the tmpfs to compare with, where it exists; None:
    not asked), the MPS protocol it was started with, whether its program was replaced since, and - without a start record -
    its CUDA_VISIBLE_DEVICES and whether it was started with -S."""
    if pid not in view.protocols:
        view.protocols[pid] = started_protocol(pid)
    if pid not in view.replaced:
        view.replaced[pid] = replaced_binary(pid)
    if shm_dir is not None and pid not in view.dev_shm:
        view.dev_shm[pid] = daemon_dev_shm(pid, shm_dir) if view.paths.isdir(shm_dir) else None
    if not record_known:
        if pid not in view.environ_uuids:
            view.environ_uuids[pid] = uuids_from_environ(pid)
        if pid not in view.static_args:
            view.static_args[pid] = started_static(pid)


def read_units(view: HostView, systemctl: t.Any, units: t.Sequence[str]) -> None:
    """Each unit's (active, enabled) from ONE ``systemctl show``; a unit it could not say is asked on its own."""
    missing = [unit for unit in dict.fromkeys(units) if unit not in view.units]
    if not missing or systemctl is None:
        return
    found = systemctl.states(missing)
    for unit in missing:
        view.units[unit] = found[unit] if unit in found else (systemctl.is_active(unit), systemctl.is_enabled(unit))


# Asked of the binary for each v3 resource: whether the help of -p 3 -h lists the module server (read once per binary).
V3_HELP_WORD = 'v3:server'


def read_help(view: HostView, daemon: t.Any, word: str) -> t.Optional[bool]:
    """Whether ``daemon``'s binary lists ``word`` in its help text (read once per run and binary)."""
    key = (daemon.binary, word)
    if key not in view.offered:
        # 'v3:<word>': the word in the help of -p 3 -h (a module of MPS v3)
        view.offered[key] = daemon.offers(word[3:], v3=True) if word.startswith('v3:') else daemon.offers(word)
    return view.offered[key]


def read_labels(view: HostView, paths: t.Iterable[str]) -> None:
    """SELinux: whether it is enabled, and the type of each path (None for a path that does not exist)."""
    from .._selinux import context_of, enabled, type_of  # pylint: disable=import-outside-toplevel
    if view.selinux is None:
        view.selinux = enabled()
    if not view.selinux:
        return
    for path in paths:
        if path not in view.labels:
            view.labels[path] = type_of(context_of(path)) if os.path.lexists(path) else None


def read_orphan_servers(view: HostView) -> None:
    """The MPS servers of each orphaned control daemon of the root (ending it ends them: busy decides)."""
    for daemon in view.orphans():
        view.orphan_servers.setdefault(daemon.pid, child_pids(daemon.pid))
