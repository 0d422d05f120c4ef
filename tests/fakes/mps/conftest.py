# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures for the MPS simulator tests: a private simulated host per test.

Each test gets short pipe/log directories under /tmp (AF_UNIX paths are limited
to 107 bytes), its own copy of a 4-GPU INI file, and a finalizer that kills every
process (daemon, servers, clients) whose command line or environment names the
test's directory, then removes the /dev/shm rendezvous files its dead servers left
(a SIGKILLed server cannot remove its own).
"""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..', '..'))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, 'tests', 'gpu'))

import mps_common  # noqa: E402  pylint: disable=wrong-import-position

SIM = os.path.join(HERE, 'mps_sim.py')
CLIENT = os.path.join(HERE, 'mps_client.py')
PYTHON = sys.executable
NOBODY = 65534

GPUS = [
    # name, uuid, memory MiB, compute capability
    ('NVIDIA H100 80GB HBM3', 'GPU-6a2b5c1e-0000-4000-8000-000000000000', 81559, '9.0'),
    ('NVIDIA H100 80GB HBM3', 'GPU-6a2b5c1e-1111-4000-8000-000000000001', 81559, '9.0'),
    ('Tesla V100-SXM2-16GB', 'GPU-9f00aa01-2222-4000-8000-000000000002', 16384, '7.0'),
    ('Tesla P100-PCIE-16GB', 'GPU-1234abcd-3333-4000-8000-000000000003', 16280, '6.0'),
]


def write_ini(path: str, gpus: Optional[list[tuple[str, str, int, str]]] = None, driver: str = '560.35.03', cuda: str = '12060',
              **per_gpu: dict[int, str]) -> None:
    """Write a FAKE_NVML_CONFIG file (per_gpu: extra key -> {index: value})."""
    lines = ['[system]', f'driver_version = {driver}', f'cuda_driver_version = {cuda}', '']
    for index, (name, uuid, mem, cc) in enumerate(GPUS if gpus is None else gpus):
        lines += [f'[gpu{index}]', f'name = {name}', f'uuid = {uuid}', f'memory_total_mib = {mem}',
                  f'compute_capability = {cc}', 'mig_mode = disabled', 'persistence_mode = enabled']
        mode = 'default'
        for key, values in per_gpu.items():
            if index in values:
                if key == 'compute_mode':
                    mode = values[index]
                else:
                    lines.append(f'{key} = {values[index]}')
        lines += [f'compute_mode = {mode}', '']
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write('\n'.join(lines))


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, what: str = 'condition') -> object:
    """Poll with a short backoff until predicate() is truthy; return its value."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out waiting for {what}')
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def pid_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat', encoding='utf-8') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


class Client:
    """A running mps_client.py process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._info: Optional[dict] = None

    def info(self, timeout: float = 10.0) -> dict:
        """The JSON line the client printed (waits for it)."""
        if self._info is None:
            assert self.proc.stdout is not None
            ready = select.select([self.proc.stdout], [], [], timeout)[0]
            assert ready, f'client {self.pid} printed nothing within {timeout}s'
            line = self.proc.stdout.readline()
            assert line, f'client {self.pid} exited without output (rc={self.proc.poll()})'
            self._info = json.loads(line)
        return self._info

    def printed_within(self, timeout: float) -> bool:
        """Whether the client printed its line within timeout seconds."""
        assert self.proc.stdout is not None
        ready = select.select([self.proc.stdout], [], [], timeout)[0]
        return bool(ready)

    def stop(self, timeout: float = 10.0) -> int:
        """Close stdin (the client disconnects) and wait for its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        return self.proc.wait(timeout)

    def rest(self, timeout: float = 10.0) -> tuple[int, str, str]:
        """Wait for exit; (rc, remaining stdout, stderr)."""
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


class SimHost:
    """A simulated host in a private directory: run the daemon, the UI and clients."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.pipe = os.path.join(base, 'p')
        self.logdir = os.path.join(base, 'l')
        self.ini = os.path.join(base, 'nvml.ini')
        write_ini(self.ini)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(('FAKE_MPS_', 'CUDA_'))}
        self.env.update({'CUDA_MPS_PIPE_DIRECTORY': self.pipe, 'CUDA_MPS_LOG_DIRECTORY': self.logdir,
                         'FAKE_NVML_CONFIG': self.ini, 'PYTHONDONTWRITEBYTECODE': '1'})
        self.clients: list[Client] = []
        self.procs: list[subprocess.Popen] = []

    def environ(self, env: Optional[dict[str, str]] = None, **more: str) -> dict[str, str]:
        """The host environment plus overrides (a value of None removes the variable)."""
        out = dict(self.env)
        for key, value in {**(env or {}), **more}.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    @staticmethod
    def make_dirs(environ: dict[str, str]) -> None:
        """Create the pipe and log directories an environment names (0755), as a real ``-d`` needs them first."""
        for name in ('CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_LOG_DIRECTORY'):
            if environ.get(name):
                os.makedirs(environ[name], mode=0o755, exist_ok=True)

    def start(self, *args: str, env: Optional[dict[str, str]] = None, check: bool = True, timeout: float = 15.0,  # pylint: disable=too-many-arguments
              make_dirs: bool = True) -> subprocess.CompletedProcess:
        """``nvidia-cuda-mps-control -d`` (or the given args), the pipe and log directories created first unless make_dirs is False."""
        environ = self.environ(env)
        if make_dirs:
            self.make_dirs(environ)
        proc = subprocess.run([PYTHON, SIM, *(args or ('-d',))], env=environ, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check:
            assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    def foreground(self, *args: str, env: Optional[dict[str, str]] = None) -> subprocess.Popen:
        """``nvidia-cuda-mps-control -f`` as a child process (stdout piped), the pipe and log directories created first."""
        self.make_dirs(self.environ(env))
        proc = subprocess.Popen([PYTHON, SIM, '-f', *args], env=self.environ(env), stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def ui(self, commands: object = '', env: Optional[dict[str, str]] = None, timeout: float = 15.0) -> subprocess.CompletedProcess:
        """The control UI with commands (a list: one per line; a str: stdin as is)."""
        text = commands if isinstance(commands, str) else '\n'.join(commands) + '\n'  # type: ignore[arg-type]
        return subprocess.run([PYTHON, SIM], input=text, env=self.environ(env), capture_output=True, text=True, timeout=timeout, check=False)

    def out(self, commands: object, env: Optional[dict[str, str]] = None) -> str:
        """stdout of a UI batch that must exit 0."""
        proc = self.ui(commands, env=env)
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def ui_background(self, commands: list[str], env: Optional[dict[str, str]] = None) -> subprocess.Popen:
        """A UI process left running (for commands that block, like quit); stdout/stderr piped."""
        fd, path = tempfile.mkstemp(dir=self.base, prefix='ui')
        os.write(fd, ('\n'.join(commands) + '\n').encode())
        os.lseek(fd, 0, os.SEEK_SET)
        proc = subprocess.Popen([PYTHON, SIM], stdin=fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=consider-using-with
                                text=True, env=self.environ(env))
        os.close(fd)
        os.unlink(path)
        self.procs.append(proc)
        return proc

    def client(self, *args: str, uid: Optional[int] = None, env: Optional[dict[str, str]] = None) -> Client:
        """Start mps_client.py (stays connected until stopped)."""
        argv = [PYTHON, CLIENT, *args]
        if uid is not None:
            argv += ['--uid', str(uid)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=consider-using-with
                                text=True, env=self.environ(env))
        client = Client(proc)
        self.clients.append(client)
        return client

    def daemon_pid(self) -> int:
        """The pid in the pid file."""
        with open(os.path.join(self.pipe, 'nvidia-cuda-mps-control.pid'), encoding='utf-8') as handle:
            return int(handle.read())

    def servers(self) -> list[int]:
        """get_server_list as ints."""
        return [int(x) for x in self.out(['get_server_list']).split()]

    def state(self) -> dict:
        """The simulator-only sim_state snapshot."""
        return json.loads(self.out(['sim_state']))

    def control_log(self) -> list[str]:
        """Lines of control.log."""
        return _read_lines(os.path.join(self.logdir, 'control.log'))

    def server_log(self) -> list[str]:
        """Lines of server.log."""
        return _read_lines(os.path.join(self.logdir, 'server.log'))

    def log_messages(self, which: str = 'control') -> list[str]:
        """Messages of a log (the text after ``] ``)."""
        lines = self.control_log() if which == 'control' else self.server_log()
        return [line.split('] ', 1)[1] if '] ' in line else line for line in lines]

    def wait_log(self, text: str, which: str = 'control', timeout: float = 5.0) -> list[str]:
        """Wait until a log has a message containing text; the matching messages."""
        def found() -> list[str]:
            return [m for m in self.log_messages(which) if text in m]
        return wait_until(found, timeout, f'{text!r} in {which}.log')  # type: ignore[return-value]

    def quit(self, timeout: float = 15.0) -> None:
        """quit, and wait for the daemon to be gone."""
        try:
            pid = self.daemon_pid()
        except (OSError, ValueError):
            pid = 0
        self.out(['quit'])
        if pid:
            wait_until(lambda: not pid_alive(pid), timeout, 'daemon exit')

    def kill_all(self) -> None:
        """Kill every process that belongs to this host (by its directory in argv or environment)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        needle = self.base.encode()
        for _attempt in range(3):
            victims = []
            for entry in os.listdir('/proc'):
                if not entry.isdigit() or int(entry) == os.getpid():
                    continue
                try:
                    with open(f'/proc/{entry}/cmdline', 'rb') as handle:
                        cmdline = handle.read()
                    with open(f'/proc/{entry}/environ', 'rb') as handle:
                        environ = handle.read()
                except OSError:
                    continue
                if needle in cmdline or needle in environ:
                    victims.append(int(entry))
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not victims:
                break
            deadline = time.monotonic() + 5
            while any(pid_alive(p) for p in victims) and time.monotonic() < deadline:
                time.sleep(0.01)
        for client in self.clients:
            try:
                client.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (client.proc.stdin, client.proc.stdout, client.proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        for proc in self.procs:
            try:
                proc.communicate(timeout=5)
            except (subprocess.TimeoutExpired, ValueError, OSError):
                pass
        self.remove_shm_files()

    def server_pids_ever(self) -> list[int]:
        """Every server this host's daemons started (from control.log)."""
        found = (re.search(r'Starting new server (\d+) for user', m) for m in self.log_messages())
        return sorted({int(m.group(1)) for m in found if m})

    def remove_shm_files(self) -> None:
        """Remove the /dev/shm rendezvous files of this host's servers that are gone."""
        for pid in self.server_pids_ever():
            if not pid_alive(pid):
                try:
                    os.unlink(shm_path(pid))
                except OSError:
                    pass


def shm_path(server_pid: int) -> str:
    """The rendezvous file of a server (FAKE_MPS_SHM=check)."""
    return os.path.join(mps_common.SHM_DIR, f'{mps_common.SHM_PREFIX}{server_pid}')


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def new_base(prefix: str = 'mps') -> str:
    """A short private directory under /tmp."""
    return tempfile.mkdtemp(prefix=prefix, dir='/tmp')


@pytest.fixture(name='make_host')
def fixture_make_host() -> Iterator[Callable[..., SimHost]]:
    """Factory of simulated hosts (several per test when needed), all cleaned up."""
    hosts: list[SimHost] = []

    def make(mode: int = 0o755) -> SimHost:
        base = new_base()
        os.chmod(base, mode)
        host = SimHost(base)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.kill_all()
        remove_tree(host.base)


def remove_tree(path: str) -> None:
    """rm -rf, retried while a dying process may still create files there."""
    for _attempt in range(20):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.05)


@pytest.fixture(name='shared', scope='module')
def fixture_shared() -> Iterator[SimHost]:
    """One daemon shared by a module's stateless tests (each sets what it reads back)."""
    base = new_base()
    os.chmod(base, 0o755)
    host = SimHost(base)
    host.start()
    yield host
    host.kill_all()
    remove_tree(base)


@pytest.fixture(name='host')
def fixture_host(make_host: Callable[..., SimHost]) -> SimHost:
    """One simulated host, daemon not started, base directory 0755."""
    return make_host()


@pytest.fixture(name='running')
def fixture_running(host: SimHost) -> SimHost:
    """A simulated host with a daemon started by ``-d``."""
    host.start()
    return host
