# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A podman of a test's own: every file it writes under one directory, and nothing of it left behind.

- ``containers.conf`` (``CONTAINERS_CONF``) and ``storage.conf`` (``CONTAINERS_STORAGE_CONF``) put podman's
  storage, temporary files, locks and volumes under ``<dir>``; runc keeps its state there too (a wrapper passes
  ``--root``). Only the storage run root lies elsewhere, in ``/run/gpufleet-podman-<hash of dir>``: podman 4.3.1
  stalls 20 s after every container whose run root is longer than 50 bytes. The machine's podman defaults
  (``/var/lib/containers``, ``/run/containers``, ``/run/libpod``, ``/run/runc``, ``/dev/shm/libpod_lock``) are
  never touched.
- runc with cgroupfs: crun refuses this kind of machine's hybrid cgroup hierarchy. Containers run under a
  cgroup parent named after ``<dir>`` (``podman run --cgroup-parent``), which :meth:`Podman.cleanup` removes.
- No registry is needed: the containers' root is a Debian ``minbase`` with ``python3``, debootstrapped once
  into ``<cache>`` (keyed by what it holds) and given to ``podman run --rootfs DIR:O``, an overlay that
  keeps the cached tree unchanged. ``podman import`` would also do, but it writes containers/image's blob
  cache to the machine's ``/var/lib/containers/cache`` whatever the configuration says.
- :meth:`Podman.cleanup` removes the containers, ends by pid whatever podman left running (conmon, a
  container's processes, a ``podman container cleanup``), unmounts what it left mounted and removes its
  cgroups; :meth:`Podman.leftovers` says what of it remains. Call cleanup on failure too.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Sequence

SUITE = os.environ.get('ENGINES_SUITE', 'bookworm')
MIRROR = os.environ.get('DEBIAN_MIRROR', 'http://deb.debian.org/debian')
# python3, not python3-minimal: the client stand-in needs json, which the minimal standard library lacks.
PACKAGES = 'python3'
# Bump when the tree's preparation below changes, so that a cached tree of the old kind is not reused.
LAYOUT = 1
CGROUP_FS = '/sys/fs/cgroup'
RUN = '/run'
RUNC = shutil.which('runc') or '/usr/sbin/runc'


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, 'w', encoding='ascii') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one debootstrap at a time; the others wait and reuse it
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def rootfs(cache: str) -> str:
    """The cached Debian root for the containers, debootstrapped first when ``cache`` has none (~30-60 s)."""
    key = hashlib.sha256(('%s minbase %s %d' % (SUITE, PACKAGES, LAYOUT)).encode()).hexdigest()[:12]
    tree = os.path.join(cache, 'podman-rootfs-debian-%s-%s' % (SUITE, key))
    os.makedirs(cache, exist_ok=True)
    with _locked(os.path.join(cache, '.podman-rootfs.lock')):
        if os.path.isdir(tree):
            return tree
        work = tempfile.mkdtemp(prefix='.debootstrap-', dir=cache)
        try:
            os.chmod(work, 0o755)  # mkdtemp makes 0700; the container's / must be searchable by every uid
            proc = subprocess.run(['debootstrap', '--variant=minbase', '--include=' + PACKAGES, SUITE, work, MIRROR],
                                  capture_output=True, text=True, timeout=900, check=False)
            if proc.returncode != 0:
                raise RuntimeError('debootstrap %s (%s) from %s failed, exit %d:\n%s' % (
                    SUITE, PACKAGES, MIRROR, proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
            # what a container never uses: the downloaded packages and the package lists
            for sub in ('var/cache/apt/archives', 'var/lib/apt/lists'):
                for entry in os.scandir(os.path.join(work, sub)):
                    if entry.is_file() and entry.name != 'lock':
                        os.unlink(entry.path)
            os.rename(work, tree)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return tree


class Podman:
    """podman with a configuration, storage and cgroup parent of its own under ``directory``."""

    def __init__(self, directory: str, root: str) -> None:
        self.dir = os.path.abspath(directory)
        self.root = root
        # Named after the directory, so that two checkouts never share them: a top-level cgroup in every hierarchy
        # (cgroupfs), and the run root, which must be short: podman 4.3.1 waits 20 s (its conmon timeout) after every
        # container whose run root is longer than 50 bytes, and <TEST_ROOT>/<test>/podman/run is longer.
        name = 'gpufleet-podman-' + hashlib.sha256(self.dir.encode()).hexdigest()[:12]
        self.cgroup_parent = name
        self.runroot = os.path.join(RUN, name)
        for sub in ('graph', 'tmp', 'runc', 'bin'):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.makedirs(self.runroot, mode=0o700, exist_ok=True)
        self.runc_root = os.path.join(self.dir, 'runc')
        wrapper = os.path.join(self.dir, 'bin', 'runc')
        with open(wrapper, 'w', encoding='utf-8') as handle:
            handle.write('#!/bin/sh\n# runc with its state under this test\'s directory (its default is /run/runc)\n'
                         'exec %s --root %s "$@"\n' % (RUNC, self.runc_root))
        os.chmod(wrapper, 0o755)
        self.containers_conf = os.path.join(self.dir, 'containers.conf')
        with open(self.containers_conf, 'w', encoding='utf-8') as handle:
            handle.write(
                '[containers]\n'
                # the most this machine permits; podman's default asks for more and runc fails to set it
                'default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n'
                '[engine]\n'
                'runtime = "runc"\n'
                'cgroup_manager = "cgroupfs"\n'
                'events_logger = "none"\n'
                # file locks under tmp_dir: the default "shm" keeps them in /dev/shm/libpod_lock, shared machine-wide
                'lock_type = "file"\n'
                'tmp_dir = "%(dir)s/tmp"\n'
                'image_copy_tmp_dir = "%(dir)s/tmp"\n'
                'static_dir = "%(dir)s/graph/libpod"\n'
                'volume_path = "%(dir)s/graph/volumes"\n'
                '[engine.runtimes]\n'
                'runc = ["%(wrapper)s"]\n'
                '[network]\n'
                # the containers run with --network none; were a network made, its file would go here, not /etc/cni/net.d
                'network_config_dir = "%(dir)s/networks"\n' % {'dir': self.dir, 'wrapper': wrapper})
        self.storage_conf = os.path.join(self.dir, 'storage.conf')
        with open(self.storage_conf, 'w', encoding='utf-8') as handle:
            handle.write('[storage]\ndriver = "overlay"\ngraphroot = "%s/graph"\nrunroot = "%s"\n' % (self.dir, self.runroot))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(('CONTAINER', 'CUDA_MPS_', 'FAKE_', 'XDG_'))}
        self.env.update(CONTAINERS_CONF=self.containers_conf, CONTAINERS_STORAGE_CONF=self.storage_conf,
                        CONTAINERS_REGISTRIES_CONF=os.path.join(self.dir, 'registries.conf'))
        with open(self.env['CONTAINERS_REGISTRIES_CONF'], 'w', encoding='utf-8') as handle:
            handle.write('unqualified-search-registries = []\n')  # nothing to pull from: the root is local

    def podman(self, args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(['podman'] + list(args), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def run_argv(self, args: Sequence[str], cmd: Sequence[str]) -> List[str]:
        """The ``podman run`` command line of :meth:`run`."""
        return ['podman', 'run', '--rm', '--network', 'none', '--cgroup-parent', '/' + self.cgroup_parent] + list(args) + [
            '--rootfs', self.root + ':O'] + list(cmd)

    def run(self, args: Sequence[str], cmd: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """``podman run --rm`` of ``cmd`` with ``args`` in a container of the cached root; waits for it to end."""
        return subprocess.run(self.run_argv(args, cmd), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    # ------------------------------------------------------------------------------------------ cleanup

    def cleanup(self) -> List[str]:
        """Remove every container, end whatever of podman's still runs, unmount and remove its cgroups.

        Returns what it had to end or remove beyond podman's own ``rm``: empty when podman cleaned up after itself.
        """
        done: List[str] = []
        try:
            listed = self.podman(['ps', '--all', '--quiet'], timeout=60)
            ids = listed.stdout.split() if listed.returncode == 0 else []
            if ids:
                removed = self.podman(['rm', '--force', '--time', '0'] + ids, timeout=120)
                done.append('podman rm %s: exit %d %s' % (' '.join(i[:12] for i in ids), removed.returncode, removed.stderr.strip()))
        except (OSError, subprocess.TimeoutExpired) as exc:
            done.append('podman ps/rm: %s' % exc)
        for _round in range(3):
            found = self.processes()
            if not found:
                break
            for pid, what in sorted(found.items()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    done.append('killed pid %d: %s' % (pid, what))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and set(found) & set(self.processes()):
                time.sleep(0.05)
        for point in self.mounts():
            proc = subprocess.run(['umount', point], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                subprocess.run(['umount', '--lazy', point], capture_output=True, check=False)
            done.append('unmounted %s' % point)
        for group in self.cgroups():
            try:
                os.rmdir(group)
            except OSError as exc:
                done.append('cgroup %s: %s' % (group, exc.strerror))
        self._drop_runroot()
        return done

    def leftovers(self) -> List[str]:
        """What of this podman remains: processes, mounts under its directory, cgroups, containers."""
        found = ['pid %d: %s' % item for item in sorted(self.processes().items())]
        found += ['mount %s' % point for point in self.mounts()]
        found += ['cgroup %s' % group for group in self.cgroups()]
        found += ['run root %s' % self.runroot] if os.path.exists(self.runroot) else []
        if os.path.exists(os.path.join(self.dir, 'graph', 'libpod')):
            listed = self.podman(['ps', '--all', '--format', '{{.ID}} {{.Status}}'], timeout=60)
            found += ['container %s' % line for line in listed.stdout.splitlines() if line.strip()]
            self._drop_runroot()  # asking podman made it again
        return found

    def _drop_runroot(self) -> None:
        """Remove the run root: podman's run state, of containers that are gone - unless something is still mounted there."""
        if not any(point == self.runroot or point.startswith(self.runroot + '/') for point in self.mounts()):
            shutil.rmtree(self.runroot, ignore_errors=True)

    def processes(self) -> Dict[int, str]:
        """pid -> command line of each process of this podman: one whose command line names its directory (conmon, podman,
        the runc wrapper) or that runs in one of its cgroups (a container's processes, conmon)."""
        mine = _ancestors()
        markers = (self.dir + '/', self.runroot + '/')
        found: Dict[int, str] = {}
        for entry in os.listdir('/proc'):
            if not entry.isdigit() or int(entry) in mine:
                continue
            try:
                with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                    args = [part.decode(errors='replace') for part in handle.read().split(b'\0') if part]
                with open('/proc/%s/cgroup' % entry, encoding='utf-8', errors='replace') as handle:
                    groups = handle.read()
            except OSError:
                continue
            if not args:
                continue  # a kernel thread, or a zombie
            in_group = any(line.split(':', 2)[-1] == '/' + self.cgroup_parent or line.split(':', 2)[-1].startswith('/%s/' % self.cgroup_parent)
                           for line in groups.splitlines())
            if in_group or any(marker in arg for marker in markers for arg in args):
                found[int(entry)] = ' '.join(args)[:300]
        return found

    def mounts(self) -> List[str]:
        """Mount points under the directory or the run root, deepest first (as this process's mount namespace shows them)."""
        points = []
        with open('/proc/self/mountinfo', encoding='utf-8', errors='replace') as handle:
            for line in handle:
                point = line.split()[4].replace('\\040', ' ')
                if any(point == top or point.startswith(top + '/') for top in (self.dir, self.runroot)):
                    points.append(point)
        return sorted(set(points), key=lambda p: (-p.count('/'), p))

    def cgroups(self) -> List[str]:
        """The cgroup directories podman made under its parent, deepest first."""
        found = []
        for hierarchy in sorted(os.listdir(CGROUP_FS)) if os.path.isdir(CGROUP_FS) else []:
            top = os.path.join(CGROUP_FS, hierarchy, self.cgroup_parent)
            if not os.path.isdir(top) or os.path.islink(os.path.join(CGROUP_FS, hierarchy)):
                continue
            for path, dirs, _files in os.walk(top):
                found.extend(os.path.join(path, d) for d in dirs)
            found.append(top)
        return sorted(found, key=lambda p: (-p.count('/'), p))


def _ancestors() -> set:
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
                pid = int(handle.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def which(program: str) -> Optional[str]:
    return shutil.which(program) or next((p for p in ('/usr/sbin/' + program, '/sbin/' + program) if os.access(p, os.X_OK)), None)
