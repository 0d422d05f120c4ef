# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared-memory tmpfs at ``<root>/shm``: what is mounted, what is wanted, and making them agree.

An MPS client and its server share memory through ``/dev/shm``. NVIDIA's device plugin runs its
daemon with a dedicated tmpfs as ``/dev/shm`` and gives every container the same tmpfs; this module
serves that tmpfs from the host: mounted ``rw,nosuid,nodev,noexec,mode=1777`` with a size, kept
across reboots by a systemd mount unit or an fstab line, and changed with a remount, never an
unmount, while it is in use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import typing as t
from dataclasses import dataclass

from ._errors import InvalidParameterError, MpsError, UnsafePathError
from ._execute import execute
from ._io import atomic_write, ensure_dir, refuse_unsafe_dirs, remove, rmdir_if_empty
from ._outcome import Outcome
from ._resource.lock import RootLock
from ._resource.layout import SHM_DIR, validate_root
from ._observe.reader import Wants, read_host, read_labels, read_process, read_units
from ._observe.scan import orphan_warnings
from ._selinux import plan_type, set_type as set_selinux_type, validate_type as validate_selinux_type
from ._supervisor.unit import Systemctl, systemd_is_pid1
from ._tmpfs import (  # noqa: F401  pylint: disable=unused-import
    FLAGS, ShmState, check_unit_path, current_state, fstab_edit, fstab_entries, fstab_line, mount_options, mount_unit_name, real_path,
    shm_persisted, size_kib,
)

MODE = 0o1777
UNIT_HEADER = '# Managed by the gpufleet.mps Ansible collection (mps_shm). Local changes are overwritten.'


def render_mount_unit(path: str, kib: int) -> str:
    return '\n'.join([
        UNIT_HEADER,
        '[Unit]',
        'Description=tmpfs shared by NVIDIA MPS daemons and their container clients (gpufleet.mps)',
        'Documentation=https://github.com/gpufleet/mps',
        '',
        '[Mount]',
        'What=tmpfs',
        'Where=%s' % path,
        'Type=tmpfs',
        'Options=%s' % mount_options(kib),
        '',
        '[Install]',
        'WantedBy=local-fs.target',
        '',
    ])


class Mounter:
    """``mount`` and ``umount`` (util-linux)."""

    def __init__(self, mount: t.Optional[str] = 'mount', umount: t.Optional[str] = 'umount', timeout: float = 60) -> None:
        self.mount_binary = mount
        self.umount_binary = umount
        self.timeout = timeout

    def _run(self, argv: t.List[t.Optional[str]], what: str) -> None:
        if argv[0] is None:
            raise InvalidParameterError('state', '%s needs mount and umount (util-linux), which are not installed' % what)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError('%s failed: %s' % (what, exc)) from exc
        if proc.returncode != 0:
            raise MpsError('%s failed with status %d: %s' % (what, proc.returncode, (proc.stderr or proc.stdout).strip()),
                           rc=proc.returncode, cmd=argv)

    def mount(self, path: str, kib: int) -> None:
        self._run([self.mount_binary, '-t', 'tmpfs', '-o', mount_options(kib), 'tmpfs', path], 'mounting the tmpfs on %s' % path)

    def remount(self, path: str, kib: int) -> None:
        try:
            self._run([self.mount_binary, '-o', 'remount,' + mount_options(kib), path], 'remounting the tmpfs on %s' % path)
        except MpsError as exc:
            try:
                usage = os.statvfs(path)
                used = (usage.f_blocks - usage.f_bfree) * usage.f_frsize // 1024
            except OSError:
                raise exc from None
            if used > kib:
                raise InvalidParameterError('size', '%d KiB is less than the %d KiB the files in %s use now; the tmpfs was '
                                            'left as it was (%s)' % (kib, used, path, exc.msg)) from exc
            raise

    def umount(self, path: str) -> None:
        self._run([self.umount_binary, path], 'unmounting %s (is a container or process still using it?)' % path)


@dataclass
class ShmOutcome(Outcome):
    daemon_reload: bool = False


class ShmManager:
    """Bring ``<root>/shm`` to ``mounted`` (with its persistence) or ``absent``."""

    def __init__(self, root: str, persist: str, fstab: str, unit_dir: str, *, check_mode: bool, mounter: Mounter,
                 pages: t.Optional[t.Tuple[int, int]] = None, systemctl: t.Optional[Systemctl] = None,
                 selinux_type: str = '', daemons_stop_first: bool = False) -> None:
        self.root = validate_root(root)
        # The kernel names mount points by their real path: /var/run/nvidia/mps/shm is mounted as /run/...
        self.given_path = os.path.join(self.root, SHM_DIR)
        self.path = real_path(self.given_path)
        self.persist = persist
        self.fstab = validate_root(fstab, 'fstab')
        self.unit_path = os.path.join(unit_dir, mount_unit_name(self.path))
        self.check_mode = check_mode
        self.mounter = mounter
        self.pages = pages
        self.systemctl = systemctl
        self.unit = mount_unit_name(self.path)
        # The tmpfs root's SELinux type where SELinux is enabled ('' leaves labels alone): container clients that
        # mount it as their /dev/shm need a type containers may use, as for the pipe directories.
        self.selinux_type = selinux_type
        # The caller stops every daemon of the root before the unmount (mps_host state=absent): its plan does not
        # refuse for them; the run itself checks again once they are stopped.
        self.daemons_stop_first = daemons_stop_first
        # The run's view of the host (_observe.view.HostView): every decision here reads it (ensure() reads its own).
        self.view: t.Any = None

    def wants(self) -> Wants:
        """What its plan looks at: the mount table, the tmpfs's directory, the fstab and the mount unit."""
        wants = Wants().add(files=[self.fstab, self.unit_path], dirs=[self.path, self.given_path])
        wants.mounts = True
        return wants

    def probe(self, view: t.Any) -> None:
        """What its plan needs beyond the files, read into ``view`` before it is sealed: the mount unit's state, the
        tmpfs root's SELinux label, and which running daemons of the root see the tmpfs as their /dev/shm."""
        if self.systemctl is not None:
            read_units(view, self.systemctl, [self.unit])
        if self.selinux_type:
            read_labels(view, [self.path])
        for seen in view.resources.values():
            if (seen.liveness.running or seen.liveness.conflict) and seen.liveness.pid:
                read_process(view, seen.liveness.pid, self.path, record_known=True)

    def _read(self, path: str, what: str) -> t.Optional[str]:
        return self.view.text(path, what)

    @classmethod
    def for_host(cls, root: str, state: str, persist: str, fstab: str, unit_dir: str, *, check_mode: bool, selinux_type: t.Any,
                 param: str = 'persist', daemons_stop_first: bool = False) -> 'ShmManager':
        """The manager for this host: V(auto) persistence resolved, systemctl where systemd runs, options checked."""
        systemd = systemd_is_pid1()
        systemctl_path = shutil.which('systemctl')
        if persist == 'auto':
            persist = 'systemd' if systemd else 'fstab'
        if state == 'mounted' and persist == 'systemd' and not (systemctl_path and systemd):
            # A mount unit that cannot be enabled would not bring the tmpfs back at boot: say so instead.
            raise InvalidParameterError(param, 'systemd was asked for but %s; use fstab (or auto)' % (
                'systemctl is not installed' if not systemctl_path else 'systemd is not running as PID 1 here'))
        systemctl = Systemctl(systemctl_path) if systemctl_path and systemd else None
        # mount and umount are found lazily: a teardown of a host that never had the tmpfs needs neither.
        return cls(root, persist, fstab, unit_dir, check_mode=check_mode, mounter=Mounter(shutil.which('mount'), shutil.which('umount')),
                   systemctl=systemctl, selinux_type=validate_selinux_type(selinux_type), daemons_stop_first=daemons_stop_first)

    def never_here(self, view: t.Any) -> bool:
        """Whether the view shows no tmpfs directory, fstab line or mount unit of this root: a teardown of a host that
        never had one has nothing of it to remove (and needs neither mount nor umount)."""
        self.view = view
        persisted = self._persisted()
        return not view.paths.isdir(self.given_path) and not persisted['fstab'] and not persisted['unit']

    def _persisted(self) -> t.Dict[str, t.Any]:
        fstab = self._read(self.fstab, 'the fstab') or ''
        return {'fstab': bool(fstab_entries(fstab, self.path)), 'unit': self._read(self.unit_path, 'a systemd mount unit') is not None}

    def daemons_using(self) -> t.List[str]:
        """Running daemons under the root whose /dev/shm is this tmpfs, as their own mount namespace shows it.

        The ``.started`` record is only the fallback (/run loses it at boot, systemd restarts daemons
        without it).
        """
        users = []
        for name, seen in sorted(self.view.resources.items()):
            state = seen.liveness
            if not (state.running or state.conflict):
                continue
            sees = self.view.dev_shm.get(state.pid) if state.pid else None
            record = seen.record if seen.problem is None else None
            if sees == self.path or (sees is None and record is not None and record.shm):
                users.append(name)
        return users

    def observe(self) -> t.Any:
        """mps_shm's own view of the host: the root, its daemons, the tmpfs and its persistence; sealed."""
        view = read_host(self.root, [], [], self.wants())
        self.probe(view)
        return view.seal()

    def ensure(self, state: str, size: object) -> ShmOutcome:
        """Read the host, decide, then (unless in check mode) execute exactly that."""
        if self.check_mode:
            self.view = self.observe()
            out = self.plan(state, size)
        else:
            # No daemon of the root is started, stopped or given limits while its tmpfs changes (their runs
            # hold the root's lock shared); the host is read under the lock.
            with RootLock(self.root, exclusive=True):
                self.view = self.observe()
                out = self.plan(state, size)
                execute(out)
        out.warnings += orphan_warnings(self.view.orphans(), [])  # said, never acted on (gpufleet.mps.mps_host does)
        return out

    def plan(self, state: str, size: object, view: t.Any = None) -> ShmOutcome:
        """Every action, decided from the view (``view``: the host's, when mps_host decides; mps_shm's own run reads its
        own first); nothing is read or changed here."""
        if view is not None:
            self.view = view
        kib = size_kib(size, self.pages) if state == 'mounted' else None
        if kib is not None and self.persist == 'systemd':
            check_unit_path(self.path, 'root')
        refuse_unsafe_dirs([(self.root, 'root')], self.view.paths)
        if self.view.paths.islink(self.given_path):
            # Its mode is this module's to repair (1777), so only a symbolic link is refused here.
            raise UnsafePathError('root: %s is a symbolic link (to %s); refusing to mount through it' % (
                self.given_path, self.view.paths.entry(self.given_path).link), path=self.given_path, param='root')
        out = ShmOutcome()
        current = current_state(self.path, self.pages, mountinfo=self.view.mounts(), mode_of=self.view.mode, real=self.path)
        users = self.daemons_using() if state == 'absent' and current.mounted and not self.daemons_stop_first else []
        if users:
            # The host's unmount would succeed and leave those daemons with a detached tmpfs that no new
            # container can reach: refuse before touching anything.
            raise MpsError('state: %s is the /dev/shm of the running MPS daemon(s) %s; stop them (gpufleet.mps.mps_daemon '
                           'state=stopped) or restart them with shm=false before removing it' % (
                               self.path, ', '.join(sorted(users))), path=self.path)
        out.before = dict(current.view(), persisted=self._persisted())
        if kib is not None:
            self._mount(current, kib, out)
            self._label(current, out)
            self._persist(kib, out)
            out.after = dict(ShmState(mounted=True, size_kib=kib, flags=list(FLAGS), mode='1777').view(), persisted={
                'fstab': self.persist == 'fstab', 'unit': self.persist == 'systemd'})
        else:
            if current.mounted:
                out.act('unmount %s' % self.path, lambda: self.mounter.umount(self.path))
            self._remove_mount_point(current, out)
            self._persist(None, out)
            out.after = dict(ShmState(mounted=False).view(), persisted={'fstab': False, 'unit': False})
        return out

    def _remove_mount_point(self, current: ShmState, out: ShmOutcome) -> None:
        """The mount point this module created goes with the tmpfs, when nothing else was put there."""
        paths = self.view.paths
        if paths.islink(self.path) or not paths.isdir(self.path):
            return
        if current.mounted:
            # What lies under the tmpfs is only seen once it is unmounted.
            out.act('remove directory %s (when it is empty after the unmount)' % self.path, lambda: rmdir_if_empty(self.path))
        elif not paths.listdir(self.path):
            out.act('remove directory %s' % self.path, lambda: os.rmdir(self.path))

    def _mount(self, current: ShmState, kib: int, out: ShmOutcome) -> None:
        if not current.mounted:
            change = out.act('mount a tmpfs of %d KiB on %s' % (kib, self.path), lambda: (
                ensure_dir(self.root, 0o755), ensure_dir(self.path, 0o755), self.mounter.mount(self.path, kib)))
            # a later change of the run that fails takes the mount back (and the mount point, where this run made it)
            made = not self.view.paths.lexists(self.path)
            change.undo = lambda: (self.mounter.umount(self.path), made and rmdir_if_empty(self.path))
            return
        if current.size_kib != kib or sorted(current.flags) != sorted(FLAGS):
            out.act('remount %s with %s (was %d KiB, %s)' % (self.path, mount_options(kib), current.size_kib or 0, ','.join(current.flags)),
                    lambda: self.mounter.remount(self.path, kib))
        if current.mode != '1777':
            # tmpfs takes mode= only when mounted; the root directory's mode is changed in place.
            out.act('chmod 1777 %s (was %s)' % (self.path, current.mode), lambda: os.chmod(self.path, MODE))

    def _label(self, current: ShmState, out: ShmOutcome) -> None:
        """The tmpfs root's SELinux type, once it is mounted; a mount made by this run is labelled after it.

        A tmpfs comes back unlabelled at boot (its mount unit or fstab line mounts it): the daemons' units label it
        again before they start (their shm drop-in), as they do their pipe directories.
        """
        if not self.selinux_type or not self.view.selinux:
            return
        if not current.mounted:
            selinux_type = self.selinux_type
            out.act('set SELinux type %s on %s' % (selinux_type, self.path), lambda: set_selinux_type(self.path, selinux_type))
            return
        plan_type(self.path, self.selinux_type, out, self.view)

    def _persist(self, kib: t.Optional[int], out: ShmOutcome) -> None:
        """One persistence mechanism (or none): the other is removed, so two never fight at boot."""
        fstab = self._read(self.fstab, 'the fstab')
        wanted_line = fstab_line(self.path, kib) if kib is not None and self.persist == 'fstab' else None
        if fstab is not None or wanted_line is not None:
            new = fstab_edit(fstab or '', self.path, wanted_line)
            if new != (fstab or ''):
                mode = (self.view.mode(self.fstab) or 0o644) if fstab is not None else 0o644
                out.act('%s %s in %s' % ('write the entry for' if wanted_line else 'remove the entry for', self.path, self.fstab),
                        lambda: atomic_write(self.fstab, new, mode))
        unit = render_mount_unit(self.path, kib) if kib is not None and self.persist == 'systemd' else None
        existing = self._read(self.unit_path, 'a systemd mount unit')
        if unit is not None and existing != unit:
            out.act('write %s' % self.unit_path, lambda: (
                ensure_dir(os.path.dirname(self.unit_path), 0o755), atomic_write(self.unit_path, unit, 0o644)))
            out.daemon_reload = True
        elif unit is None and existing is not None:
            if self.systemctl is not None and self.view.unit(self.unit)[1]:
                systemctl = self.systemctl
                out.act('disable %s' % self.unit, lambda: systemctl.disable(self.unit))
            out.act('remove %s' % self.unit_path, lambda: remove(self.unit_path))
            out.daemon_reload = True
        if self.systemctl is None:
            return
        systemctl = self.systemctl
        if out.daemon_reload:
            out.act('systemctl daemon-reload', systemctl.daemon_reload)
        if unit is not None and not self.view.unit(self.unit)[1]:
            out.act('enable %s' % self.unit, lambda: systemctl.enable(self.unit))
