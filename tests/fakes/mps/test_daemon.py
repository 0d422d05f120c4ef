# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The control daemon: -d/-f, files, lock, pid file, logs (reference section 1)."""
from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, SIM, SimHost, pid_alive, wait_until, write_ini
import mps_common
import mps_daemon
import mps_sim

CONTROL_RE = re.compile(r'^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}) Control ([ \d]{5})\] (.*)$')


def test_d_parent_exits_0_printing_nothing_once_the_daemon_listens(host: SimHost) -> None:
    proc = host.start(check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '', '')
    # no wait: the socket is there and answers as soon as -d returned
    assert stat.S_ISSOCK(os.lstat(os.path.join(host.pipe, 'control')).st_mode)
    assert host.ui(['get_server_list']).returncode == 0


def test_d_starts_no_server(running: SimHost) -> None:
    assert running.out(['get_server_list']) == ''
    assert not [m for m in running.log_messages() if 'Starting new server' in m]


def test_pipe_dir_holds_exactly_the_five_entries_with_their_modes(running: SimHost) -> None:
    got = {}
    for name in os.listdir(running.pipe):
        st = os.lstat(os.path.join(running.pipe, name))
        kind = 'socket' if stat.S_ISSOCK(st.st_mode) else 'fifo' if stat.S_ISFIFO(st.st_mode) else 'file' if stat.S_ISREG(st.st_mode) else '?'
        got[name] = (kind, oct(stat.S_IMODE(st.st_mode)))
    assert got == {
        'control': ('socket', '0o666'),
        'control_lock': ('file', '0o666'),
        'control_privileged': ('socket', '0o755'),
        'log': ('fifo', '0o777'),
        'nvidia-cuda-mps-control.pid': ('file', '0o666'),
    }


def test_modes_do_not_depend_on_umask(host: SimHost) -> None:
    old = os.umask(0o077)
    try:
        host.start()
    finally:
        os.umask(old)
    modes = {n: stat.S_IMODE(os.lstat(os.path.join(host.pipe, n)).st_mode) for n in os.listdir(host.pipe)}
    assert modes['control'] == 0o666 and modes['control_lock'] == 0o666 and modes['log'] == 0o777


def test_pid_file_holds_the_daemon_pid_without_newline(running: SimHost) -> None:
    with open(os.path.join(running.pipe, 'nvidia-cuda-mps-control.pid'), 'rb') as handle:
        raw = handle.read()
    assert re.fullmatch(rb'\d+', raw)
    pid = int(raw)
    assert pid_alive(pid)
    with open(f'/proc/{pid}/cmdline', 'rb') as handle:
        assert b'mps_sim.py' in handle.read()


def test_daemon_is_detached_in_its_own_session(running: SimHost) -> None:
    pid = running.daemon_pid()
    # double fork: a new session, of which the daemon is not the leader (it can never get a terminal)
    assert os.getsid(pid) != os.getsid(0)
    assert os.getsid(pid) != pid
    assert os.readlink(f'/proc/{pid}/fd/0') == '/dev/null'
    assert os.readlink(f'/proc/{pid}/cwd') == '/'


def test_control_lock_is_write_locked_by_the_daemon(running: SimHost) -> None:
    fd = os.open(os.path.join(running.pipe, 'control_lock'), os.O_RDWR)
    try:
        with pytest.raises(OSError) as info:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert info.value.errno in (errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)


def test_second_d_prints_already_running_on_stdout_and_exits_1(running: SimHost) -> None:
    pid = running.daemon_pid()
    proc = running.start(check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, 'An instance of this daemon is already running\n', '')
    assert running.daemon_pid() == pid and pid_alive(pid)
    assert running.out(['get_default_active_thread_percentage']) == '100.0\n'


def test_f_on_a_running_pipe_dir_prints_already_running(running: SimHost) -> None:
    proc = running.foreground()
    out = proc.communicate(timeout=10)[0]
    assert proc.returncode == 1
    assert out == 'An instance of this daemon is already running\n'


def test_sigkill_leaves_all_files_and_a_new_d_starts(running: SimHost) -> None:
    pid = running.daemon_pid()
    before = sorted(os.listdir(running.pipe))
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    assert sorted(os.listdir(running.pipe)) == before
    proc = running.ui(['get_server_list'])
    assert (proc.returncode, proc.stderr) == (1, 'Cannot find MPS control daemon process\n')
    running.start()
    new = running.daemon_pid()
    assert new != pid and pid_alive(new)
    assert running.out(['get_default_active_thread_percentage']) == '100.0\n'
    assert sorted(os.listdir(running.pipe)) == before


def test_control_log_lines_have_the_real_format(running: SimHost) -> None:
    running.out(['get_default_active_thread_percentage'])
    pid = running.daemon_pid()
    lines = running.control_log()
    assert lines
    for line in lines:
        match = CONTROL_RE.match(line)
        assert match, line
        assert match.group(2) == f'{pid:5d}'


def test_start_logs_the_socket_and_the_pipe_dir_lines(running: SimHost) -> None:
    pid = running.daemon_pid()
    messages = running.log_messages()
    assert messages[:2] == [
        f'Starting control daemon using socket {running.pipe}/control',
        f'To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={running.pipe}',
    ]
    assert running.control_log()[0].endswith(f' Control {pid:5d}] Starting control daemon using socket {running.pipe}/control')


def test_log_dir_holds_control_and_server_log(running: SimHost) -> None:
    assert sorted(os.listdir(running.logdir)) == ['control.log', 'server.log']


def _warning(log: str) -> str:
    return f'Warning: Failed writing log files to directory [{log}]. No logs will be available.'


def test_d_with_a_missing_pipe_dir_exits_1_and_starts_nothing(host: SimHost) -> None:
    # r580 (gpu-evidence compare.json, step 'start' of the real binary): Warning, Cannot access, Warning; exit 1
    proc = host.start(check=False, make_dirs=False)
    assert (proc.returncode, proc.stderr) == (1, '')
    assert proc.stdout == f'{_warning(host.logdir)}\nCannot access CUDA_MPS_PIPE_DIRECTORY={host.pipe}\n{_warning(host.logdir)}\n'
    assert sorted(os.listdir(host.base)) == ['nvml.ini']  # nothing created
    assert not _processes_naming(host.pipe)
    again = host.start(check=False, make_dirs=False)  # and again: the same
    assert (again.returncode, again.stdout) == (1, proc.stdout)


def test_d_with_a_missing_pipe_dir_and_a_log_dir_prints_only_cannot_access(host: SimHost) -> None:
    os.mkdir(host.logdir)
    proc = host.start(check=False, make_dirs=False)
    assert (proc.returncode, proc.stdout) == (1, f'Cannot access CUDA_MPS_PIPE_DIRECTORY={host.pipe}\n')  # [I]
    assert not os.path.exists(host.pipe) and os.listdir(host.logdir) == []


def test_d_with_a_missing_log_dir_warns_and_runs_without_logs(host: SimHost) -> None:
    os.mkdir(host.pipe)
    proc = host.start(check=False, make_dirs=False)
    assert (proc.returncode, proc.stdout) == (0, f'{_warning(host.logdir)}\n')  # [I]: not recorded on r580
    assert host.out(['get_default_active_thread_percentage']) == '100.0\n'
    assert host.client('--once').info()['ok'] is True
    assert not os.path.exists(host.logdir)
    host.quit()


def test_missing_dirs_create_is_the_old_behaviour(host: SimHost) -> None:
    deep_pipe = os.path.join(host.base, 'a', 'pipe')
    deep_log = os.path.join(host.base, 'b', 'log')
    proc = host.start(env={'CUDA_MPS_PIPE_DIRECTORY': deep_pipe, 'CUDA_MPS_LOG_DIRECTORY': deep_log, 'FAKE_MPS_MISSING_DIRS': 'create'},
                      check=False, make_dirs=False)
    assert (proc.returncode, proc.stdout) == (0, '')
    assert os.path.exists(os.path.join(deep_pipe, 'control'))
    assert os.path.exists(os.path.join(deep_log, 'control.log'))
    host.ui(['quit'], env={'CUDA_MPS_PIPE_DIRECTORY': deep_pipe})


def test_default_dirs_are_tmp_nvidia_mps_and_var_log_nvidia_mps() -> None:
    cfg = mps_daemon.DaemonConfig.from_env({})
    assert (cfg.pipe_dir, cfg.log_dir) == ('/tmp/nvidia-mps', '/var/log/nvidia-mps')
    assert cfg.gpus == []


def test_foreground_logs_to_stdout_and_quit_ends_it_with_0(host: SimHost) -> None:
    proc = host.foreground()
    wait_until(lambda: os.path.exists(os.path.join(host.pipe, 'nvidia-cuda-mps-control.pid')), what='pid file')
    wait_until(lambda: host.ui(['get_server_list']).returncode == 0, what='daemon answers')
    pid = host.daemon_pid()
    assert pid == proc.pid
    host.out(['quit'])
    out = proc.communicate(timeout=10)[0]
    assert proc.returncode == 0
    assert f'Control {pid:5d}] Starting control daemon using socket {host.pipe}/control' in out
    assert 'Cmd:quit' in out


@pytest.mark.parametrize('args', [['-d', '-S'], ['-d', '-p', '3'], ['-x'], ['-S', '-d']])
def test_an_unknown_option_prints_unrecognized_option_and_the_help_and_exits_0(host: SimHost, args: list[str]) -> None:
    # r580 (gpu-evidence probe2.txt, -d -S and -d -p 3): the line ends in a NUL byte; no daemon, exit 0
    host.make_dirs(host.environ())
    proc = subprocess.run([PYTHON, SIM, *args], env=host.environ(), capture_output=True, timeout=15, check=False, cwd=host.base)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b'Unrecognized option \x00\n' + mps_sim.R580_HELP.encode(), b'')
    assert os.listdir(host.pipe) == [] and not _processes_naming(host.pipe)


@pytest.mark.parametrize('flag', ['-h', '--help'])
def test_help_prints_the_r580_help_text_and_exits_0(host: SimHost, flag: str) -> None:
    proc = host.start(flag, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, mps_sim.R580_HELP, '')
    lines = proc.stdout.split('\n')
    # the first and last lines as probe2.txt holds them (the whole text was copied from it)
    assert lines[:2] == ['CUDA MPS Control for Linux/Unix/QNX.', 'Copyright (C) 2003 - 2025 NVIDIA Corporation.']
    assert '  -f,--forground           Setup the daemon in the foreground' in lines
    assert lines[-4:] == ['  device_query [<PID>] [--csv]', '                       Enumerate all usable devices', '', '']
    assert os.listdir(host.pipe) == []


@pytest.mark.parametrize('args', [['--daemon'], ['-d', '-q'], ['-d', '--ready-devices'], ['-d', '-M'], ['-d', '--multiuser-server']])
def test_r580_long_options_start_the_daemon(host: SimHost, args: list[str]) -> None:
    host.start(*args)
    assert host.state()['multiuser'] is any('-M' in a or 'multiuser' in a for a in args)


@pytest.mark.parametrize('args', [['-d', '-f'], ['-multiuser-server'], ['-d', '-d'], ['get_server_list']])
def test_unrecorded_argument_sets_print_the_help_and_exit_1(host: SimHost, args: list[str]) -> None:
    proc = host.start(*args, check=False, make_dirs=False)
    assert (proc.returncode, proc.stdout) == (1, mps_sim.R580_HELP)
    assert not os.path.exists(host.pipe)


@pytest.mark.parametrize('args,rc', [(['-x'], 1), (['-d', '-S'], 1), (['-h'], 0), (['-d', '-f'], 1)])
def test_usage_short_is_the_old_usage_text(host: SimHost, args: list[str], rc: int) -> None:
    proc = host.start(*args, env={'FAKE_MPS_USAGE': 'short'}, check=False)
    assert (proc.returncode, proc.stdout) == (rc, mps_sim.USAGE + '\n')
    assert os.listdir(host.pipe) == []


def test_multiuser_server_requires_root(host: SimHost) -> None:
    # the interpreter lives under /root (0700): fork the already-loaded simulator and drop privileges there
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - child process
        try:
            os.close(read_fd)
            os.dup2(write_fd, 1)
            sys.stdout = os.fdopen(1, 'w')
            os.environ['CUDA_MPS_PIPE_DIRECTORY'] = host.pipe
            os.environ['CUDA_MPS_LOG_DIRECTORY'] = host.logdir
            os.setgid(65534)
            os.setuid(65534)
            code = mps_sim.main(['nvidia-cuda-mps-control', '-d', '-multiuser-server'])
        except BaseException:  # pylint: disable=broad-exception-caught
            code = 99
        sys.stdout.flush()
        os._exit(code)  # pylint: disable=protected-access
    os.close(write_fd)
    with os.fdopen(read_fd) as handle:
        out = handle.read()
    status = os.waitpid(child, 0)[1]
    assert os.waitstatus_to_exitcode(status) == 1
    assert out == 'The -multiuser-server option requires root privileges\n'
    assert not os.path.exists(host.pipe)


def test_multiuser_server_as_root_starts(host: SimHost) -> None:
    host.start('-d', '-multiuser-server')
    assert host.state()['multiuser'] is True


def _pipe_of_control_length(host: SimHost, length: int) -> str:
    prefix = os.path.join(host.base, 'x')
    pad = length - len(prefix) - len('/control')
    assert pad > 0
    return prefix + 'y' * pad


# FAKE_MPS_PIPE_DIR_MAX (87 by default) fails every pipe dir long enough to reach the socket limit: lift it
LONG_PIPES_ALLOWED = {'FAKE_MPS_PIPE_DIR_MAX': '200'}


def test_control_path_of_107_bytes_works(host: SimHost) -> None:
    pipe = _pipe_of_control_length(host, 107)
    assert len(os.path.join(pipe, 'control')) == 107
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe, **LONG_PIPES_ALLOWED}
    host.start(env=env)
    assert host.ui(['get_default_active_thread_percentage'], env=env).stdout == '100.0\n'
    assert sorted(os.listdir(pipe)) == sorted(mps_common.PIPE_FILES)
    host.ui(['quit'], env=env)


def test_control_path_over_107_bytes_cannot_bind_and_ui_cannot_find_the_daemon(host: SimHost) -> None:
    pipe = _pipe_of_control_length(host, 108)
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe, **LONG_PIPES_ALLOWED}
    proc = host.start(env=env, check=False)
    assert (proc.returncode, proc.stdout) == (0, '')  # FAKE_MPS_BIND_FAILURE=silent (default)
    assert host.wait_log(f'Failed to bind socket {pipe}/control')
    assert not os.path.exists(os.path.join(pipe, 'control'))
    ui = host.ui(['get_server_list'], env=env)
    assert (ui.returncode, ui.stderr) == (1, 'Cannot find MPS control daemon process\n')
    # the daemon did not stay: nothing holds the lock
    fd = os.open(os.path.join(pipe, 'control_lock'), os.O_RDWR)
    try:
        wait_until(lambda: _lockable(fd), what='lock released')
    finally:
        os.close(fd)


def _lockable(fd: int) -> bool:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.lockf(fd, fcntl.LOCK_UN)
    return True


def test_quit_removes_the_log_fifo_and_the_pid_file_and_leaves_refusing_sockets(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "quit -t 3" and "idle quit"): control, control_privileged, control_lock stay;
    # connecting to control: ECONNREFUSED
    running.quit()
    assert sorted(os.listdir(running.pipe)) == ['control', 'control_lock', 'control_privileged']
    for name in ('control', 'control_privileged'):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with pytest.raises(ConnectionRefusedError):
            sock.connect(os.path.join(running.pipe, name))
        sock.close()
    assert not proc_locks(os.path.join(running.pipe, 'control_lock'))
    proc = running.ui(['get_server_list'])
    assert (proc.returncode, proc.stderr) == (1, 'Cannot find MPS control daemon process\n')


def test_quit_logs_r580s_shutdown_lines_and_exit_status(running: SimHost) -> None:
    # r580 (gpu-evidence probe3.txt, the control.log tail): no `UI closed` after quit
    spid = running.client('--once').info()['server_pid']
    running.quit()
    assert running.log_messages()[-6:] == ['Accepting connection...', 'NEW UI', 'Cmd:quit',
                                           f'Try shutting down server {spid}, backoff is disabled',
                                           f'Server {spid} exited with status 0', 'Exit with status 0']


def test_idle_quit_logs_exit_with_status_0(running: SimHost) -> None:
    running.quit()
    assert running.log_messages()[-4:] == ['Accepting connection...', 'NEW UI', 'Cmd:quit', 'Exit with status 0']


def test_restart_after_quit_works_and_appends_to_the_logs(running: SimHost) -> None:
    first = running.daemon_pid()
    running.quit()
    running.start()
    assert running.daemon_pid() != first
    starts = [m for m in running.log_messages() if m.startswith('Starting control daemon')]
    assert len(starts) == 2


def test_daemon_sigterm_ends_it_and_its_servers_and_leaves_every_file(running: SimHost) -> None:
    # r580 (gpu-evidence probe3.txt, "TERM to the control daemon"): the pid file stays too
    pid = running.daemon_pid()
    running.out(['start_server -uid 0'])
    spid = wait_until(running.servers, what='server')[0]  # type: ignore[index]
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(pid) and not pid_alive(spid), what='daemon and server exit')
    assert sorted(os.listdir(running.pipe)) == sorted(mps_common.PIPE_FILES)
    assert running.daemon_pid() == pid
    running.start()
    assert running.daemon_pid() != pid


def test_invalid_switch_value_refuses_to_start(host: SimHost) -> None:
    proc = host.start(env={'FAKE_MPS_ERROR_STYLE': 'bogus'}, check=False)
    assert proc.returncode == 2
    assert 'FAKE_MPS_ERROR_STYLE' in proc.stderr


def test_runs_through_a_wrapper_named_like_the_real_binary(host: SimHost) -> None:
    # what `make simhost` writes: .simhost/bin/nvidia-cuda-mps-control execs the simulator
    bindir = os.path.join(host.base, 'bin')
    os.mkdir(bindir)
    wrapper = os.path.join(bindir, 'nvidia-cuda-mps-control')
    with open(wrapper, 'w', encoding='utf-8') as handle:
        handle.write(f'#!/bin/sh\nexec {PYTHON} {SIM} "$@"\n')
    os.chmod(wrapper, 0o755)
    env = host.environ(PATH=f'{bindir}:{os.environ.get("PATH", "")}')
    host.make_dirs(env)
    proc = subprocess.run(['nvidia-cuda-mps-control', '-d'], env=env, capture_output=True, text=True, timeout=15, check=False)
    assert (proc.returncode, proc.stdout) == (0, '')
    proc = subprocess.run(['nvidia-cuda-mps-control'], input='get_default_active_thread_percentage', env=env, capture_output=True,
                          text=True, timeout=15, check=False)
    assert (proc.returncode, proc.stdout) == (0, '100.0\n')


def test_once_quit_returns_the_files_are_gone_and_a_new_d_starts_at_once(running: SimHost) -> None:
    for _attempt in range(3):
        assert running.out(['quit']) == ''
        assert sorted(os.listdir(running.pipe)) == ['control', 'control_lock', 'control_privileged']
        proc = running.start(check=False)
        assert (proc.returncode, proc.stdout) == (0, '')


def _ui_as_nobody(host: SimHost, commands: str) -> tuple[int, str]:
    read_fd, write_fd = os.pipe()
    in_r, in_w = os.pipe()
    os.write(in_w, commands.encode())
    os.close(in_w)
    child = os.fork()
    if child == 0:  # pragma: no cover - child process
        try:
            os.close(read_fd)
            os.dup2(write_fd, 1)
            os.dup2(in_r, 0)
            sys.stdout = os.fdopen(1, 'w')
            sys.stdin = os.fdopen(0, 'r')
            os.environ['CUDA_MPS_PIPE_DIRECTORY'] = host.pipe
            os.setgid(65534)
            os.setuid(65534)
            code = mps_sim.main(['nvidia-cuda-mps-control'])
        except BaseException:  # pylint: disable=broad-exception-caught
            code = 99
        sys.stdout.flush()
        os._exit(code)  # pylint: disable=protected-access
    os.close(write_fd)
    os.close(in_r)
    with os.fdopen(read_fd) as handle:
        out = handle.read()
    status = os.waitpid(child, 0)[1]
    return os.waitstatus_to_exitcode(status), out


def test_non_root_ui_may_read_but_not_change(running: SimHost) -> None:
    code, out = _ui_as_nobody(running, 'get_default_active_thread_percentage\nset_default_active_thread_percentage 10\nquit\n')
    assert code == 0
    assert out == ('100.0\nPermission denied: set_default_active_thread_percentage requires root\n'
                   'Permission denied: quit requires root\n')
    assert running.out(['get_default_active_thread_percentage']) == '100.0\n'


def test_log_line_reproduces_the_real_format() -> None:
    line = mps_daemon.log_line('Control', 72, 'Starting control daemon using socket /mps/nvidia.com/gpu/pipe/control')
    assert re.fullmatch(r'\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} Control    72\] Starting control daemon using socket '
                        r'/mps/nvidia\.com/gpu/pipe/control', line)
    assert mps_daemon.log_line('Control', 11107, 'x').endswith(' Control 11107] x')
    assert mps_daemon.log_line('Other', 337, 'Startup').endswith(' Other   337] Startup')


def test_d_returns_even_when_the_caller_leaks_a_pipe_to_it(host: SimHost) -> None:
    # a caller that waits for EOF on a pipe it passed down must not wait for the daemon
    read_fd, write_fd = os.pipe()
    host.make_dirs(host.environ())
    proc = subprocess.run([PYTHON, SIM, '-d'], env=host.environ(), pass_fds=(write_fd,), capture_output=True, text=True,
                          timeout=15, check=False)
    os.close(write_fd)
    assert proc.returncode == 0
    ready = select.select([read_fd], [], [], 5)[0]
    assert ready and os.read(read_fd, 1) == b''  # EOF: the daemon did not keep the pipe
    os.close(read_fd)
    assert host.out(['get_server_list']) == ''


# --------------------------------------------------------------------------
# FAKE_MPS_LOCK_KIND: which lock on control_lock, and so what /proc/locks shows ([U], reference section 7)
# --------------------------------------------------------------------------

def proc_locks(path: str) -> list[tuple[str, str]]:
    """(kind, pid) of every /proc/locks entry on the file at path, e.g. ('POSIX', '4242') or ('OFDLCK', '-1')."""
    st = os.stat(path)
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    found = []
    with open('/proc/locks', encoding='ascii') as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 1 and fields[1] == '->':  # a waiter, not a holder
                continue
            major, minor, inode = fields[5].split(':')
            if (int(major, 16), int(minor, 16), int(inode)) == wanted:
                found.append((fields[1], fields[4]))
    return found


@pytest.mark.parametrize('kind,shown', [('', 'POSIX'), ('posix', 'POSIX'), ('ofd', 'OFDLCK'), ('flock', 'FLOCK'), ('hidden', None)])
def test_lock_kind_decides_what_proc_locks_shows(host: SimHost, kind: str, shown: str) -> None:
    host.start(env={'FAKE_MPS_LOCK_KIND': kind})
    pid = host.daemon_pid()
    lock = os.path.join(host.pipe, 'control_lock')
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o666
    pid_column = '-1' if shown == 'OFDLCK' else str(pid)  # an OFD lock belongs to an open file, not to a process
    assert proc_locks(lock) == ([] if shown is None else [(shown, pid_column)])


@pytest.mark.parametrize('kind', ['posix', 'ofd', 'flock', 'hidden'])
def test_every_lock_kind_keeps_one_instance_and_dies_with_the_daemon(host: SimHost, kind: str) -> None:
    env = {'FAKE_MPS_LOCK_KIND': kind}
    host.start(env=env)
    pid = host.daemon_pid()
    again = host.start(env=env, check=False)
    assert (again.returncode, again.stdout, again.stderr) == (1, 'An instance of this daemon is already running\n', '')
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    host.start(env=env)  # the kernel dropped the lock with the process: the leftovers do not block
    second = host.daemon_pid()
    assert second != pid
    host.quit()
    host.start(env=env)  # nor does a clean quit's
    assert host.daemon_pid() != second


def test_lock_kind_rejects_unknown_values(host: SimHost) -> None:
    proc = host.start(env={'FAKE_MPS_LOCK_KIND': 'mandatory'}, check=False)
    assert proc.returncode == 2 and 'FAKE_MPS_LOCK_KIND' in proc.stderr


# --------------------------------------------------------------------------
# FAKE_MPS_PIPE_DIR_MAX: a pipe dir over 87 bytes fails silently ([O], NVIDIA forum, driver 535)
# --------------------------------------------------------------------------

def _pipe_of_length(host: SimHost, length: int) -> str:
    prefix = os.path.join(host.base, 'q')
    return prefix + 'z' * (length - len(prefix))


def _processes_naming(text: str) -> list[int]:
    """Pids whose environment or command line holds text."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f'/proc/{entry}/environ', 'rb') as env, open(f'/proc/{entry}/cmdline', 'rb') as cmd:
                    if text.encode() in env.read() + cmd.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_pipe_dir_of_87_bytes_works(host: SimHost) -> None:
    pipe = _pipe_of_length(host, 87)
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe}
    host.start(env=env)
    assert host.ui(['get_default_active_thread_percentage'], env=env).stdout == '100.0\n'
    host.ui(['quit'], env=env)


@pytest.mark.parametrize('length', [88, 99])
def test_pipe_dir_over_87_bytes_exits_1_silently_after_two_log_lines(host: SimHost, length: int) -> None:
    # r580 (gpu-evidence probe.txt, len=88)
    pipe = _pipe_of_length(host, length)
    assert len(pipe.encode()) == length
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe}
    proc = host.start(env=env, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, '', '')
    assert sorted(os.listdir(pipe)) == ['control_lock', 'log']
    assert stat.S_ISFIFO(os.lstat(os.path.join(pipe, 'log')).st_mode)
    assert host.log_messages() == [f'Starting control daemon using socket {pipe}/control',
                                   f'To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}']
    wait_until(lambda: not _processes_naming(pipe), what='no daemon left')
    assert not proc_locks(os.path.join(pipe, 'control_lock'))
    ui = host.ui(['get_server_list'], env=env)
    assert (ui.returncode, ui.stderr) == (1, 'Cannot find MPS control daemon process\n')


@pytest.mark.parametrize('length', [88, 99])
def test_long_pipe_forum_fails_silently_with_exit_0(host: SimHost, length: int) -> None:
    pipe = _pipe_of_length(host, length)
    assert len(pipe.encode()) == length
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe, 'FAKE_MPS_LONG_PIPE': 'forum'}
    proc = host.start(env=env, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '', '')
    # only the lock and the log FIFO are left, nothing was logged, no daemon stays
    assert sorted(os.listdir(pipe)) == ['control_lock', 'log']
    assert stat.S_ISFIFO(os.lstat(os.path.join(pipe, 'log')).st_mode)
    assert stat.S_IMODE(os.lstat(os.path.join(pipe, 'log')).st_mode) == 0o777
    assert host.control_log() == []
    wait_until(lambda: not _processes_naming(pipe), what='no daemon left')
    assert not proc_locks(os.path.join(pipe, 'control_lock'))
    ui = host.ui(['get_server_list'], env=env)
    assert (ui.returncode, ui.stderr) == (1, 'Cannot find MPS control daemon process\n')


def test_pipe_dir_max_moves_the_limit(host: SimHost) -> None:
    pipe = _pipe_of_length(host, 88)
    env = {'CUDA_MPS_PIPE_DIRECTORY': pipe, 'FAKE_MPS_PIPE_DIR_MAX': '88'}
    host.start(env=env)
    assert host.ui(['get_server_list'], env=env).returncode == 0
    host.ui(['quit'], env=env)


def test_pipe_dir_max_is_counted_in_bytes_as_given(host: SimHost) -> None:
    pipe = os.path.join(host.base, 'é' * 20)  # 40 bytes of name
    proc = host.start(env={'CUDA_MPS_PIPE_DIRECTORY': pipe, 'FAKE_MPS_PIPE_DIR_MAX': str(len(pipe) + 19)}, check=False)
    assert proc.returncode == 1
    assert sorted(os.listdir(pipe)) == ['control_lock', 'log']


@pytest.mark.parametrize('value', ['long', '-1', '8.5'])
def test_pipe_dir_max_must_be_a_number_of_bytes(host: SimHost, value: str) -> None:
    proc = host.start(env={'FAKE_MPS_PIPE_DIR_MAX': value}, check=False)
    assert proc.returncode == 2 and 'FAKE_MPS_PIPE_DIR_MAX' in proc.stderr


# --------------------------------------------------------------------------
# control.log's third start line on r580+ drivers ([O], reference section 7)
# --------------------------------------------------------------------------

@pytest.mark.parametrize('driver,cuda,line', [
    ('580.65.06', '13000', 'CUDA MPS Control binary version: 13000'),
    ('590.44.01', '13010', 'CUDA MPS Control binary version: 13010'),
    ('570.124.06', '12080', None),
    ('535.183.01', '12020', None),
])
def test_start_logs_the_binary_version_from_r580(host: SimHost, driver: str, cuda: str, line: str) -> None:
    write_ini(host.ini, driver=driver, cuda=cuda)
    host.start()
    # the daemon's whole log once -d returned: the start lines, in this order
    assert host.log_messages() == [f'Starting control daemon using socket {host.pipe}/control',
                                   f'To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={host.pipe}',
                                   *([line] if line else [])]


# --------------------------------------------------------------------------
# The pipe dir deleted under a live daemon (r580: gpu-evidence probe3.txt)
# --------------------------------------------------------------------------

def test_pipe_dir_deleted_under_a_live_daemon_leaves_it_alive_and_unreachable_and_a_second_d_starts(host: SimHost) -> None:
    host.start()
    first = host.daemon_pid()
    shutil.rmtree(host.pipe)
    time.sleep(0.3)
    assert pid_alive(first)
    proc = host.ui(['get_server_list'])
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, '', 'Cannot find MPS control daemon process\n')
    host.start()  # the directory re-created: a second daemon
    second = host.daemon_pid()
    assert second != first and pid_alive(first) and pid_alive(second)
    client = host.client('--once')
    assert client.info()['ok'] is True
    host.quit()  # reaches the second only
    assert not pid_alive(second) and pid_alive(first)
    with open(f'/proc/{first}/environ', 'rb') as handle:  # the first is found only by its process
        assert f'CUDA_MPS_PIPE_DIRECTORY={host.pipe}'.encode() in handle.read().split(b'\0')
