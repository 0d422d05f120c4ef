# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One MPS control daemon found from its pipe directory: whether it is alive, and its pid.

Liveness is decided by the daemon's lock on ``control_lock`` and its process, never by connecting to its socket
(:func:`inspect`): the real r580 daemon holds a POSIX lock that ``/proc/locks`` shows, and leaves its sockets and pid
file behind after quit, TERM and kill -9 (``../shared/mps-reference.md`` section 8). Where the lock does not show
(an OFD lock shows pid -1, and a driver may hide it: the simulator's ``FAKE_MPS_LOCK_KIND``), the pid file's process
decides, when /proc shows it is a control daemon of this pipe directory. A pid file whose pid is alive but is not a
control daemon of this pipe directory belongs to an unrelated process that reused the pid: stale, and never
signalled. :func:`socket_answers` is for waiting on a daemon whose pid is not known.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass, field

from .._proc import environ_of, has_open, lock_holders, looks_like_daemon, pid_alive
from .._resource.layout import ResourcePaths

PID_FILE = 'nvidia-cuda-mps-control.pid'
LOCK_FILE = 'control_lock'
# Files a daemon leaves in its pipe directory; which of them a clean quit removes is undocumented.
PIPE_DIR_FILES = ('control', 'control_privileged', 'log', PID_FILE)
# The pipe directory of a daemon started without CUDA_MPS_PIPE_DIRECTORY.
DEFAULT_PIPE_DIR = '/tmp/nvidia-mps'


@dataclass
class Liveness:
    """What the pipe directory says about the daemon, without talking to it."""

    running: bool
    pid: t.Optional[int]
    pid_file_pid: t.Optional[int]
    leftovers: t.List[str] = field(default_factory=list)
    # Set when the evidence disagrees (a live daemon process of this pipe directory, but no socket file to reach
    # it by): nothing may be cleaned, stopped, started or reset on the word of either.
    conflict: t.Optional[str] = None

    @property
    def stale(self) -> bool:
        """Dead, but files of a previous daemon remain."""
        return not self.running and self.conflict is None and bool(self.leftovers)

    @property
    def label(self) -> str:
        if self.running:
            return 'running'
        if self.conflict:
            return 'unknown'
        return 'stale' if self.stale else 'stopped'


def read_pid_file(pipe_dir: str) -> t.Optional[int]:
    try:
        with open(os.path.join(pipe_dir, PID_FILE), encoding='ascii', errors='replace') as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def inspect(paths: ResourcePaths, locks: t.Optional[t.List[str]] = None) -> Liveness:
    """Find the daemon of ``paths`` without talking to it: its lock on ``control_lock`` and its process decide.

    A live process that holds a lock on ``control_lock`` runs it (the real r580 daemon holds a POSIX write lock that
    ``/proc/locks`` shows, and the kernel drops it when the daemon dies, however it dies). Where no holder shows (an
    OFD lock shows pid -1; a driver may hide it), the pid file's process runs it when it is a control daemon of this
    pipe directory. The control socket is never connected to here: each connection is a line in the daemon's
    control.log, and the real daemon leaves its sockets and pid file behind after quit, TERM and kill -9 alike. A live
    daemon whose socket file is gone cannot be reached (quit included): that disagreement is reported, and nothing is
    cleaned, stopped, started or reset. ``locks``: ``/proc/locks`` as read once for several resources (None: read it).
    """
    pid_file_pid = read_pid_file(paths.pipe_dir)
    leftovers = [name for name in PIPE_DIR_FILES if os.path.lexists(os.path.join(paths.pipe_dir, name))]
    if os.path.exists(paths.started_file):
        leftovers.append(os.path.basename(paths.started_file))
    holders = [pid for pid in lock_holders(os.path.join(paths.pipe_dir, LOCK_FILE), lines=locks) or [] if pid > 0 and pid_alive(pid)]
    pid: t.Optional[int] = None
    if pid_file_pid is not None and pid_alive(pid_file_pid) and (
            pid_file_pid in holders or _is_daemon_of(pid_file_pid, paths.pipe_dir)):
        pid = pid_file_pid
    elif holders:
        pid = holders[0]
    if pid is None:
        return Liveness(running=False, pid=None, pid_file_pid=pid_file_pid, leftovers=leftovers)
    if os.path.lexists(paths.control_socket):
        return Liveness(running=True, pid=pid, pid_file_pid=pid_file_pid, leftovers=leftovers)
    evidence = []
    if pid in holders:
        evidence.append('holds %s' % os.path.join(paths.pipe_dir, LOCK_FILE))
    if pid == pid_file_pid:
        evidence.append('is named by %s' % os.path.join(paths.pipe_dir, PID_FILE))
    conflict = ('process %d %s, but %s does not exist: the evidence disagrees (a daemon still starting, one that failed to '
                'bind its socket, or a socket removed under a live daemon), so nothing was cleaned, stopped, started or '
                'reset; find out what pid %d is doing (see %s) and stop it, then run again' % (
                    pid, ' and '.join(evidence), paths.control_socket, pid, os.path.join(paths.log_dir, 'control.log')))
    return Liveness(running=False, pid=pid, pid_file_pid=pid_file_pid, leftovers=leftovers, conflict=conflict)


def _serves(pid: int, pipe_dir: str) -> t.Optional[bool]:
    """Whether the process's pipe directory is ``pipe_dir``; None when its environment cannot be read."""
    env = environ_of(pid)
    if env is None:
        return None
    return os.path.normpath(env.get('CUDA_MPS_PIPE_DIRECTORY') or DEFAULT_PIPE_DIR) == os.path.normpath(pipe_dir)


def _is_daemon_of(pid: int, pipe_dir: str) -> bool:
    """The process is a control daemon of ``pipe_dir``, as far as /proc shows.

    A daemon by its name (comm, truncated to 15 characters) or because it has ``control_lock`` open; and,
    where its environment is readable, one whose pipe directory is ``pipe_dir``.
    """
    if not (looks_like_daemon(pid) or has_open(pid, os.path.join(pipe_dir, LOCK_FILE))):
        return False
    # Another user's process: its name is all this process can see.
    return _serves(pid, pipe_dir) is not False
