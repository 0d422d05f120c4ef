# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a decision about one resource's daemon may look at, and reading it (mps_daemon's own run; mps_host reads the
same for every resource of a host in one view)."""

from __future__ import annotations

import os
import typing as t

from .._errors import InvalidParameterError
from .._limits.store import read_persisted
from .._observe.reader import Wants, read_daemon, read_help, read_host, read_labels, read_process, read_units
from .._protocol.commands import SET_DEFAULT_PRIORITY, SM_PARTITION
from .._resource.layout import SHM_DIR
from .model import DaemonRun, Wanted
from .systemd import UnitFiles


def wants(run: DaemonRun, unit: UnitFiles, removal_paths: t.Callable[[], t.List[str]], *, shm: bool,
          state: str = 'started') -> Wants:
    """Every path a decision about this resource may look at, beyond its own directories and persisted files."""
    wanted = Wants()
    if run.systemctl is not None or run.supervisor == 'systemd':
        wanted.add(files=unit.paths(), dirs=[os.path.dirname(unit.dropin_path), run.unit_dir])
    if state == 'absent':
        wanted.add(others=removal_paths())
        wanted.mounts = True
    wanted.add(dirs=[os.path.join(run.paths.root, SHM_DIR)])
    if shm:
        wanted.mounts = True
        from .._tmpfs import mount_unit_name  # pylint: disable=import-outside-toplevel
        real = os.path.join(os.path.realpath(run.paths.root), SHM_DIR)
        wanted.add(files=['/etc/fstab', os.path.join(run.unit_dir, mount_unit_name(real))])
    return wanted


def observe(run: DaemonRun, wants_: Wants, state: str, *, shm: bool, remove_logs: bool = False) -> t.Any:
    """Read the host once for this resource's decision (under its lock in a real run), and seal it."""
    view = read_host(run.paths.root, run.nvml.gpus(), [(run.paths, run.config)], wants_, with_logs=state == 'absent' and remove_logs)
    probe(run, view, state, shm=shm, ordinals=0)
    return view.seal()


def probe(run: DaemonRun, view: t.Any, state: str, *, shm: bool, ordinals: t.Optional[int]) -> None:
    """What only some decisions need, read into ``view`` before it is sealed: the unit's state, one control batch of a
    running daemon (its health, its servers' clients; its limits for ``ordinals`` devices, None: read elsewhere), its
    process, the binary's help where the persisted limits need a command it may lack, SELinux labels, whether a
    daemon can be given the shared tmpfs as its /dev/shm."""
    paths = run.paths
    daemon = run.daemon
    seen = view.resource(paths.name)
    if run.systemctl is not None:
        read_units(view, run.systemctl, [run.unit])
    running = seen.liveness.running and seen.liveness.pid
    if running and ordinals is not None and paths.name not in view.readouts and paths.name not in view.v3:
        readout = read_daemon(view, paths.name, daemon.query, ordinals, seen.liveness.pid, client=daemon.client, config=run.config)
        daemon.answered = getattr(readout, 'ready', None) is not False  # a v3 daemon: its server listed Ready
    if running:
        read_process(view, seen.liveness.pid, paths.shm_dir, record_known=seen.problem is None and seen.record is not None)
    if run.selinux_type:
        read_labels(view, [paths.pipe_dir])
    if state in ('stopped', 'absent'):
        return
    limits = read_persisted(run.config, view.text)
    if limits is not None:
        # A start replays them: is every command of theirs one the binary on disk has? A running daemon's answers speak
        # for the binary that started it, which a driver package may have replaced since: its help is read.
        if limits.client_priority is not None:
            read_help(view, daemon, SET_DEFAULT_PRIORITY)
        if limits.sm_partitions:
            read_help(view, daemon, SM_PARTITION)
    if shm and run.supervisor != 'systemd' and view.shm_namespace is None:
        # A daemon may be (re)started with the tmpfs as /dev/shm: whether that can work here is known before the old
        # one is stopped or a compute mode changed. A daemon that already sees it as its /dev/shm has shown that it can.
        if paths.shm_dir in view.dev_shm.values():
            view.shm_namespace = ''
            return
        try:
            daemon.check_shm_namespace()
            view.shm_namespace = ''
        except InvalidParameterError as exc:
            view.shm_namespace = exc.msg


def check_shm_start(run: DaemonRun, wanted: Wanted) -> None:
    """A daemon is about to be (re)started with the tmpfs as /dev/shm: refused now where that cannot work here."""
    from .._tmpfs import check_unit_path, mounted_at  # pylint: disable=import-outside-toplevel
    shm_dir = run.paths.shm_dir
    if wanted.supervisor == 'systemd':
        check_unit_path(shm_dir, 'root')
        return
    view = run.view
    if run.host.shm_planned and mounted_at(shm_dir, view.mounts(), view.realpath(shm_dir)) is None:
        return  # a tmpfs the same plan mounts first is tried by the start itself
    if view.shm_namespace:
        raise InvalidParameterError('shm', view.shm_namespace.split(': ', 1)[-1])
