# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One MPS transcript, played against the real ``nvidia-cuda-mps-control`` or the simulator.

STEPS is data: control UI batches, daemon starts, client starts/stops, snapshots of
the pipe dir and the logs.  Each step carries the reference tag of what it checks
(C confirmed, O observed, I inferred, U unknown) and, where the reference says what
the answer is, the expected normalised output.  ``Runner`` plays the steps with a
given control command and client command and returns normalised results, in which
pids are tokens (``<DAEMON1>``, ``<SERVER1>``, ``<CLIENT1>``) and timestamps ``<TS>``.

Used by ``tests/fakes/mps/test_transcript.py`` (the simulator must meet every
expectation) and by ``compare_mps.py`` (real vs simulator, on a GPU host).
Standard library only; runs on python3 >= 3.8.
"""
from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import stat
import subprocess
import time
from typing import Dict, List, Optional, Tuple

NO_DAEMON = 'Cannot find MPS control daemon process\n'
ALREADY = 'An instance of this daemon is already running\n'
PIPE_MODES = {
    'control': 'socket 0666',
    'control_lock': 'file 0666',
    'control_privileged': 'socket 0755',
    'log': 'fifo 0777',
    'nvidia-cuda-mps-control.pid': 'file 0666',
}

MISSING_UUID = 'GPU-00000000-0000-0000-0000-000000000000'

# op: ui (commands), start (args), client (name, args), client_stop (name), client_state (name),
#     files, pidfile, wait_daemon_exit, log (which), locks (/proc/locks on control_lock),
#     socket (connect to <pipe>/control), pipe_length (a -d of its own in a pipe dir of `length` bytes)
STEPS: List[dict] = [
    {'id': 'no-daemon', 'op': 'ui', 'tag': 'O', 'commands': ['get_server_list'], 'expect': {'rc': 1, 'stdout+stderr': NO_DAEMON}},
    {'id': 'start', 'op': 'start', 'tag': 'C', 'args': ['-d'], 'expect': {'rc': 0, 'stdout': '', 'stderr': ''}},
    {'id': 'start-again', 'op': 'start', 'tag': 'O', 'args': ['-d'], 'expect': {'rc': 1, 'stdout': ALREADY}},
    {'id': 'files-running', 'op': 'files', 'tag': 'O', 'expect': {'data': PIPE_MODES}},
    # which lock the daemon holds on control_lock, as /proc/locks shows it (FAKE_MPS_LOCK_KIND)
    {'id': 'locks-running', 'op': 'locks', 'tag': 'U', 'expect': {'data': ['POSIX ADVISORY WRITE <DAEMON1>']}},
    {'id': 'socket-running', 'op': 'socket', 'tag': 'I', 'expect': {'data': 'accepts'}},
    {'id': 'pidfile', 'op': 'pidfile', 'tag': 'O', 'expect': {'data': '<DAEMON1>'}},
    {'id': 'initial', 'op': 'ui', 'tag': 'O', 'commands': ['get_server_list', 'get_default_active_thread_percentage'],
     'expect': {'rc': 0, 'stdout': '100.0\n'}},
    # the reply of a getter for a limit never set (FAKE_MPS_UNSET_MEM_LIMIT)
    {'id': 'mem-unset', 'op': 'ui', 'tag': 'U', 'commands': ['get_default_device_pinned_mem_limit 0'], 'expect': {'rc': 0, 'stdout': '0M\n'}},
    {'id': 'unknowns', 'op': 'ui', 'tag': 'U',
     'commands': ['get_default_client_priority', 'bogus_command', 'set_default_active_thread_percentage 0',
                  'set_default_device_pinned_mem_limit 0 12X', 'get_default_device_pinned_mem_limit 0',
                  'get_server_status 1'],
     'expect': {'rc': 0, 'stdout': '0\nUnrecognized command: bogus_command\nInvalid value: 0\nInvalid value: 12X\n0M\nServer with PID 1 not found\n'}},
    {'id': 'set-defaults', 'op': 'ui', 'tag': 'O',
     'commands': ['set_default_active_thread_percentage 25', 'set_default_active_thread_percentage 30.0',
                  'get_default_active_thread_percentage', 'set_default_device_pinned_mem_limit 0 3840M',
                  'get_default_device_pinned_mem_limit 0', 'set_default_device_pinned_mem_limit 0 1044M',
                  'get_default_device_pinned_mem_limit 0'],
     'expect': {'rc': 0, 'stdout': '25.0\n30.0\n30.0\n3G\n1G\n'}},
    # DEV is not validated: a device the daemon does not have (it sees one GPU) is stored silently
    {'id': 'mem-missing-device', 'op': 'ui', 'tag': 'C',
     'commands': ['set_default_device_pinned_mem_limit 7 2G', 'get_default_device_pinned_mem_limit 7',
                  f'set_default_device_pinned_mem_limit {MISSING_UUID} 2G', f'get_default_device_pinned_mem_limit {MISSING_UUID}'],
     'expect': {'rc': 0, 'stdout': '2G\n2G\n'}},
    {'id': 'client1', 'op': 'client', 'tag': 'C', 'name': 'c1', 'args': []},
    {'id': 'server-list', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list'], 'expect': {'rc': 0, 'stdout': '<SERVER1>\n'}},
    {'id': 'server-state', 'op': 'ui', 'tag': 'I',
     'commands': ['get_server_status {server}', 'get_client_list {server}', 'get_active_thread_percentage {server}',
                  'get_device_pinned_mem_limit {server} 0'],
     'expect': {'rc': 0, 'stdout': 'ACTIVE\n<CLIENT1>\n30.0\n1G\n'}},
    {'id': 'ps', 'op': 'ui', 'tag': 'C', 'commands': ['ps'], 'normalise': 'ps'},
    {'id': 'ps-p-server', 'op': 'ui', 'tag': 'C', 'commands': ['ps -p {server}'], 'normalise': 'ps'},
    {'id': 'device-client-list', 'op': 'ui', 'tag': 'U', 'commands': ['get_device_client_list']},
    {'id': 'per-server-set', 'op': 'ui', 'tag': 'I',
     'commands': ['set_active_thread_percentage {server} 40', 'get_active_thread_percentage {server}', 'get_default_active_thread_percentage'],
     'expect': {'rc': 0, 'stdout': '40.0\n40.0\n30.0\n'}},
    {'id': 'client2', 'op': 'client', 'tag': 'C', 'name': 'c2', 'args': []},
    {'id': 'two-clients', 'op': 'ui', 'tag': 'O', 'commands': ['get_server_list', 'get_client_list {server}'],
     'expect': {'rc': 0, 'stdout': '<SERVER1>\n<CLIENT1>\n<CLIENT2>\n'}},
    {'id': 'terminate', 'op': 'ui', 'tag': 'C', 'commands': ['terminate_client {server} {client:c2}'], 'expect': {'rc': 0, 'stdout': '0\n'}},
    {'id': 'terminated-client', 'op': 'client_state', 'tag': 'I', 'name': 'c2'},
    {'id': 'client1-stop', 'op': 'client_stop', 'tag': 'C', 'name': 'c1', 'expect': {'rc': 0}},
    {'id': 'idle-server', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list', 'get_client_list {server}'], 'settle': True,
     'expect': {'rc': 0, 'stdout': '<SERVER1>\n'}},
    # quit's output is [C] (nothing), its exit status [U] (FAKE_MPS_QUIT_REPLY)
    {'id': 'quit', 'op': 'ui', 'tag': 'U', 'commands': ['quit'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'daemon-exit', 'op': 'wait_daemon_exit', 'tag': 'C', 'expect': {'rc': 0}},
    {'id': 'files-after-quit', 'op': 'files', 'tag': 'U', 'expect': {'data': {'control_lock': 'file 0666'}}},
    {'id': 'locks-after-quit', 'op': 'locks', 'tag': 'U', 'expect': {'data': []}},
    {'id': 'socket-after-quit', 'op': 'socket', 'tag': 'U', 'expect': {'data': 'ENOENT'}},
    {'id': 'after-quit', 'op': 'ui', 'tag': 'O', 'commands': ['get_server_list'], 'expect': {'rc': 1, 'stdout+stderr': NO_DAEMON}},
    {'id': 'restart', 'op': 'start', 'tag': 'C', 'args': ['-d'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'defaults-lost', 'op': 'ui', 'tag': 'C', 'commands': ['get_default_active_thread_percentage', 'get_server_list'],
     'expect': {'rc': 0, 'stdout': '100.0\n'}},
    {'id': 'start-server', 'op': 'ui', 'tag': 'U', 'commands': ['start_server -uid 0'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'started-server', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list'], 'settle': True, 'expect': {'rc': 0, 'stdout': '<SERVER2>\n'}},
    {'id': 'server-ready', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_status {server}'], 'settle': True, 'expect': {'rc': 0, 'stdout': 'ACTIVE\n'}},
    {'id': 'shutdown-server', 'op': 'ui', 'tag': 'U', 'commands': ['shutdown_server {server}'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'server-gone', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list'], 'settle': True, 'expect': {'rc': 0, 'stdout': ''}},
    # a forced quit with a client held: its exit status is [U], the client's fate [I]
    {'id': 'client3', 'op': 'client', 'tag': 'C', 'name': 'c3', 'args': []},
    {'id': 'quit-t', 'op': 'ui', 'tag': 'U', 'commands': ['quit -t 2'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'quit-t-client', 'op': 'client_state', 'tag': 'I', 'name': 'c3', 'expect': {'data': 'exited non-zero'}},
    {'id': 'daemon-exit-2', 'op': 'wait_daemon_exit', 'tag': 'C', 'expect': {'rc': 0}},
    {'id': 'control-log', 'op': 'log', 'tag': 'O', 'which': 'control.log'},
    {'id': 'server-log', 'op': 'log', 'tag': 'U', 'which': 'server.log'},
    # the pipe dir length limit (FAKE_MPS_PIPE_DIR_MAX): 87 bytes work, 88 fail without a word [O]
    {'id': 'pipe-87', 'op': 'pipe_length', 'tag': 'O', 'length': 87,
     'expect': {'rc': 0, 'stdout': '', 'data': {'files': sorted(PIPE_MODES), 'control_log': 'written', 'daemon': 'running',
                                                'ui': '0 '}}},
    {'id': 'pipe-88', 'op': 'pipe_length', 'tag': 'O', 'length': 88,
     'expect': {'rc': 0, 'stdout': '', 'data': {'files': ['control_lock', 'log'], 'control_log': 'nothing', 'daemon': 'gone',
                                                'ui': '1 ' + NO_DAEMON}}},
]

# What the first GPU run must answer (reference section 7 and issue 17): label, step id, result field
QUESTIONS: List[Tuple[str, str, str]] = [
    ('lock on control_lock in /proc/locks (daemon running)', 'locks-running', 'data'),
    ('lock on control_lock in /proc/locks (after quit)', 'locks-after-quit', 'data'),
    ('connect to <pipe>/control (daemon running)', 'socket-running', 'data'),
    ('connect to <pipe>/control (after quit)', 'socket-after-quit', 'data'),
    ('pipe dir of 87 bytes', 'pipe-87', 'all'),
    ('pipe dir of 88 bytes', 'pipe-88', 'all'),
    ('quit - UI exit status and output', 'quit', 'all'),
    ('quit -t 2 with a client held - UI exit status and output', 'quit-t', 'all'),
    ('the client held through quit -t', 'quit-t-client', 'data'),
    ('files left after a clean quit', 'files-after-quit', 'data'),
    ('get_default_device_pinned_mem_limit 0, never set', 'mem-unset', 'stdout'),
    ('set/get of a limit on ordinal 7 and on a missing UUID', 'mem-missing-device', 'stdout'),
    ('control.log start lines (binary version line?)', 'control-log', 'start'),
    ('ps', 'ps', 'stdout'),
    ('ps -p <server pid>', 'ps-p-server', 'stdout'),
]

TS_RE = re.compile(r'\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} ')
TAG_RE = re.compile(r' (Control|Server|Other|Legacy Server)\s+(<[A-Z]+\d+>|\d+)\]')


class Runner:
    """Play STEPS against one implementation; collect normalised results."""

    def __init__(self, control: List[str], client: List[str], env: Dict[str, str], timeout: float = 20.0) -> None:
        self.control = control
        self.client_cmd = client
        self.env = env
        self.pipe = env['CUDA_MPS_PIPE_DIRECTORY']
        self.logdir = env['CUDA_MPS_LOG_DIRECTORY']
        self.timeout = timeout
        self.tokens: Dict[int, str] = {}
        self.counts: Dict[str, int] = {}
        self.clients: Dict[str, subprocess.Popen] = {}
        self.daemon_pids: List[int] = []
        self.results: List[dict] = []  # filled step by step: what ran survives an interrupted run

    # ------------------------------------------------------------ pids and text

    def token(self, kind: str, pid: int) -> str:
        """The stable token of a pid (assigned on first sight)."""
        if pid not in self.tokens:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.tokens[pid] = f'<{kind}{self.counts[kind]}>'
        return self.tokens[pid]

    def normalise(self, text: str) -> str:
        """Timestamps to <TS>, known pids to tokens, log tag padding to one space."""
        text = TS_RE.sub('[<TS> ', text)
        for pid in sorted(self.tokens, key=lambda p: -len(str(p))):
            text = re.sub(rf'(?<!\w){pid}(?!\w|\.\d)', self.tokens[pid], text)
        return TAG_RE.sub(lambda m: f' {m.group(1)} {m.group(2)}]', text)

    # ------------------------------------------------------------ processes

    def ui(self, commands: List[str]) -> subprocess.CompletedProcess:
        """One control UI process with a batch."""
        return subprocess.run(self.control, input='\n'.join(commands) + '\n', env=self.env, capture_output=True, text=True,
                              timeout=self.timeout, check=False)

    def server_pids(self) -> List[int]:
        """Current servers (learns their tokens); an extra UI session."""
        proc = self.ui(['get_server_list'])
        pids = [int(x) for x in proc.stdout.split() if x.isdigit()] if proc.returncode == 0 else []
        for pid in pids:
            self.token('SERVER', pid)
        return pids

    def read_pidfile(self) -> Optional[str]:
        """Raw pid file content, or None."""
        try:
            with open(os.path.join(self.pipe, 'nvidia-cuda-mps-control.pid'), encoding='utf-8') as handle:
                return handle.read()
        except OSError:
            return None

    def expand(self, commands: List[str]) -> List[str]:
        """Fill {server} (the first server of get_server_list, one extra UI session) and {client:NAME}."""
        if any('{server}' in c for c in commands):
            pids = self.server_pids()
            commands = [c.replace('{server}', str(pids[0]) if pids else '0') for c in commands]
        for name, proc in self.clients.items():
            commands = [c.replace(f'{{client:{name}}}', str(proc.pid)) for c in commands]
        return commands

    # ------------------------------------------------------------ steps

    def run(self, steps: Optional[List[dict]] = None) -> List[dict]:
        """Play the steps; a result per step (also in self.results as they come)."""
        self.results = []
        try:
            for step in STEPS if steps is None else steps:
                result = self.step(step)
                result.update({'id': step['id'], 'op': step['op'], 'tag': step['tag']})
                self.results.append(result)
        finally:
            self.cleanup()
        return self.results

    def step(self, step: dict) -> dict:  # pylint: disable=too-many-return-statements,too-many-branches
        """One step; a dict with rc/stdout/stderr/data as they apply."""
        op = step['op']
        if op == 'ui':
            deadline = time.monotonic() + (10.0 if step.get('settle') else 0.0)
            commands = self.expand(step['commands'])
            while True:
                result = self.ui_step(step, commands)
                if not check(step, result) or time.monotonic() > deadline:
                    return result
                time.sleep(0.1)
        if op == 'start':
            proc = subprocess.run(self.control + step['args'], env=self.env, capture_output=True, text=True, timeout=self.timeout, check=False)
            raw = self.read_pidfile()
            if raw and raw.strip().isdigit() and int(raw) not in self.tokens:
                self.token('DAEMON', int(raw))
                self.daemon_pids.append(int(raw))
            return {'rc': proc.returncode, 'stdout': self.normalise(proc.stdout), 'stderr': self.normalise(proc.stderr)}
        if op == 'files':
            return {'data': snapshot(self.pipe)}
        if op == 'pidfile':
            raw = self.read_pidfile()
            return {'data': None if raw is None else self.normalise(raw)}
        if op == 'client':
            return self.start_client(step)
        if op == 'client_stop':
            proc = self.clients[step['name']]
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                return {'rc': proc.wait(self.timeout)}
            except subprocess.TimeoutExpired:
                return {'rc': 'still running'}
        if op == 'client_state':
            proc = self.clients[step['name']]
            try:
                code = proc.wait(5)
                return {'data': 'exited 0' if code == 0 else 'exited non-zero'}
            except subprocess.TimeoutExpired:
                return {'data': 'still running'}
        if op == 'wait_daemon_exit':
            pid = self.daemon_pids[-1] if self.daemon_pids else 0
            deadline = time.monotonic() + self.timeout
            while pid and alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            return {'rc': 0 if not pid or not alive(pid) else 'still running'}
        if op == 'log':
            try:
                with open(os.path.join(self.logdir, step['which']), encoding='utf-8', errors='replace') as handle:
                    text = handle.read()
            except OSError:
                text = ''
            return {'data': self.normalise(text)}
        if op == 'locks':
            return {'data': [self.normalise(entry) for entry in proc_locks(os.path.join(self.pipe, 'control_lock'))]}
        if op == 'socket':
            return {'data': try_connect(os.path.join(self.pipe, 'control'))}
        if op == 'pipe_length':
            return self.pipe_length(step['length'])
        raise ValueError(f'unknown op {op}')

    def pipe_length(self, length: int) -> dict:
        """``-d`` with a pipe dir of exactly ``length`` bytes (next to the main one, own log dir); what it left.

        Whatever it started is quit, then killed: nothing of it outlives the step.
        """
        base = os.path.dirname(self.pipe)
        prefix = os.path.join(base, f'pipe{length}-')
        pipe = prefix + 'x' * (length - len(prefix.encode()))
        logdir = os.path.join(base, f'log{length}')
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logdir)
        proc = subprocess.run(self.control + ['-d'], env=env, capture_output=True, text=True, timeout=self.timeout, check=False)
        time.sleep(1.0)  # a daemon that dies on its own has done so by now
        files = snapshot(pipe)
        try:
            written = os.path.getsize(os.path.join(logdir, 'control.log')) > 0
        except OSError:
            written = False
        owners = processes_with(f'CUDA_MPS_PIPE_DIRECTORY={pipe}')
        ui = subprocess.run(self.control, input='get_server_list\n', env=env, capture_output=True, text=True, timeout=self.timeout, check=False)
        data = {'files': None if files is None else sorted(files), 'control_log': 'written' if written else 'nothing',
                'daemon': 'running' if owners else 'gone', 'ui': f'{ui.returncode} {ui.stdout}{ui.stderr}'}
        if owners:
            try:
                subprocess.run(self.control, input='quit -t 1\n', env=env, capture_output=True, text=True, timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                pass
            kill_all(processes_with(f'CUDA_MPS_PIPE_DIRECTORY={pipe}'))
        return {'rc': proc.returncode, 'stdout': self.normalise(proc.stdout), 'stderr': self.normalise(proc.stderr), 'data': data}

    def ui_step(self, step: dict, commands: List[str]) -> dict:
        """A UI batch (placeholders already filled); normalised output."""
        proc = self.ui(commands)
        if commands == ['get_server_list'] and proc.returncode == 0:
            for pid in proc.stdout.split():
                if pid.isdigit():
                    self.token('SERVER', int(pid))
        out = proc.stdout
        if step.get('normalise') == 'ps':
            out = '\n'.join(' '.join(line.split(' ')[:5] + ['<COMMAND>']) if i else line
                            for i, line in enumerate(out.splitlines())) + ('\n' if out else '')
        return {'rc': proc.returncode, 'stdout': self.normalise(out), 'stderr': self.normalise(proc.stderr),
                'commands': [self.normalise(c) for c in commands]}

    def start_client(self, step: dict) -> dict:
        """Start a client; wait for its first line (it connected and has a server)."""
        proc = subprocess.Popen(self.client_cmd + step['args'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                                stderr=subprocess.PIPE, text=True, env=self.env)
        self.clients[step['name']] = proc
        self.token('CLIENT', proc.pid)
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], self.timeout)[0]
        line = proc.stdout.readline() if ready else ''
        try:
            info = json.loads(line) if line else {}
        except ValueError:
            info = {'raw': line}
        if isinstance(info.get('server_pid'), int):
            self.token('SERVER', info['server_pid'])
        return {'rc': proc.poll(), 'data': 'connected' if info.get('ok') else f'failed: {line.strip()}'}

    def cleanup(self) -> None:
        """Stop clients; make sure no daemon or server of this run survives."""
        for proc in self.clients.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        raw = self.read_pidfile()
        pids = list(self.daemon_pids) + ([int(raw)] if raw and raw.strip().isdigit() else [])
        if any(alive(p) for p in pids):
            try:
                self.ui(['quit -t 1'])
            except subprocess.TimeoutExpired:
                pass
        kill_all(pids + [p for p, t in self.tokens.items() if t.startswith('<SERVER')])
        # anything else started with this run's directories (a daemon of a pipe_length step, a server
        # the run never learnt of): its environment names them
        kill_all(processes_with(os.path.dirname(self.pipe) + os.sep))


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat', encoding='utf-8') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


def kill_all(pids: List[int]) -> None:
    """SIGKILL the live ones, wait (briefly) until they are gone."""
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def processes_with(text: str) -> List[int]:
    """Pids (not this one) whose environment holds text (root reads every process's)."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f'/proc/{entry}/environ', 'rb') as handle:
                    if text.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def proc_locks(path: str) -> List[str]:
    """The /proc/locks entries held on a file: ``KIND MODE ACCESS PID`` each (e.g. ``POSIX ADVISORY WRITE 4242``)."""
    try:
        st = os.stat(path)
        with open('/proc/locks', encoding='ascii') as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == '->':  # '->': a waiter, not a holder
            continue
        parts = fields[5].split(':')
        if len(parts) == 3 and (int(parts[0], 16), int(parts[1], 16), int(parts[2])) == wanted:
            found.append(' '.join(fields[1:5]))
    return found


def try_connect(path: str) -> str:
    """Whether a daemon answers on its control socket: ``accepts`` or the errno's name (ENOENT, ECONNREFUSED...)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
        return 'accepts'
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        sock.close()


def answers(results: List[dict]) -> List[str]:
    """The QUESTIONS with what a run answered, one line each."""
    by_id = {r['id']: r for r in results}
    lines = []
    for label, step_id, field in QUESTIONS:
        result = by_id.get(step_id)
        if result is None:
            value: object = 'not run'
        elif field == 'all':
            value = {k: result[k] for k in ('rc', 'stdout', 'stderr', 'data') if k in result}
        elif field == 'start':
            value = [line.split('] ', 1)[-1] for line in (result.get('data') or '').splitlines()
                     if re.search(r'\] (Starting control daemon|To connect CUDA|CUDA MPS Control binary version)', line)]
        else:
            value = result.get(field)
        lines.append(f'{label}: {json.dumps(value, sort_keys=True)}')
    return lines


def snapshot(pipe: str) -> Optional[Dict[str, str]]:
    """Pipe dir entries: name -> 'kind mode'."""
    try:
        names = sorted(os.listdir(pipe))
    except OSError:
        return None
    out = {}
    for name in names:
        mode = os.lstat(os.path.join(pipe, name)).st_mode
        kind = ('socket' if stat.S_ISSOCK(mode) else 'fifo' if stat.S_ISFIFO(mode) else 'file' if stat.S_ISREG(mode)
                else 'dir' if stat.S_ISDIR(mode) else 'other')
        out[name] = f'{kind} {stat.S_IMODE(mode):04o}'
    return out


def check(step: dict, result: dict) -> List[str]:
    """Where a result misses a step's expectation (empty list: as expected)."""
    problems = []
    for key, want in step.get('expect', {}).items():
        got = (result.get('stdout', '') + result.get('stderr', '')) if key == 'stdout+stderr' else result.get(key)
        if got != want:
            problems.append(f'{step["id"]} [{step["tag"]}] {key}: expected {want!r}, got {got!r}')
    return problems
