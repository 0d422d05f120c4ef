# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which resources a host has: under a root (pipe directories, start records) and in a config directory."""

from __future__ import annotations

import os
import re
import typing as t
from dataclasses import dataclass

from .._gpus import Gpu
from .._proc import control_daemons, same_directory
from .._supervisor.liveness import DEFAULT_PIPE_DIR, read_pid_file
from .._resource.layout import OWN_ENTRIES, SHM_DIR, is_valid_name, systemd_instance
from .._resource.record import StartRecord
from .._selectors import visible_gpus


# What makes a directory under the root a resource's: its pipe directory or start record (or, for a teardown that
# removes logs too, its log directory alone: a pruned resource's).
RESOURCE_MARKS = ('pipe', '.started', 'log')


def scan_resources(view: t.Any, root: str, *, with_logs: bool = False) -> t.List[str]:
    """Names of the resources under ``root`` (as ``view``, a :class:`.paths.PathView`, read it): a directory that has a pipe
    directory or a ``.started`` record (or, ``with_logs``, only its log directory left), at the first level and - nested
    names, ``example.com/infer`` - inside every directory of the first level, a resource's own included."""
    names = []
    try:
        first = view.listdir(root)
    except OSError:
        return names
    for top in first:
        top_dir = os.path.join(root, top)
        if top.startswith('.') or top == SHM_DIR or view.islink(top_dir) or not view.isdir(top_dir):
            continue
        if _is_resource_dir(view, top_dir, with_logs=with_logs):
            names.append(top)
        try:
            second = view.listdir(top_dir)
        except OSError:
            continue
        for sub in second:
            sub_dir = os.path.join(top_dir, sub)
            if sub in OWN_ENTRIES or sub.startswith('.') or view.islink(sub_dir) or not view.isdir(sub_dir):
                continue
            if _is_resource_dir(view, sub_dir, with_logs=with_logs):
                names.append('%s/%s' % (top, sub))
    return [name for name in names if is_valid_name(name)]


def _is_resource_dir(view: t.Any, path: str, *, with_logs: bool = False) -> bool:
    log = os.path.join(path, 'log')
    return (view.isdir(os.path.join(path, 'pipe')) or view.lexists(os.path.join(path, '.started'))
            or with_logs and view.isdir(log) and not view.islink(log))


def resource_name(instance: str) -> t.Optional[str]:
    """The resource name a systemd instance name was escaped from (:func:`systemd_instance` undone); None if it is none."""
    out = bytearray()
    pos = 0
    while pos < len(instance):
        char = instance[pos]
        if char == '-':
            out += b'/'
        elif char == '\\' and re.fullmatch(r'\\x[0-9a-f]{2}', instance[pos:pos + 4]):
            out.append(int(instance[pos + 2:pos + 4], 16))
            pos += 3
        else:
            out += char.encode('utf-8')
        pos += 1
    name = out.decode('utf-8', 'replace')
    return name if is_valid_name(name) and systemd_instance(name) == instance else None


# The per-resource files in the config directory, by suffix (the instance name before it).
CONFIG_SUFFIXES = ('.env', '.limits.json', '.limits-env', '.limits', '.mps.toml')


def scan_config(view: t.Any, config_dir: str) -> t.List[str]:
    """Names of the resources that have files of this collection in ``config_dir`` (as ``view`` listed it)."""
    try:
        entries = view.listdir(config_dir)
    except OSError:
        return []
    names = set()
    for entry in entries:
        for suffix in CONFIG_SUFFIXES:
            if entry.endswith(suffix):
                name = resource_name(entry[:-len(suffix)])
                if name:
                    names.add(name)
                break
    return sorted(names)


def gpu_claims(records: t.Mapping[str, StartRecord]) -> t.Dict[str, t.List[str]]:
    """GPU UUID -> the resources whose records name it, sorted."""
    claims: t.Dict[str, t.List[str]] = {}
    for name, record in sorted(records.items()):
        for uuid in record.devices:
            claims.setdefault(uuid, []).append(name)
    return claims


@dataclass
class ForeignDaemon:
    """An MPS control daemon on the host that does not belong to the resource asking: its pid, pipe dir, GPUs."""

    pid: int
    pipe_dir: t.Optional[str]
    uid: t.Optional[int]
    uuids: t.List[str]
    # A daemon of this root that its pipe directory no longer names (deleted under it, or a second one started there).
    orphan: bool = False

    def describe(self) -> str:
        if self.orphan:
            return ('pid %d, an orphaned daemon of this root: its pipe directory %s no longer leads to it (deleted under the '
                    'running daemon?), so quit cannot reach it - end it with kill %d' % (self.pid, self.pipe_dir, self.pid))
        return 'pid %d (pipe directory %s, uid %s)' % (self.pid, self.pipe_dir or 'unknown: its environment cannot be read', self.uid)


def orphan_warnings(orphans: t.Sequence[ForeignDaemon], gpus: t.Sequence[Gpu]) -> t.List[str]:
    """What a run on one resource says of the root's orphans (it never acts on them: gpufleet.mps.mps_host does)."""
    labels = {gpu.uuid: gpu.label for gpu in gpus}
    said = []
    for daemon in orphans:
        served = ', '.join(labels.get(uuid, uuid) for uuid in daemon.uuids) or 'GPUs'
        said.append('an orphaned MPS control daemon of this root still serves %s: %s; gpufleet.mps.mps_host with orphans=stop '
                    'ends it and gives its GPUs back their compute mode' % (served, daemon.describe()))
    return said


def _orphaned(pipe: str, pid: int) -> bool:
    """A daemon whose pipe directory is gone, or names another daemon: nothing under the root leads to it any more."""
    return read_pid_file(pipe) != pid


def foreign_daemons(own_pipe_dir: t.Optional[str], gpus: t.Sequence[Gpu], own_pid: t.Optional[int] = None,
                    proc: str = '/proc', outside: t.Optional[str] = None) -> t.Tuple[t.List[ForeignDaemon], t.List[ForeignDaemon]]:
    """The control daemons on the host other than the one of ``own_pipe_dir`` (None: all): (those whose GPUs are known, the unreadable).

    Found from the processes, so daemons under another root, started by hand or by NVIDIA's device
    plugin (in a container: its pipe directory is looked up through its own root) are all seen. A
    daemon whose environment cannot be read (another user's, without root) may serve any GPU. With
    ``outside``, the daemons whose pipe directory is under that root are left out (their start records
    say more about them).
    """
    known, unreadable = [], []
    for found in control_daemons(proc):
        if found.pid == own_pid:
            continue
        pipe = found.pipe_dir(DEFAULT_PIPE_DIR)
        if found.environ is None:
            unreadable.append(ForeignDaemon(found.pid, None, found.uid, []))
            continue
        # The same directory seen through the daemon's own root (a container's daemon names its own path);
        # where that cannot be read, the same path.
        uuids = [gpu.uuid for gpu in visible_gpus(found.visible_devices, gpus)]
        if outside is not None and pipe.startswith(os.path.join(os.path.normpath(outside), '')):
            # This root's daemons are told by their start records - unless nothing under the root leads to one any more.
            if _orphaned(pipe, found.pid):
                known.append(ForeignDaemon(found.pid, pipe, found.uid, uuids, orphan=True))
            continue
        if own_pipe_dir is not None:
            same = same_directory('%s/%d/root%s' % (proc, found.pid, pipe), own_pipe_dir)
            if same or (same is None and pipe == os.path.normpath(own_pipe_dir)):
                continue
        known.append(ForeignDaemon(found.pid, pipe, found.uid, uuids))
    return known, unreadable
