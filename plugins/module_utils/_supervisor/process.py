# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One MPS control daemon: start it, stop it, ask it whether it answers (``liveness.py`` finds it)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
import typing as t

from .._protocol.framing import ControlClient, Reply, SENTINEL, control_env
from .._protocol.commands import check_applied, parse_percentage, quit_command
from .._errors import (
    ControlBinaryError,
    ControlCommandError,
    DaemonNotRunningError,
    DaemonTimeoutError,
    InvalidParameterError,
    MpsError,
    ReplayRejectedError,
)
from .._io import ensure_dir
from .._resource.lock import ResourceLock, resource_lock
from .._proc import daemon_dev_shm, is_zombie, pid_alive
from .._resource.layout import DEFAULT_LOG_MODE, ResourcePaths
from .._resource.store import STATIC_OPTION, start_environment, wants_static
from .liveness import PIPE_DIR_FILES, inspect, read_pid_file

ALREADY_RUNNING_TEXT = 'An instance of this daemon is already running'
# What the daemon writes in its log directory.
LOG_FILES = ('control.log', 'server.log')

# Passed through to the daemon from the module's environment: where the driver's libraries are.
PASSTHROUGH_ENV = ('PATH', 'LD_LIBRARY_PATH')
# How long a daemon that answered quit with a text (a refusal) is given to exit all the same.
REJECTED_QUIT_GRACE = 2.0
DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# What r580 prints (its last byte a NUL) before its help for an option it does not know (gpu-evidence probe2.txt).
UNRECOGNIZED_OPTION_TEXT = 'Unrecognized option'
# A binary's help text, read once per module run (Daemon.offers).
_HELP_TEXTS: t.Dict[str, str] = {}


def daemon_env(paths: ResourcePaths, uuids: t.Sequence[str], environ: t.Optional[t.Mapping[str, str]] = None) -> t.Dict[str, str]:
    """The daemon's whole environment: nothing inherited but the library search path.

    ``CUDA_VISIBLE_DEVICES`` by UUID makes each daemon see only its own GPUs, renumbered from 0 in
    the given order. ``NVML_MPS_DEVICE_ENUMERATION`` is never set.
    """
    source = os.environ if environ is None else environ
    env = {name: source[name] for name in PASSTHROUGH_ENV if source.get(name)}
    env.setdefault('PATH', DEFAULT_PATH)
    env.update(paths.client_env())
    env['CUDA_VISIBLE_DEVICES'] = ','.join(uuids)
    return env


class Daemon:
    """Start, stop and query the control daemon of one resource (supervised by this module)."""

    def __init__(self, paths: ResourcePaths, binary: str, start_timeout: float, stop_timeout: int,
                 environ: t.Optional[t.Mapping[str, str]] = None, sleep: t.Callable[[float], None] = time.sleep,
                 log_mode: int = DEFAULT_LOG_MODE, shm_dir: t.Optional[str] = None) -> None:
        self.paths = paths
        self.log_mode = log_mode
        # With a shm directory the daemon, and every server it starts, sees it as /dev/shm.
        self.shm_dir = shm_dir
        self.binary = binary
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.environ = dict(os.environ if environ is None else environ)
        self.sleep = sleep
        self.client = ControlClient(binary, paths.pipe_dir, timeout=start_timeout, log_dir=paths.log_dir,
                                    base_env=self.environ)
        # Whether the daemon answered a query of this run that read its thread percentage (the health question);
        # a caller that knows the daemon changed since (stopped, restarted) sets it back to False.
        self.answered = False
        # A v3 resource's server (protocol 3): its health question is whether the daemon lists it.
        self.v3_server = ''

    @property
    def see_log(self) -> str:
        """The control log for a message: its path where it exists, else why there is none to read."""
        path = self.control_log
        return path if os.path.exists(path) else '%s - which does not exist: the daemon never got to write it' % path

    @property
    def control_log(self) -> str:
        return os.path.join(self.paths.log_dir, 'control.log')

    def query(self, commands: t.Sequence[str]) -> t.List[Reply]:
        """One UI process for ``commands``, with timeouts that name the daemon's pid and log."""
        try:
            return self.client.batch(commands)
        except DaemonTimeoutError as exc:
            pid = read_pid_file(self.paths.pipe_dir)
            raise DaemonTimeoutError(
                'the MPS control daemon for %s (pid %s) accepted the connection but did not answer within %ss; '
                'it was left running - see %s' % (self.paths.name, pid if pid else 'unknown', self.start_timeout, self.see_log),
                pid=pid, log_file=self.control_log) from exc

    def check_answer(self, reply: Reply) -> float:
        """The health check's answer must be the ``%.1f`` thread percentage, or the binary is not what it claims."""
        try:
            return parse_percentage(reply)
        except ControlCommandError:
            raise ControlBinaryError(
                '%s answered %r to %s, not a thread percentage: is it really nvidia-cuda-mps-control? (see %s)' % (
                    self.binary, reply.text[:200], reply.command, self.see_log), control_binary=self.binary) from None

    def offers(self, command_word: str, *, v3: bool = False) -> t.Optional[bool]:
        """Whether the binary's help text lists ``command_word`` (None: the help could not be read).

        Asked only where a resource wants a feature that older binaries lack and no running daemon has answered
        for it: ``-h`` prints the help and exits 0 without touching any daemon (r580, gpu-evidence probe2.txt).
        """
        cache = _HELP_TEXTS
        # v3: the help of -p 3 -h, which lists the modules (server, namespace) where the binary has v3 [ref 1.1]; r580
        # answers -p with "Unrecognized option" and its legacy help, exit 0 (gpu-evidence probe2.txt)
        key = self.binary + (' -p 3' if v3 else '')
        if key not in cache:
            try:
                proc = subprocess.run([self.binary] + (['-p', '3'] if v3 else []) + ['-h'], stdin=subprocess.DEVNULL,
                                      capture_output=True, timeout=10, env=control_env(self.environ), check=False)
                cache[key] = proc.stdout.decode('utf-8', 'replace') + proc.stderr.decode('utf-8', 'replace')
            except (OSError, subprocess.SubprocessError):
                cache[key] = ''
        text = cache[key]
        if 'nvidia-cuda-mps-control' not in text and 'MPS' not in text:
            return None
        return any(line.split()[:1] == [command_word] for line in text.splitlines())

    def ping(self) -> float:
        """One UI process: the daemon answers, sanely, or this raises (a v3 daemon: it lists the resource's server)."""
        if self.v3_server:
            from .._v3.control import read_v3  # pylint: disable=import-outside-toplevel
            seen = read_v3(self.client, self.v3_server)
            if not seen.ready:
                raise MpsError('the MPS v3 control daemon of %s answers, but its server %s is %s (see %s)' % (
                    self.paths.name, self.v3_server, 'not Ready (%s)' % seen.status if seen.found else 'not in its lists',
                    self.see_log))
            self.answered = True
            return 100.0
        answer = self.check_answer(self.query([SENTINEL])[0])
        self.answered = True
        return answer

    def lock(self) -> 'ResourceLock':
        return resource_lock(self.paths)

    def start(self, uuids: t.Sequence[str], *, multiuser: bool, replay: t.Sequence[str] = (), v3_config: str = '') -> int:
        """Run ``-d``, wait until the daemon answers, replay ``replay`` in the first UI session; return its pid.

        ``v3_config``: a v3 resource's file, applied with ``-d -p 3 -a <file>`` (``-m``, not ``-multiuser-server``, for
        multi-user [ref 1.2]); the start waits until the daemon lists the resource's server (:attr:`v3_server`)."""
        argv = [self.binary, '-d']
        if v3_config:
            argv += ['-p', '3', '-a', v3_config] + (['-m'] if multiuser else [])
        elif multiuser:
            argv.append('-multiuser-server')
        if wants_static(replay):
            argv.append(STATIC_OPTION)  # the replay creates SM partitions: static partitioning is fixed at the start
        if self.shm_dir:
            # A mount namespace of its own in which the shared tmpfs is /dev/shm; -d's daemon lives on in it.
            # slave, as systemd's BindPaths= has it: the host's unmounts still reach the namespace, so the
            # daemon never pins a file system the host has let go of; its own bind never leaks back.
            argv = self._in_shm_namespace(' && exec "$@"') + argv
        ensure_dir(self.paths.pipe_dir, 0o755)
        ensure_dir(self.paths.log_dir, self.log_mode)
        try:
            # The defaults documented as read from the daemon's environment (the thread percentage) are in
            # force from its first client; the replay below sets them again and everything else.
            env = dict(daemon_env(self.paths, uuids, self.environ), **start_environment(replay))
            proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  timeout=self.start_timeout, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            raise DaemonTimeoutError('%s -d did not return within %ss (see %s)' % (self.binary, self.start_timeout, self.see_log),
                                     log_file=self.control_log) from exc
        except OSError as exc:
            raise ControlBinaryError('cannot run %s: %s' % (self.binary, exc), control_binary=self.binary) from exc
        output = (proc.stdout + proc.stderr).strip()
        if ALREADY_RUNNING_TEXT in output:
            raise MpsError('another MPS control daemon started on %s at the same time' % self.paths.pipe_dir, stdout=output)
        if UNRECOGNIZED_OPTION_TEXT in output:
            # r580 answers an option it does not know (-S) with this line and its help, exit 0, and starts nothing
            raise ControlBinaryError('%s does not know an option of %s: it printed %r and its help text, and started no '
                                     'daemon' % (self.binary, ' '.join(argv[argv.index(self.binary):]),
                                                 output.splitlines()[0].replace('\x00', '').strip()), stdout=output)
        if proc.returncode != 0:
            raise ControlBinaryError('%s -d failed with status %d: %s (see %s)' % (
                self.binary, proc.returncode, output or '(no output)', self.see_log), rc=proc.returncode, stdout=output)
        try:
            self.wait_ready(() if v3_config else replay)
        except (ControlBinaryError, ControlCommandError, DaemonNotRunningError, DaemonTimeoutError) as exc:
            if not replay or isinstance(exc, ReplayRejectedError) or inspect(self.paths).running:
                raise
            # Killed (or crashed) after -d answered but before the session carrying the replay ended.
            raise MpsError('the MPS control daemon for %s died while its persisted limits were being replayed (%s); '
                           'nothing was recorded as started, and the next run starts it again and replays them - see %s' % (
                               self.paths.name, exc.msg, self.see_log), log_file=self.control_log) from exc
        state = inspect(self.paths)
        if not state.running or state.pid is None:
            raise MpsError('the MPS control daemon for %s exited right after starting (see %s)' % (self.paths.name, self.see_log))
        if self.shm_dir and daemon_dev_shm(state.pid, self.shm_dir) != self.shm_dir:
            raise MpsError('the MPS control daemon for %s (pid %d) does not see %s as its /dev/shm; it was left running - '
                           'see %s' % (self.paths.name, state.pid, self.shm_dir, self.see_log), pid=state.pid)
        return state.pid

    def unshare_binary(self) -> str:
        found = shutil.which('unshare', path=self.environ.get('PATH') or DEFAULT_PATH) or shutil.which('unshare', path=DEFAULT_PATH)
        if not found:
            raise InvalidParameterError('shm', 'running the daemon with its own /dev/shm needs unshare (util-linux), '
                                        'which is not installed')
        return found

    def _in_shm_namespace(self, then: str) -> t.List[str]:
        """A command line that binds the tmpfs on /dev/shm in a new mount namespace, then runs ``then``."""
        return [self.unshare_binary(), '--mount', '--propagation', 'slave', '--', '/bin/sh', '-c',
                'mount --bind "$0" /dev/shm' + then, str(self.shm_dir)]

    def check_shm_namespace(self) -> None:
        """Can a daemon get a mount namespace with the tmpfs as /dev/shm here? Asked before anything is stopped."""
        argv = self._in_shm_namespace('')
        try:
            proc = subprocess.run(argv, env=daemon_env(self.paths, [], self.environ), capture_output=True, text=True,
                                  timeout=self.start_timeout, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InvalidParameterError('shm', 'cannot give the daemon %s as /dev/shm: %s' % (self.shm_dir, exc)) from exc
        if proc.returncode != 0:
            raise InvalidParameterError('shm', 'cannot give the daemon %s as /dev/shm in a mount namespace of its own '
                                        '(needs root and CAP_SYS_ADMIN): %s' % (
                                            self.shm_dir, (proc.stderr or proc.stdout).strip() or 'status %d' % proc.returncode))

    def wait_ready(self, replay: t.Sequence[str] = ()) -> t.List[Reply]:
        """Poll with backoff until the daemon answers; the answering session also carries ``replay``."""
        if self.v3_server and not replay:
            # a v3 daemon (started by systemd from its environment file): ready once it lists the resource's server
            from .._v3.control import wait_server  # pylint: disable=import-outside-toplevel
            wait_server(self.client, self.v3_server, self.start_timeout, self.sleep, self.see_log)
            self.answered = True
            return []
        deadline = time.monotonic() + self.start_timeout
        delay = 0.01
        while True:
            try:
                replies = self.query(list(replay) + [SENTINEL])
                self.check_answer(replies[-1])
            except DaemonNotRunningError:
                if time.monotonic() + delay > deadline:
                    raise DaemonTimeoutError('the MPS control daemon for %s did not start answering within %ss (see %s)' % (
                        self.paths.name, self.start_timeout, self.see_log), log_file=self.control_log) from None
                self.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            try:
                check_applied(replies[:-1])
            except ControlCommandError as exc:
                pid = read_pid_file(self.paths.pipe_dir)
                raise ReplayRejectedError(
                    'the MPS control daemon for %s (pid %s) rejected a persisted limit replayed at its start - %s; it was left '
                    'running, and nothing was recorded as started (fix the limit with gpufleet.mps.mps_limits; see %s)' % (
                        self.paths.name, pid if pid else 'unknown', exc.msg, self.see_log),
                    pid=pid, log_file=self.control_log) from None
            return replies

    def end_v3_server(self, server: str) -> None:
        """Before a v3 daemon's stop that ends its clients (busy=terminate): ``server delete <server> --force``, which
        "terminates them first" [mps-v3-reference 1.3] - what ``-q`` does to attached clients is unknown (the simulator's
        waits for them). A server already gone is no error."""
        rc, text = self.client.argv(['server', 'delete', server, '--force'])
        if rc != 0 and 'not found' not in text.lower():
            raise ControlCommandError('the MPS v3 daemon of %s refused "server delete %s --force": %s' % (
                self.paths.name, server, text or 'status %d' % rc), rc=rc, stdout=text)

    def stop(self, pid: t.Optional[int], *, v3: bool = False) -> bool:
        """``quit -t <stop_timeout>`` (a v3 daemon: ``-q``) and wait for the daemon to be gone; return True when it had to
        be forced.

        Whether the UI exits non-zero after ``quit`` is undocumented (a session the daemon drops as it exits
        is non-zero for the tool with the same front end), so the answer is whether the daemon went away:
        a failing UI is only an error when the daemon is still there afterwards.
        """
        started = time.monotonic()
        failure: t.Optional[MpsError] = None
        rejected: t.Optional[str] = None
        if pid is None:
            # found before quit: a daemon may release its lock and remove its pid file before its process is gone
            pid = inspect(self.paths).pid
        try:
            self.client.timeout = self.stop_timeout + self.start_timeout
            if v3:
                # quit is a legacy word; v3 has -q ("Quit and stop the control daemon and all running servers", r580's -q is
                # another option), which takes no timeout (whether it waits for clients is [U])
                rc, text = self.client.argv(['-q'])
                rejected = text if rc != 0 else None
            else:
                reply = self.query([quit_command(self.stop_timeout)])[0]
                # quit prints nothing; any text is the daemon refusing it (quit needs root: "Permission denied").
                rejected = reply.text or None
        except DaemonNotRunningError:
            pass  # its socket is gone; the process may still be on its way out
        except (ControlBinaryError, ControlCommandError) as exc:
            failure = exc
        finally:
            self.client.timeout = self.start_timeout
        grace = self.stop_timeout + self.start_timeout
        if rejected is not None:
            # A refused quit stops nothing: say so at once, with the daemon's words, rather than after the
            # whole grace period. A short wait still forgives a daemon that printed something and went.
            grace = min(grace, REJECTED_QUIT_GRACE)
        delay = 0.01
        while self._still_there(pid):
            if time.monotonic() - started > grace:
                if rejected is not None:
                    raise ControlCommandError('the MPS control daemon for %s (pid %s) rejected quit: %s; it was left running' % (
                        self.paths.name, pid if pid else 'unknown', rejected), pid=pid, log_file=self.control_log)
                raise DaemonTimeoutError('the MPS control daemon for %s (pid %s) did not exit within %ss after quit%s; it was left '
                                         'running (see %s)' % (self.paths.name, pid if pid else 'unknown', grace,
                                                               ' (%s)' % failure.msg if failure else '', self.see_log),
                                         pid=pid, log_file=self.control_log)
            self.sleep(delay)
            delay = min(delay * 2, 0.25)
        return time.monotonic() - started >= self.stop_timeout > 0

    def _still_there(self, pid: t.Optional[int]) -> bool:
        """The daemon has not exited yet: its process lives on, or (no pid found before quit) a live process holds its lock
        or is the pid file's control daemon - never a connect: the real daemon's sockets outlive it, and each connect is
        a line in its control.log."""
        if pid is not None:
            return pid_alive(pid) and is_zombie(pid) is False
        return inspect(self.paths).pid is not None

    def clean_stale(self) -> t.List[str]:
        """Remove the files a dead daemon left in the pipe directory; return their names."""
        removed = []
        for name in PIPE_DIR_FILES:
            path = os.path.join(self.paths.pipe_dir, name)
            if os.path.lexists(path):
                os.unlink(path)
                removed.append(name)
        return removed


def end_orphan(pid: int, timeout: float) -> None:
    """End a control daemon that no pipe directory leads to (quit cannot reach it): TERM, then KILL after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while pid_alive(pid) and is_zombie(pid) is False:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return
    raise DaemonTimeoutError('the orphaned MPS control daemon pid %d did not exit after SIGKILL' % pid, pid=pid)


def require_binary(path: t.Optional[str], param: str = 'control_binary') -> str:
    """An executable file, or a clear error naming ``param``."""
    if not path:
        raise InvalidParameterError(param, 'nvidia-cuda-mps-control was not found on PATH; install the NVIDIA driver '
                                    'utilities or give its absolute path')
    if not os.path.isabs(path):
        raise InvalidParameterError(param, '%r must be an absolute path' % path)
    if not os.path.isfile(path):
        raise InvalidParameterError(param, '%s does not exist' % path)
    # os.access() says "executable" to root for any file with one x bit; demand the owner's.
    if not os.stat(path).st_mode & stat.S_IXUSR or not os.access(path, os.X_OK):
        raise InvalidParameterError(param, '%s is not executable' % path)
    return path
