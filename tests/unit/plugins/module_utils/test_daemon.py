# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _proc
from ansible_collections.gpufleet.mps.plugins.module_utils._resource import lock as _lock
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor import liveness as _liveness, process as _daemon
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import (
    ControlBinaryError, ControlCommandError, DaemonNotRunningError, DaemonTimeoutError, MpsError, ReplayRejectedError,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing import Reply
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import resource_paths


@pytest.fixture
def paths(tmp_path):
    p = resource_paths(str(tmp_path), 'res')
    os.makedirs(p.pipe_dir)
    return p


def test_lock_holders_reads_proc_locks_for_the_files_inode(tmp_path):
    target = tmp_path / 'control_lock'
    target.write_text('')
    st = os.stat(target)
    devino = '%02x:%02x:%d' % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    locks = tmp_path / 'locks'
    locks.write_text(
        '1: POSIX  ADVISORY  WRITE 4242 %s 0 EOF\n'
        '1: -> POSIX  ADVISORY  WRITE 5151 %s 0 EOF\n'
        '2: FLOCK  ADVISORY  WRITE 99 00:01:1 0 EOF\n' % (devino, devino))
    assert _proc.lock_holders(str(target), str(locks)) == [4242]


def test_lock_holders_is_empty_for_a_missing_file_and_unknown_without_proc_locks(tmp_path):
    assert _proc.lock_holders(str(tmp_path / 'nope')) == []
    (tmp_path / 'f').write_text('')
    assert _proc.lock_holders(str(tmp_path / 'f'), str(tmp_path / 'no-proc-locks')) is None


def _listen(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(path)
    sock.listen(4)
    return sock


def _hold_lock(paths):
    lock = os.open(os.path.join(paths.pipe_dir, 'control_lock'), os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(os.path.join(paths.pipe_dir, _liveness.PID_FILE), 'w') as handle:
        handle.write(str(os.getpid()))
    return lock


def test_a_listening_control_socket_and_a_held_lock_mean_a_running_daemon_named_by_its_pid_file(paths):
    lock = _hold_lock(paths)
    sock = _listen(paths.control_socket)
    try:
        state = _liveness.inspect(paths)
        assert state.running and state.pid == os.getpid() and not state.stale and state.conflict is None
        assert state.label == 'running'
    finally:
        sock.close()
        os.close(lock)
    # SIGKILLed: the socket file stays, nobody listens, the kernel released the lock.
    state = _liveness.inspect(paths)
    assert not state.running and state.stale and state.pid is None and state.conflict is None
    assert {'control', _liveness.PID_FILE} <= set(state.leftovers)


def test_a_daemon_whose_lock_does_not_show_in_proc_locks_is_running_by_its_pid_file_and_process(paths):
    """An OFD lock (pid -1) or a hidden one: the pid file's process decides, when it is a daemon of this pipe directory."""
    lock_path = os.path.join(paths.pipe_dir, 'control_lock')
    open(lock_path, 'w').close()
    # A stand-in daemon: it has control_lock open and this pipe directory in its environment, and holds no lock.
    script = 'import sys, time; handle = open(sys.argv[1]); print("up", flush=True); time.sleep(60)'
    proc = subprocess.Popen([sys.executable, '-c', script, lock_path],  # pylint: disable=consider-using-with
                            env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=paths.pipe_dir), stdout=subprocess.PIPE, text=True)
    sock = _listen(paths.control_socket)
    try:
        assert proc.stdout.readline().strip() == 'up'
        assert _proc.lock_holders(lock_path) == []
        with open(os.path.join(paths.pipe_dir, _liveness.PID_FILE), 'w') as handle:
            handle.write(str(proc.pid))
        state = _liveness.inspect(paths)
        assert state.running and state.pid == proc.pid and not state.stale and state.conflict is None
        # A pid file naming an unrelated live process (a reused pid) is stale, whatever listens on the socket.
        with open(os.path.join(paths.pipe_dir, _liveness.PID_FILE), 'w') as handle:
            handle.write(str(os.getpid()))
        state = _liveness.inspect(paths)
        assert not state.running and state.stale and state.pid is None
    finally:
        sock.close()
        proc.kill()
        proc.wait()


def test_the_socket_is_never_connected_to_and_never_decides(paths, monkeypatch):
    """Each connection is a line in the real daemon's control.log: inspect only looks at the socket file."""
    real_connect = socket.socket.connect

    def refuse(sock, address):
        if address == paths.control_socket:
            raise AssertionError('inspect connected to the control socket')
        return real_connect(sock, address)
    monkeypatch.setattr(socket.socket, 'connect', refuse)
    sock = _listen(paths.control_socket)  # somebody listens, but no lock and no pid file: no daemon of ours
    try:
        state = _liveness.inspect(paths)
        assert not state.running and state.pid is None
        lock = _hold_lock(paths)
        try:
            state = _liveness.inspect(paths)
            assert state.running and state.pid == os.getpid()
        finally:
            os.close(lock)
    finally:
        sock.close()


def test_a_lock_holder_whose_socket_file_is_gone_is_a_conflict_never_stale(paths):
    lock = _hold_lock(paths)
    try:
        state = _liveness.inspect(paths)
        assert not state.running and not state.stale and state.label == 'unknown'
        assert state.pid == os.getpid()
        assert 'process %d holds' % os.getpid() in state.conflict and 'nothing was cleaned' in state.conflict
        assert 'does not exist' in state.conflict
        # The socket file back (nobody is asked whether it listens): the lock decides, the daemon runs.
        _listen(paths.control_socket).close()
        state = _liveness.inspect(paths)
        assert state.running and state.conflict is None
    finally:
        os.close(lock)


class _Sleeper:
    """A stand-in for the daemon's UI: quit's UI exits non-zero, the daemon process exits."""

    def __init__(self, proc):
        self.proc = proc
        self.timeout = 1
        self.processes = 0

    def batch(self, commands):
        assert commands == ['quit -t 0']
        self.proc.kill()
        self.proc.wait()
        raise ControlBinaryError('nvidia-cuda-mps-control exited with status 1')


def test_a_quit_whose_ui_exits_non_zero_is_a_stop_when_the_daemon_process_is_gone(paths):
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=1, stop_timeout=0, sleep=lambda _s: None)
    daemon.client = _Sleeper(proc)
    assert daemon.stop(proc.pid) is False


def test_a_stop_without_a_pid_waits_for_the_lock_holder_not_for_the_socket(paths):
    """The real daemon's sockets outlive it: a socket somebody listens on does not keep a stop waiting once the
    process holding control_lock is gone."""
    lock_file = os.path.join(paths.pipe_dir, 'control_lock')
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, sys, time\n'
                               'f = open(sys.argv[1], "w"); fcntl.lockf(f, fcntl.LOCK_EX); print("locked", flush=True); time.sleep(30)',
                               lock_file], stdout=subprocess.PIPE, text=True)
    sock = _listen(paths.control_socket)
    try:
        assert holder.stdout.readline() == 'locked\n'
        assert _liveness.inspect(paths).pid == holder.pid
        daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=5, stop_timeout=0, sleep=lambda _s: None)
        daemon.client = _Sleeper(holder)
        started = time.monotonic()
        assert daemon.stop(None) is False
        assert time.monotonic() - started < 4
    finally:
        sock.close()
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_quit_whose_ui_fails_while_the_daemon_lives_on_fails_naming_the_ui_error(paths):
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    try:
        daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=0.2, stop_timeout=0)

        class Failing(_Sleeper):
            def batch(self, commands):
                raise ControlBinaryError('nvidia-cuda-mps-control exited with status 1')

        daemon.client = Failing(proc)
        with pytest.raises(DaemonTimeoutError, match='did not exit within .* after quit .*exited with status 1'):
            daemon.stop(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_rejected_quit_fails_at_once_with_the_daemons_words(paths):
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    try:
        # A stop_timeout of 60 s would have meant a wait of 60 s + start_timeout before any error.
        daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=30, stop_timeout=60)

        class Refusing(_Sleeper):
            def batch(self, commands):
                return [Reply(commands[0], ('Permission denied: quit requires root',))]

        daemon.client = Refusing(proc)
        started = time.monotonic()
        with pytest.raises(ControlCommandError, match=r'for res \(pid %d\) rejected quit: Permission denied: quit requires '
                                                      r'root; it was left running' % proc.pid):
            daemon.stop(proc.pid)
        assert time.monotonic() - started < 30
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_file_naming_an_unrelated_live_process_is_stale_not_running(paths):
    unrelated = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    try:
        with open(os.path.join(paths.pipe_dir, _liveness.PID_FILE), 'w') as handle:
            handle.write(str(unrelated.pid))
        open(os.path.join(paths.pipe_dir, 'control_lock'), 'w').close()
        state = _liveness.inspect(paths)
        assert not state.running and state.stale
        assert state.pid_file_pid == unrelated.pid
    finally:
        unrelated.kill()
        unrelated.wait()


def test_nothing_in_the_pipe_dir_is_stopped_not_stale(paths):
    state = _liveness.inspect(paths)
    assert not state.running and not state.stale and state.leftovers == []


def test_daemon_env_is_minimal_and_pins_devices_by_uuid(paths):
    env = _daemon.daemon_env(paths, ['GPU-a', 'GPU-b'], {
        'PATH': '/usr/bin', 'LD_LIBRARY_PATH': '/opt/nvidia/lib', 'NVML_MPS_DEVICE_ENUMERATION': '1',
        'CUDA_VISIBLE_DEVICES': '7', 'HOME': '/root', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '10'})
    assert env == {
        'PATH': '/usr/bin',
        'LD_LIBRARY_PATH': '/opt/nvidia/lib',
        'CUDA_MPS_PIPE_DIRECTORY': paths.pipe_dir,
        'CUDA_MPS_LOG_DIRECTORY': paths.log_dir,
        'CUDA_VISIBLE_DEVICES': 'GPU-a,GPU-b',
    }


def test_daemon_env_has_a_default_path(paths):
    assert _daemon.daemon_env(paths, ['GPU-a'], {})['PATH'] == _daemon.DEFAULT_PATH


def test_resource_lock_serialises_two_holders(tmp_path):
    path = str(tmp_path / 'r' / '.lock')
    with _lock.ResourceLock(path):
        probe = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
    probe = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)


def _try_flock(path, flags):
    probe = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(probe, flags | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(probe)


def test_resources_share_their_roots_lock_and_mps_shm_takes_it_alone(tmp_path):
    root = str(tmp_path / 'root')
    first = _lock.resource_lock(resource_paths(root, 'train'))
    second = _lock.resource_lock(resource_paths(root, 'example.com/infer'))
    with first, second:  # two resources at once: both hold the root shared
        assert not _try_flock(root, fcntl.LOCK_EX)  # so the shm tmpfs cannot change meanwhile
        assert _try_flock(root, fcntl.LOCK_SH)
    assert _try_flock(root, fcntl.LOCK_EX)
    with _lock.RootLock(root, exclusive=True):
        assert not _try_flock(root, fcntl.LOCK_SH)
    assert sorted(os.listdir(root)) == ['example.com', 'train']  # no lock file of the root's own
    with _lock.RootLock(str(tmp_path / 'missing'), exclusive=True):
        assert not os.path.exists(str(tmp_path / 'missing'))  # nothing to protect, nothing created


def test_child_pids_lists_the_children_of_a_process():
    children = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']) for dummy in range(2)]
    try:
        found = _proc.child_pids(os.getpid())
        assert {child.pid for child in children} <= set(found)
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_child_pids_of_a_missing_process_is_empty():
    assert _proc.child_pids(2 ** 22 + 12345) == []


class _Replayer:
    """The first UI session after -d: the daemon answers, and rejects the thread percentage."""

    def __init__(self):
        self.timeout = 1
        self.processes = 0

    def batch(self, commands):
        self.processes += 1
        texts = {'set_default_device_pinned_mem_limit 0 2048M': (), 'set_default_active_thread_percentage 250': ('Invalid value: 250',),
                 'get_default_active_thread_percentage': ('100.0',)}
        return [_daemon.Reply(cmd, texts[cmd]) for cmd in commands]


def test_a_replayed_limit_the_daemon_rejects_fails_the_start_with_the_daemons_message(paths):
    daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=1, stop_timeout=0)
    daemon.client = _Replayer()
    with pytest.raises(ReplayRejectedError) as excinfo:
        daemon.wait_ready(['set_default_device_pinned_mem_limit 0 2048M', 'set_default_active_thread_percentage 250'])
    assert "rejected 'set_default_active_thread_percentage 250': Invalid value: 250" in excinfo.value.msg
    assert 'persisted limit replayed at its start' in excinfo.value.msg and 'control.log' in excinfo.value.msg
    assert daemon.client.processes == 1


def test_a_replay_the_daemon_accepts_is_one_session(paths):
    daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=1, stop_timeout=0)
    daemon.client = _Replayer()
    replies = daemon.wait_ready(['set_default_device_pinned_mem_limit 0 2048M'])
    assert [reply.text for reply in replies] == ['', '100.0'] and daemon.client.processes == 1


class _Gone(_Sleeper):
    """The UI says no daemon answers while the process is still on its way out."""

    def batch(self, commands):
        raise DaemonNotRunningError('no MPS control daemon answers')


def test_no_daemon_from_the_ui_still_waits_for_the_process_to_exit(paths):
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        proc.kill()
        proc.wait()

    daemon = _daemon.Daemon(paths, '/bin/true', start_timeout=5, stop_timeout=0, sleep=sleep)
    daemon.client = _Gone(proc)
    assert daemon.stop(proc.pid) is False
    assert slept, 'stop() returned while the daemon process was still alive'


def test_a_start_that_loses_the_race_to_another_manager_says_so_and_touches_nothing_of_its_daemon(paths, tmp_path):
    # Another manager's -d took the lock between this run's lock check and its own -d: NVIDIA's -d answers
    # "An instance of this daemon is already running" and exits 1 (the troubleshooting guide quotes the result).
    binary = tmp_path / 'nvidia-cuda-mps-control'
    binary.write_text('#!/bin/sh\necho "%s"\nexit 1\n' % _daemon.ALREADY_RUNNING_TEXT)
    binary.chmod(0o755)
    daemon = _daemon.Daemon(paths, str(binary), start_timeout=1, stop_timeout=0)
    with pytest.raises(MpsError, match='^another MPS control daemon started on %s at the same time$' % paths.pipe_dir):
        daemon.start([], multiuser=False)
    assert sorted(os.listdir(paths.pipe_dir)) == []


def test_a_start_with_an_option_the_binary_does_not_know_fails_at_once_with_its_line(paths, tmp_path):
    """r580 answers -S with "Unrecognized option", its help and exit 0, starting nothing (gpu-evidence probe2.txt): the start
    says so at once instead of waiting for a daemon that never comes."""
    binary = tmp_path / 'nvidia-cuda-mps-control'
    binary.write_text('#!/bin/sh\necho "$*" > %s/argv\nprintf "Unrecognized option \\000\\nCUDA MPS Control for Linux\\n"\n' % tmp_path)
    binary.chmod(0o755)
    daemon = _daemon.Daemon(paths, str(binary), start_timeout=30, stop_timeout=0)
    started = time.monotonic()
    with pytest.raises(ControlBinaryError, match=r"does not know an option of .* -d -S: it printed 'Unrecognized option'"):
        daemon.start(['GPU-a'], multiuser=False, replay=['sm_partition add GPU-a 4'])
    assert time.monotonic() - started < 10
    assert (tmp_path / 'argv').read_text().split() == ['-d', '-S']


def test_the_help_probe_runs_without_the_callers_cuda_mps_variables(tmp_path):
    """``-h`` is asked with the environment of every control call: a caller's CUDA_MPS_* never reaches the binary."""
    binary = tmp_path / 'nvidia-cuda-mps-control'
    binary.write_text('#!/bin/sh\nenv > "%s/env"\necho "nvidia-cuda-mps-control help"\necho "set_default_client_priority"\n' % tmp_path)
    binary.chmod(0o755)
    _daemon._HELP_TEXTS.pop(str(binary), None)
    daemon = _daemon.Daemon(resource_paths(str(tmp_path / 'root'), 'train'), str(binary), 5, 5,
                            environ={'PATH': os.environ['PATH'], 'CUDA_MPS_PROTOCOL_VERSION': '3',
                                     'CUDA_MPS_PIPE_DIRECTORY': '/theirs/pipe'})
    assert daemon.offers('set_default_client_priority') is True
    assert not [line for line in (tmp_path / 'env').read_text().splitlines() if line.startswith('CUDA_MPS_')]
