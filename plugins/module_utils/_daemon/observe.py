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


class DaemonObserve:
    """Of :class:`.manager.DaemonManager`: its view of the host, read once (its ``wants``, then the probes)."""

    def wants(self, *, shm: bool, state: str = 'started') -> Wants:
        """Every path a decision about this resource may look at, beyond its own directories and persisted files."""
        wants = Wants()
        if self.systemctl is not None or self.supervisor == 'systemd':
            wants.add(files=self.unit_files(), dirs=[os.path.dirname(self.dropin_path), self.unit_dir])
        if state == 'absent':
            wants.add(others=self.removal_paths())
            wants.mounts = True
        shm_dir = os.path.join(self.paths.root, SHM_DIR)
        wants.add(dirs=[shm_dir])
        if shm:
            wants.mounts = True
            from .._tmpfs import mount_unit_name  # pylint: disable=import-outside-toplevel
            real = os.path.join(os.path.realpath(self.paths.root), SHM_DIR)
            wants.add(files=['/etc/fstab', os.path.join(self.unit_dir, mount_unit_name(real))])
        return wants

    def observe(self, state: str, shm: bool, remove_logs: bool = False) -> t.Any:
        """Read the host once for this resource's decision (under its lock in a real run), and seal it."""
        view = read_host(self.paths.root, self.nvml.gpus(), [(self.paths, self.config)], self.wants(shm=shm, state=state),
                         with_logs=state == 'absent' and remove_logs)
        self.probe(view, state, shm=shm, ordinals=0)
        return view.seal()

    def probe(self, view: t.Any, state: str, *, shm: bool, ordinals: t.Optional[int]) -> None:
        """What only some decisions need, read into ``view`` before it is sealed: the unit's state, one control batch of a
        running daemon (its health, its servers' clients; its limits for ``ordinals`` devices, None: read elsewhere), its
        process, the binary's help where the persisted limits need a command it may lack, SELinux labels, whether a
        daemon can be given the shared tmpfs as its /dev/shm."""
        seen = view.resource(self.paths.name)
        if self.systemctl is not None:
            read_units(view, self.systemctl, [self.unit])
        running = seen.state.running and seen.state.pid
        if running and ordinals is not None and self.paths.name not in view.readouts:
            read_daemon(view, self.paths.name, self.daemon.query, ordinals, seen.state.pid)
            self.daemon.answered = True
        if running:
            read_process(view, seen.state.pid, self.paths.shm_dir, record_known=seen.problem is None and seen.record is not None)
        if self.selinux_type:
            read_labels(view, [self.paths.pipe_dir])
        if state in ('stopped', 'absent'):
            return
        limits = read_persisted(self.config, view.text)
        if limits is not None:
            # A start replays them: is every command of theirs one the binary on disk has? A running daemon's answers speak
            # for the binary that started it, which a driver package may have replaced since: its help is read.
            if limits.client_priority is not None:
                read_help(view, self.daemon, SET_DEFAULT_PRIORITY)
            if limits.sm_partitions:
                read_help(view, self.daemon, SM_PARTITION)
        if shm and self.supervisor != 'systemd' and view.shm_namespace is None:
            # A daemon may be (re)started with the tmpfs as /dev/shm: whether that can work here is known before the old
            # one is stopped or a compute mode changed. A daemon that already sees it as its /dev/shm has shown that it can.
            if self.paths.shm_dir in view.dev_shm.values():
                view.shm_namespace = ''
                return
            try:
                self.daemon.check_shm_namespace()
                view.shm_namespace = ''
            except InvalidParameterError as exc:
                view.shm_namespace = exc.msg

    def offered(self, word: str) -> t.Optional[bool]:
        """Whether the control binary on disk has ``word``, as its help text was read."""
        return self.view.offers(self.daemon.binary, word)

    def _check_shm_start(self, wanted: t.Any) -> None:
        """A daemon is about to be (re)started with the tmpfs as /dev/shm: refused now where that cannot work here."""
        from .._tmpfs import check_unit_path, mounted_at  # pylint: disable=import-outside-toplevel
        if wanted.supervisor == 'systemd':
            check_unit_path(self.paths.shm_dir, 'root')
            return
        if self.shm_planned and mounted_at(self.paths.shm_dir, self.view.mounts(), self.view.realpath(self.paths.shm_dir)) is None:
            return  # a tmpfs the same plan mounts first is tried by the start itself
        if self.view.shm_namespace:
            raise InvalidParameterError('shm', self.view.shm_namespace.split(': ', 1)[-1])
