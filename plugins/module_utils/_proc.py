# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every read of ``/proc``: processes, their environment and open files, the kernel's lock table, mounts.

Each function answers one question about the host and says "unknown" (None) rather than guess when
``/proc`` does not tell (another user's process, a kernel without the file).
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass


def pid_alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, which keeps its name until reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not is_zombie(pid)


def read_locks(proc_locks: str = '/proc/locks') -> t.Optional[t.List[str]]:
    """The kernel's table of file locks, a line each; None when it cannot be read."""
    try:
        with open(proc_locks, encoding='ascii', errors='replace') as handle:
            return handle.read().splitlines()
    except OSError:
        return None


def lock_holders(path: str, proc_locks: str = '/proc/locks', lines: t.Optional[t.List[str]] = None) -> t.Optional[t.List[int]]:
    """Pids holding a lock on ``path`` per ``/proc/locks`` (or its ``lines``, read once for many files: :func:`read_locks`);
    [] for none; None when unknowable."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    wanted = '%02x:%02x:%d' % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    if lines is None:
        lines = read_locks(proc_locks)
        if lines is None:
            return None
    holders = []
    for line in lines:
        fields = line.split()
        if '->' in fields or len(fields) < 6:
            continue  # a waiter, not a holder
        if fields[5] == wanted:
            try:
                holders.append(int(fields[4]))
            except ValueError:
                holders.append(-1)
    return holders


def looks_like_daemon(pid: int) -> bool:
    """The process is named like the control daemon (comm is truncated to 15 characters)."""
    try:
        with open('/proc/%d/comm' % pid, encoding='utf-8', errors='replace') as handle:
            comm = handle.read().strip()
    except OSError:
        return False
    return comm == 'nvidia-cuda-mps-control'[:15]


def started_static(pid: int) -> t.Optional[bool]:
    """Whether the control daemon ``pid`` was started with ``-S`` (static SM partitioning): its arguments, which the forked
    daemon keeps (``-d -S``); None when they cannot be read."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv = handle.read().split(b'\0')
    except OSError:
        return None
    return b'-S' in argv or b'--static-partitioning' in argv


PROTOCOL_VARIABLE = 'CUDA_MPS_PROTOCOL_VERSION'


def started_protocol(pid: int) -> t.Optional[int]:
    """The MPS protocol the control daemon ``pid`` was started with: 3 where ``CUDA_MPS_PROTOCOL_VERSION`` in its
    environment - which wins over the option - or its arguments (``-p 3``, ``--protocol 3``, ``--protocol=3``) say so,
    else 2 (legacy, the default); None when neither can be read (shared/mps-v3-reference.md 1.1: every later control
    call follows the running daemon's protocol, so this is what decides which words it understands).

    A binary without protocol 3 (r580) refuses ``-p 3`` and does not start, so an argument is its word; the variable is
    taken at its word too [I]: a daemon started with it on such a binary is reported as v3, never driven blind."""
    environ = environ_of(pid)
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv = [arg.decode('utf-8', 'replace') for arg in handle.read().split(b'\0') if arg]
    except OSError:
        argv = []
    option = ''
    for index, arg in enumerate(argv[1:], 1):
        if arg in ('-p', '--protocol') and index + 1 < len(argv):
            option = argv[index + 1]
        elif arg.startswith('--protocol='):
            option = arg.split('=', 1)[1]
        elif arg.startswith('-p') and arg[2:].isdigit():  # -p3
            option = arg[2:]
    variable = None if environ is None else environ.get(PROTOCOL_VARIABLE, '').strip()
    if variable:
        return 3 if variable == '3' else 2
    if option == '3':
        return 3
    # An unreadable environment (another user's, without root) could hold the variable, which wins: unknown.
    return None if environ is None else 2


DELETED = ' (deleted)'


def replaced_binary(pid: int) -> t.Optional[str]:
    """The path of the program ``pid`` runs when that file was replaced or removed after it started - a driver package
    upgrade replaces ``nvidia-cuda-mps-control`` under a running daemon, and the kernel then names its executable
    ``<path> (deleted)`` -, '' when it was not, None when ``/proc/<pid>/exe`` cannot be read (another user's, without
    root)."""
    try:
        target = os.readlink('/proc/%d/exe' % pid)
    except OSError:
        return None
    return target[:-len(DELETED)] if target.endswith(DELETED) else ''


def replaced_binary_warning(name: str, pid: int, path: str) -> str:
    """What a run says of a daemon whose program was replaced or removed after it started (and that it keeps as it is)."""
    return ('driver upgrade pending: the MPS control daemon of %s (pid %d) runs %s, which was replaced or removed after it '
            'started (a driver package upgrade or reinstall); it keeps serving with the program it was started from, and NVML '
            'still reports the driver it was started under, so no restart is planned for it: restart it when its clients '
            'allow (state=restarted), or reboot, to take the new program' % (name, pid, path))


def has_open(pid: int, path: str) -> bool:
    real = os.path.realpath(path)
    try:
        fds = os.listdir('/proc/%d/fd' % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink('/proc/%d/fd/%s' % (pid, fd)) == real:
                return True
        except OSError:
            continue
    return False


def environ_of(pid: int) -> t.Optional[t.Dict[str, str]]:
    """The environment a process was started with, None when unreadable."""
    try:
        with open('/proc/%d/environ' % pid, 'rb') as handle:
            return _parse_environ(handle.read())
    except OSError:
        return None


def _parse_environ(data: bytes) -> t.Dict[str, str]:
    env = {}
    for entry in data.split(b'\0'):
        name, sep, value = entry.partition(b'=')
        if sep:
            env[name.decode('utf-8', 'replace')] = value.decode('utf-8', 'replace')
    return env


def child_pids(pid: int) -> t.List[int]:
    """Pids of the children of ``pid``: for a control daemon, its MPS servers.

    Lets one UI session ask about every server (``get_server_list`` in the same batch says which of
    them really are servers) instead of a first session for the list and a second for the details.
    """
    children: t.Set[int] = set()
    try:
        tasks = os.listdir('/proc/%d/task' % pid)
    except OSError:
        return []
    found_children_files = False
    for tid in tasks:
        try:
            with open('/proc/%d/task/%s/children' % (pid, tid), encoding='ascii') as handle:
                children.update(int(word) for word in handle.read().split())
            found_children_files = True
        except (OSError, ValueError):
            continue
    if not found_children_files:
        # Kernels without CONFIG_PROC_CHILDREN: scan every process's parent.
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                with open('/proc/%s/stat' % entry, encoding='ascii', errors='replace') as handle:
                    if int(handle.read().rsplit(')', 1)[1].split()[1]) == pid:
                        children.add(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return sorted(children)


def same_directory(first: str, second: str) -> t.Optional[bool]:
    """Whether two paths are the same directory (device and inode), None when either cannot be read."""
    try:
        a, b = os.stat(first), os.stat(second)
    except OSError:
        return None
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def daemon_dev_shm(pid: int, shm_dir: str) -> t.Optional[str]:
    """Which ``/dev/shm`` the process sees through its own mount namespace: ``shm_dir``, the host's, or None."""
    theirs = '/proc/%d/root/dev/shm' % pid
    if same_directory(theirs, shm_dir):
        return shm_dir
    if same_directory(theirs, '/dev/shm'):
        return '/dev/shm'
    return None


def is_zombie(pid: int) -> bool:
    try:
        with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except (OSError, IndexError):
        return False


def process_uid(pid: int, proc: str = '/proc') -> t.Optional[int]:
    """The real uid of a process (``Uid:`` in ``/proc/<pid>/status``); None when unknowable."""
    try:
        with open('%s/%d/status' % (proc, pid), encoding='ascii', errors='replace') as handle:
            for line in handle:
                if line.startswith('Uid:'):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def uuids_from_environ(pid: int) -> t.Optional[t.List[str]]:
    """``CUDA_VISIBLE_DEVICES`` of a running daemon not started by this collection (None when unreadable or unset)."""
    env = environ_of(pid)
    if env is None or 'CUDA_VISIBLE_DEVICES' not in env:
        return None
    return [item.strip() for item in env['CUDA_VISIBLE_DEVICES'].split(',') if item.strip()]


# comm of the control daemon, its servers and the control UI alike: each name cut to 15 bytes.
MPS_COMM = 'nvidia-cuda-mps'
# The arguments that make nvidia-cuda-mps-control a daemon rather than the control UI.
DAEMON_FLAGS = ('-d', '-f')


@dataclass
class ControlProcess:
    """An MPS control daemon found among the host's processes, as /proc shows it."""

    pid: int
    # Its environment (CUDA_MPS_PIPE_DIRECTORY, CUDA_VISIBLE_DEVICES); None when another user's and unreadable.
    environ: t.Optional[t.Dict[str, str]]
    uid: t.Optional[int]

    def pipe_dir(self, default: str) -> t.Optional[str]:
        """Its pipe directory as it names it (a path in its own mount namespace); None when unknowable."""
        if self.environ is None:
            return None
        return os.path.normpath(self.environ.get('CUDA_MPS_PIPE_DIRECTORY') or default)

    @property
    def visible_devices(self) -> t.Optional[str]:
        """``CUDA_VISIBLE_DEVICES`` as set (None: unset - every GPU - or unreadable)."""
        return None if self.environ is None else self.environ.get('CUDA_VISIBLE_DEVICES')


def control_daemons(proc: str = '/proc') -> t.List[ControlProcess]:
    """Every MPS control daemon running on the host (any root, any tool, any pid namespace the host sees).

    A control daemon is a process named ``nvidia-cuda-mps`` whose arguments hold ``-d`` or ``-f``: the
    servers (``nvidia-cuda-mps-server``) and the control UI have the same comm but neither flag.

    The environment is read before the arguments: a process that exits meanwhile - the parent of ``-d``, which exits
    once its daemon is forked, or a daemon that quits - answers both with nothing once its memory is gone, and an empty
    environment read from it would say "default pipe directory, every GPU" (a GPU wrongly refused as served by another
    daemon). Read in this order, its arguments come back empty too and it is left out; a live daemon started with an
    empty environment still has its arguments.
    """
    found = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        base = '%s/%s' % (proc, entry)
        try:
            with open(base + '/comm', encoding='utf-8', errors='replace') as handle:
                if handle.read().strip() != MPS_COMM:
                    continue
            environ = _environ_at(base)  # before the arguments: see above
            with open(base + '/cmdline', 'rb') as handle:
                argv = [arg.decode('utf-8', 'replace') for arg in handle.read().split(b'\0') if arg]
        except OSError:
            continue  # gone meanwhile
        if not argv or os.path.basename(argv[0]).startswith('nvidia-cuda-mps-server') or not any(
                arg in DAEMON_FLAGS for arg in argv[1:]):
            continue  # not a daemon, or gone (an exiting process's arguments read empty)
        pid = int(entry)
        found.append(ControlProcess(pid, environ, process_uid(pid, proc)))
    return sorted(found, key=lambda daemon: daemon.pid)


def _environ_at(base: str) -> t.Optional[t.Dict[str, str]]:
    try:
        with open(base + '/environ', 'rb') as handle:
            return _parse_environ(handle.read())
    except OSError:
        return None


MOUNTINFO = '/proc/self/mountinfo'


def read_mountinfo() -> str:
    """This process's mount table (empty when unreadable)."""
    try:
        with open(MOUNTINFO, encoding='utf-8', errors='replace') as handle:
            return handle.read()
    except OSError:
        return ''
