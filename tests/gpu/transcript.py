# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One MPS transcript, played against the real ``nvidia-cuda-mps-control`` or the simulator.

STEPS is data: control UI batches, daemon starts, clients, signals, snapshots of the
pipe dir, the processes and the logs, in the order the real-GPU probes of 2026-12-04
asked them (``shared/gpu-evidence/tools/gpu-probe*.sh``), so that the real answers
recorded then are answers to exactly these steps.  ``Runner`` plays the steps with a
given control command and client command and returns normalised results: pids are
tokens (``<DAEMON1>``, ``<SERVER1>``, ``<CLIENT1>``), timestamps ``<TS>``, the run's
directory ``<BASE>``, the GPU's UUID ``<GPU0>`` (its ``ps`` form ``<GPU0-SHORT>``).

The real answers live in ``tests/fakes/mps/recorded/`` (one JSON file per real run,
``record.py`` writes it from ``compare_mps.py --json``); ``differences`` compares a
result with a recorded answer.  A step's ``expect`` is what the simulator answers
where no real run has answered yet (tag I or U); a step a real run answered is
tagged C and has no ``expect``: the recording is its expectation.

Used by ``tests/fakes/mps/test_recorded.py`` (the simulator must give every recorded
answer), ``tests/fakes/mps/test_transcript.py`` (and every ``expect``) and
``compare_mps.py`` (real vs simulator vs recording, on a GPU host).
Standard library only; runs on python3 >= 3.8.
"""
from __future__ import annotations

import errno
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import time
from typing import Dict, List, Optional

NO_DAEMON = 'Cannot find MPS control daemon process\n'
ALREADY = 'An instance of this daemon is already running\n'
MISSING_UUID = 'GPU-00000000-0000-0000-0000-000000000000'
NOBODY = 65534

# op: ui (commands), start (args: a daemon start; learns the daemon's pid), cli (args: any other
#     invocation), mkdirs (pipe and log dirs, as the modules create them), rm_pipe, files, pidfile,
#     client (name, uid, wait), client_stop, client_kill, client_state, wait_daemon_exit, signal_daemon (signal),
#     procs, log (which, view), locks (/proc/locks on control_lock), socket (a SOCK_STREAM connect
#     to <pipe>/control, as the probe did), pipe_length (a -d of its own in a pipe dir of `length` bytes)
STEPS: List[dict] = [
    # --- probe.txt: one daemon, one GPU (by UUID), the questions of the simulator's switches
    {'id': 'no-daemon', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list']},
    {'id': 'start-no-dirs', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'files-no-dirs', 'op': 'files', 'tag': 'C'},
    {'id': 'mkdirs', 'op': 'mkdirs', 'tag': 'C'},
    {'id': 'start', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'files-running', 'op': 'files', 'tag': 'C'},
    {'id': 'locks-running', 'op': 'locks', 'tag': 'C'},
    {'id': 'socket-running', 'op': 'socket', 'tag': 'C'},
    {'id': 'start-again', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'pidfile', 'op': 'pidfile', 'tag': 'C'},
    {'id': 'defaults', 'op': 'ui', 'tag': 'C',
     'commands': ['get_default_active_thread_percentage', 'get_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit {uuid}']},
    {'id': 'unknown-and-bad', 'op': 'ui', 'tag': 'C',
     'commands': ['frobnicate', 'set_default_active_thread_percentage 150', 'set_default_active_thread_percentage abc']},
    # not asked of a real daemon yet: a usage error, a bad memory value, an unknown server pid
    {'id': 'other-errors', 'op': 'ui', 'tag': 'U',
     'commands': ['get_default_client_priority', 'set_default_active_thread_percentage', 'set_default_device_pinned_mem_limit 0 12X',
                  'get_server_status 1'],
     'expect': {'rc': 0, 'stdout': '0\nInvalid arguments for set_default_active_thread_percentage\nInvalid value: 12X\n'
                                   'Server with PID 1 not found\n'}},
    {'id': 'mem-missing-device', 'op': 'ui', 'tag': 'C',
     'commands': ['set_default_device_pinned_mem_limit 7 2G', 'get_default_device_pinned_mem_limit 7',
                  f'set_default_device_pinned_mem_limit {MISSING_UUID} 2G', f'get_default_device_pinned_mem_limit {MISSING_UUID}']},
    {'id': 'set-read-back', 'op': 'ui', 'tag': 'C',
     'commands': ['set_default_active_thread_percentage 30', 'set_default_device_pinned_mem_limit 0 3G', 'get_default_active_thread_percentage',
                  'get_default_device_pinned_mem_limit 0', 'set_default_device_pinned_mem_limit 0 1536M', 'get_default_device_pinned_mem_limit 0',
                  'set_default_device_pinned_mem_limit 0 3072M', 'get_default_device_pinned_mem_limit 0', 'set_default_device_pinned_mem_limit 0 3G']},
    {'id': 'client1', 'op': 'client', 'tag': 'C', 'name': 'c1'},
    {'id': 'server-list', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list']},
    {'id': 'server-state', 'op': 'ui', 'tag': 'C', 'normalise': 'ps',
     'commands': ['get_active_thread_percentage {server}', 'get_device_pinned_mem_limit {server} 0', 'get_device_client_list {server}', 'ps',
                  'ps -p {server}']},
    {'id': 'server-status', 'op': 'ui', 'tag': 'I', 'commands': ['get_server_status {server}', 'get_client_list {server}'],
     'expect': {'rc': 0, 'stdout': 'ACTIVE\n<CLIENT1>\n'}},
    {'id': 'quit-t', 'op': 'ui', 'tag': 'C', 'commands': ['quit -t 3'], 'timed': True},
    {'id': 'quit-t-client', 'op': 'client_state', 'tag': 'C', 'name': 'c1'},
    {'id': 'daemon-exit', 'op': 'wait_daemon_exit', 'tag': 'C'},
    {'id': 'procs-after-quit-t', 'op': 'procs', 'tag': 'C'},
    {'id': 'files-after-quit-t', 'op': 'files', 'tag': 'C'},
    {'id': 'socket-after-quit-t', 'op': 'socket', 'tag': 'C'},
    {'id': 'locks-after-quit-t', 'op': 'locks', 'tag': 'C'},
    # a client whose server is gone exits non-zero once released (the simulator's answer; unrecorded)
    {'id': 'client1-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c1', 'expect': {'rc': 1}},
    {'id': 'restart', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'defaults-lost', 'op': 'ui', 'tag': 'C',
     'commands': ['get_default_active_thread_percentage', 'get_default_device_pinned_mem_limit 0', 'start_server -uid 0', 'get_server_list']},
    {'id': 'shutdown-server', 'op': 'ui', 'tag': 'C', 'commands': ['shutdown_server {server}', 'get_server_list']},
    {'id': 'server-gone', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list'], 'settle': True},
    {'id': 'quit', 'op': 'ui', 'tag': 'C', 'commands': ['quit']},
    {'id': 'daemon-exit-2', 'op': 'wait_daemon_exit', 'tag': 'C'},
    {'id': 'files-after-quit', 'op': 'files', 'tag': 'C'},
    {'id': 'socket-after-quit', 'op': 'socket', 'tag': 'C'},
    # the pipe dir length limit, each dir created first: 87 bytes work, 88 fail without a word
    {'id': 'pipe-87', 'op': 'pipe_length', 'tag': 'C', 'length': 87},
    {'id': 'pipe-88', 'op': 'pipe_length', 'tag': 'C', 'length': 88},
    {'id': 'control-log-start', 'op': 'log', 'tag': 'C', 'which': 'control.log', 'view': 'start'},
    {'id': 'control-log-first-ui', 'op': 'log', 'tag': 'C', 'which': 'control.log', 'view': 'first_ui'},
    # --- probe2.txt: the help, unknown options, client priority, a second user without multi-user mode
    {'id': 'help', 'op': 'cli', 'tag': 'C', 'args': ['-h']},
    {'id': 'option-S', 'op': 'cli', 'tag': 'C', 'args': ['-d', '-S']},
    {'id': 'after-option-S', 'op': 'ui', 'tag': 'C', 'commands': ['get_default_active_thread_percentage']},
    {'id': 'option-p', 'op': 'cli', 'tag': 'C', 'args': ['-d', '-p', '3']},
    {'id': 'after-option-p', 'op': 'ui', 'tag': 'C', 'commands': ['get_default_active_thread_percentage']},
    # static SM partitions (CUDA 13.1, binary 13010): -v is how NVIDIA's own tools read the binary version; on r580 neither
    # -v nor lspart is in the help (the simulator answers as for any unknown option or command there) - not yet asked
    {'id': 'option-v', 'op': 'cli', 'tag': 'I', 'args': ['-v']},
    {'id': 'start-3', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'priority', 'op': 'ui', 'tag': 'C',
     'commands': ['get_default_client_priority', 'set_default_client_priority 1', 'get_default_client_priority', 'set_default_client_priority 0']},
    {'id': 'lspart', 'op': 'ui', 'tag': 'I', 'commands': ['lspart']},
    {'id': 'client-root', 'op': 'client', 'tag': 'C', 'name': 'c2'},
    {'id': 'client-other-user', 'op': 'client', 'tag': 'C', 'name': 'c3', 'uid': NOBODY, 'wait': 8},
    {'id': 'other-user-ps', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list', 'ps'], 'normalise': 'ps'},
    {'id': 'other-user-log', 'op': 'log', 'tag': 'C', 'which': 'control.log', 'view': 'match:from user 65534'},
    {'id': 'client-root-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c2', 'expect': {'rc': 0}},
    {'id': 'quit-3', 'op': 'ui', 'tag': 'I', 'commands': ['quit -t 3'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'daemon-exit-3', 'op': 'wait_daemon_exit', 'tag': 'C'},
    {'id': 'client-other-user-kill', 'op': 'client_kill', 'tag': 'C', 'name': 'c3'},
    # --- probe3.txt: the control daemon killed -9, sent TERM, its pipe dir deleted under it
    {'id': 'start-4', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'client4', 'op': 'client', 'tag': 'C', 'name': 'c4'},
    {'id': 'kill-9', 'op': 'signal_daemon', 'tag': 'C', 'signal': 'KILL', 'settle': 2},
    {'id': 'procs-after-kill-9', 'op': 'procs', 'tag': 'C'},
    {'id': 'files-after-kill-9', 'op': 'files', 'tag': 'C'},
    {'id': 'ui-after-kill-9', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list']},
    {'id': 'start-after-kill-9', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'client5', 'op': 'client', 'tag': 'C', 'name': 'c5'},
    {'id': 'serves-after-kill-9', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list', 'ps'], 'normalise': 'ps'},
    {'id': 'client4-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c4', 'expect': {'rc': 1}},
    {'id': 'client5-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c5', 'expect': {'rc': 0}},
    {'id': 'quit-5', 'op': 'ui', 'tag': 'I', 'commands': ['quit -t 3'], 'expect': {'rc': 0, 'stdout': ''}},
    {'id': 'daemon-exit-5', 'op': 'wait_daemon_exit', 'tag': 'C'},
    {'id': 'start-6', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'client6', 'op': 'client', 'tag': 'C', 'name': 'c6'},
    {'id': 'term', 'op': 'signal_daemon', 'tag': 'C', 'signal': 'TERM', 'settle': 3},
    {'id': 'procs-after-term', 'op': 'procs', 'tag': 'C'},
    {'id': 'files-after-term', 'op': 'files', 'tag': 'C'},
    {'id': 'client6-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c6', 'expect': {'rc': 1}},
    {'id': 'start-7', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'rm-pipe', 'op': 'rm_pipe', 'tag': 'C', 'settle': 1},
    {'id': 'procs-after-rm-pipe', 'op': 'procs', 'tag': 'C'},
    {'id': 'ui-after-rm-pipe', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list']},
    {'id': 'mkdirs-again', 'op': 'mkdirs', 'tag': 'C'},
    {'id': 'second-daemon', 'op': 'start', 'tag': 'C', 'args': ['-d']},
    {'id': 'client7', 'op': 'client', 'tag': 'C', 'name': 'c7'},
    {'id': 'server-list-second', 'op': 'ui', 'tag': 'C', 'commands': ['get_server_list']},
    {'id': 'procs-two-daemons', 'op': 'procs', 'tag': 'C'},
    {'id': 'client7-stop', 'op': 'client_stop', 'tag': 'I', 'name': 'c7', 'expect': {'rc': 0}},
    # the second daemon exits after its quit (the H200: gone 2 s later); waited for, not slept on - a loaded machine's
    # simulated daemon took longer than 2 s, and two simulator runs differed
    {'id': 'quit-second', 'op': 'ui', 'tag': 'C', 'commands': ['quit'], 'settle': 'daemon_exit'},
    {'id': 'procs-after-quit-second', 'op': 'procs', 'tag': 'C'},
    {'id': 'control-log-last-ui', 'op': 'log', 'tag': 'C', 'which': 'control.log', 'view': 'last_ui'},
]

TS_RE = re.compile(r'\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} ')
TAG_RE = re.compile(r' (Control|Server|Other|Legacy Server)\s+(<[A-Z]+\d+>|\d+)\]')
PREFIX_RE = re.compile(r'^\[<TS> (Control|Server|Other|Legacy Server) (<[A-Z]+\d+>|\d+)\] ')
PS_HEADER = ['PID', 'ID', 'SERVER', 'DEVICE', 'NAMESPACE', 'COMMAND']
START_RE = re.compile(r'^(Starting control daemon|To connect CUDA|CUDA MPS Control binary version)')
SIGNALS = {'KILL': signal.SIGKILL, 'TERM': signal.SIGTERM}


class Runner:  # pylint: disable=too-many-instance-attributes
    """Play STEPS against one implementation; collect normalised results."""

    def __init__(self, control: List[str], client: List[str], env: Dict[str, str], timeout: float = 20.0) -> None:
        self.control = control
        self.client_cmd = client
        self.env = env
        self.pipe = env['CUDA_MPS_PIPE_DIRECTORY']
        self.logdir = env['CUDA_MPS_LOG_DIRECTORY']
        self.base = os.path.dirname(self.pipe)
        visible = env.get('CUDA_VISIBLE_DEVICES', '')
        self.uuid = visible if visible.startswith('GPU-') and ',' not in visible else MISSING_UUID
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
        """Timestamps to <TS>, known pids to tokens, the run's dir to <BASE>, the GPU's UUID to <GPU0>, log tag padding to one space."""
        text = TS_RE.sub('[<TS> ', text)
        text = text.replace(self.base, '<BASE>')
        if self.uuid != MISSING_UUID:
            text = text.replace(self.uuid, '<GPU0>').replace(self.uuid[:22], '<GPU0-SHORT>')
        for pid in sorted(self.tokens, key=lambda p: -len(str(p))):
            # not inside a word, a token, a dashed id (a GPU UUID's all-digit group, such as -4000-), a size (1.50)
            # or a CUDA error code (805): pids are small numbers on a fresh machine (the H200 gave 451-516) and
            # may equal any of them.  <pid>.<n> is a client list entry and is replaced.
            text = re.sub(rf'(?<![\w<-])(?<!"code": )(?<!error ){pid}(?![\w>-]|\.\d\d)', self.tokens[pid], text)
        return TAG_RE.sub(lambda m: f' {m.group(1)} {m.group(2)}]', text)

    # ------------------------------------------------------------ processes

    def ui(self, commands: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """One control UI process with a batch."""
        return subprocess.run(self.control, input='\n'.join(commands) + '\n', env=env or self.env, capture_output=True, text=True,
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
        """Fill {uuid}, {server} (the first server of get_server_list, one extra UI session) and {client:NAME}."""
        commands = [c.replace('{uuid}', self.uuid) for c in commands]
        if any('{server}' in c for c in commands):
            pids = self.server_pids()
            commands = [c.replace('{server}', str(pids[0]) if pids else '0') for c in commands]
        for name, proc in self.clients.items():
            commands = [c.replace(f'{{client:{name}}}', str(proc.pid)) for c in commands]
        return commands

    def live_daemons(self) -> List[int]:
        """The daemons this run started that still run."""
        return [pid for pid in self.daemon_pids if alive(pid)]

    # ------------------------------------------------------------ steps

    def run(self, steps: Optional[List[dict]] = None, until: Optional[str] = None) -> List[dict]:
        """Play the steps (up to and including ``until``); a result per step (also in self.results as they come)."""
        self.results = []
        try:
            for step in STEPS if steps is None else steps:
                result = self.step(step)
                result.update({'id': step['id'], 'op': step['op'], 'tag': step['tag']})
                self.results.append(result)
                if step['id'] == until:
                    break
        finally:
            self.cleanup()
        return self.results

    def step(self, step: dict) -> dict:  # pylint: disable=too-many-return-statements,too-many-branches
        """One step; a dict with rc/stdout/stderr/data as they apply."""
        op = step['op']
        if op == 'ui':
            return self.ui_step(step)
        if op in ('start', 'cli'):
            proc = subprocess.run(self.control + step['args'], env=self.env, capture_output=True, text=True, timeout=self.timeout, check=False)
            raw = self.read_pidfile() if op == 'start' else None
            deadline = time.monotonic() + 2.0
            while op == 'start' and proc.returncode == 0 and time.monotonic() < deadline and not (
                    raw and raw.strip().isdigit() and int(raw) not in self.daemon_pids and alive(int(raw))):
                time.sleep(0.05)  # the pid file of the daemon just started (a stale one may be there)
                raw = self.read_pidfile()
            if raw and raw.strip().isdigit() and int(raw) not in self.tokens and alive(int(raw)):
                self.token('DAEMON', int(raw))
                self.daemon_pids.append(int(raw))
            return {'rc': proc.returncode, 'stdout': self.normalise(proc.stdout), 'stderr': self.normalise(proc.stderr)}
        if op == 'mkdirs':
            for path in (self.pipe, self.logdir):
                os.makedirs(path, mode=0o755, exist_ok=True)
            return {}
        if op == 'rm_pipe':
            shutil.rmtree(self.pipe, ignore_errors=True)
            time.sleep(step.get('settle', 0))
            return {}
        if op == 'files':
            return {'data': snapshot(self.pipe)}
        if op == 'pidfile':
            raw = self.read_pidfile()
            return {'data': None if raw is None else self.normalise(raw)}
        if op == 'client':
            return self.start_client(step)
        if op == 'client_stop':
            return self.stop_clients(step['name'].split(','))
        if op == 'client_kill':
            kill_all([self.clients[step['name']].pid])
            return {}
        if op == 'client_state':
            return {'data': self.client_state(self.clients[step['name']], 5)}
        if op == 'wait_daemon_exit':
            pid = self.daemon_pids[-1] if self.daemon_pids else 0
            deadline = time.monotonic() + self.timeout
            while pid and alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            return {'rc': 0 if not pid or not alive(pid) else 'still running'}
        if op == 'signal_daemon':
            pid = self.daemon_pids[-1]
            os.kill(pid, SIGNALS[step['signal']])
            time.sleep(step.get('settle', 0))
            return {}
        if op == 'procs':
            return {'data': self.procs()}
        if op == 'log':
            return {'data': self.log_view(step['which'], step['view'])}
        if op == 'locks':
            return {'data': [self.normalise(entry) for entry in proc_locks(os.path.join(self.pipe, 'control_lock'))]}
        if op == 'socket':
            return {'data': try_connect(os.path.join(self.pipe, 'control'))}
        if op == 'pipe_length':
            return self.pipe_length(step['length'])
        raise ValueError(f'unknown op {op}')

    def ui_step(self, step: dict) -> dict:
        """A UI batch; with ``settle`` repeated (up to 10 s) until it meets its expectation or, without one, for ``settle`` seconds first."""
        commands = self.expand(step['commands'])
        settle = step.get('settle')
        if settle == 'daemon_exit':
            result = self.ui_step(dict(step, settle=None))
            self.step({'op': 'wait_daemon_exit'})
            return result
        if settle and 'expect' not in step:
            time.sleep(settle if not isinstance(settle, bool) else 2)
        deadline = time.monotonic() + (10.0 if settle and 'expect' in step else 0.0)
        while True:
            started = time.monotonic()
            proc = self.ui(commands)
            elapsed = time.monotonic() - started
            if 'get_server_list' in commands or any(c.startswith('start_server') for c in commands):
                if proc.returncode == 0:
                    for pid in proc.stdout.split('\n'):
                        if pid.strip().isdigit():
                            self.token('SERVER', int(pid))
            out = normalise_ps(proc.stdout) if step.get('normalise') == 'ps' else proc.stdout
            result = {'rc': proc.returncode, 'stdout': self.normalise(out), 'stderr': self.normalise(proc.stderr),
                      'commands': [self.normalise(c) for c in commands]}
            if step.get('timed'):
                result['data'] = {'seconds': round(elapsed)}
            if not check(step, result) or time.monotonic() > deadline:
                return result
            time.sleep(0.1)

    def pipe_length(self, length: int) -> dict:
        """``-d`` with a pipe dir of exactly ``length`` bytes, created first (next to the main one, own log dir); what it left.

        Whatever it started is quit, then killed: nothing of it outlives the step.
        """
        prefix = os.path.join(self.base, f'pipe{length}-')
        pipe = prefix + 'x' * (length - len(prefix.encode()))
        logdir = os.path.join(self.base, f'log{length}')
        os.makedirs(pipe, mode=0o755, exist_ok=True)
        os.makedirs(logdir, mode=0o755, exist_ok=True)
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logdir)
        proc = subprocess.run(self.control + ['-d'], env=env, capture_output=True, text=True, timeout=self.timeout, check=False)
        time.sleep(1.0)  # a daemon that dies on its own has done so by now
        files = snapshot(pipe)
        owners = processes_with(f'CUDA_MPS_PIPE_DIRECTORY={pipe}\0')
        ui = self.ui(['get_default_active_thread_percentage'], env)
        try:
            with open(os.path.join(logdir, 'control.log'), encoding='utf-8', errors='replace') as handle:
                lines = handle.read().replace(pipe, f'<PIPE{length}>').splitlines()[:5]
        except OSError:
            lines = []
        data = {'files': None if files is None else sorted(files), 'daemon': 'running' if owners else 'gone',
                'ui': f'{ui.returncode} {ui.stdout}{ui.stderr}', 'control_log': [strip_prefix(self.normalise(line)) for line in lines]}
        if owners:
            try:
                self.ui(['quit -t 1'], env)
            except subprocess.TimeoutExpired:
                pass
            kill_all(processes_with(f'CUDA_MPS_PIPE_DIRECTORY={pipe}\0'))
        return {'rc': proc.returncode, 'stdout': self.normalise(proc.stdout), 'stderr': self.normalise(proc.stderr), 'data': data}

    def start_client(self, step: dict) -> dict:
        """Start a client (as ``uid`` where given); wait up to ``wait`` s for its first line (it connected and has a server)."""
        uid = step.get('uid')
        if uid is not None and os.geteuid() != 0:
            return {'data': 'not run: needs root to start a client as another user'}
        args = ['--uid', str(uid)] if uid is not None else []  # both clients drop to it themselves, before they connect
        proc = subprocess.Popen(self.client_cmd + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                                stderr=subprocess.PIPE, text=True, env=self.env)
        self.clients[step['name']] = proc
        self.token('CLIENT', proc.pid)
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], step.get('wait', self.timeout))[0]
        line = proc.stdout.readline() if ready else ''
        if not ready:
            return {'data': f'no answer in {step.get("wait", self.timeout)} s'}
        try:
            info = json.loads(line) if line else {}
        except ValueError:
            info = {'raw': line}
        return {'data': 'connected' if info.get('ok') else f'failed: {line.strip()}'}

    def stop_clients(self, names: List[str]) -> dict:
        """Close the named clients' stdin; rc 0 when each exited 0 within the timeout."""
        codes = []
        for name in names:
            proc = self.clients[name]
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            try:
                codes.append(proc.wait(self.timeout))
            except subprocess.TimeoutExpired:
                return {'rc': f'{name} still running'}
        return {'rc': max(codes) if codes else 0}

    @staticmethod
    def client_state(proc: subprocess.Popen, seconds: float) -> str:
        """Whether a client process still runs after ``seconds``."""
        try:
            code = proc.wait(seconds)
            return 'exited 0' if code == 0 else 'exited non-zero'
        except subprocess.TimeoutExpired:
            return 'still running'

    def procs(self) -> dict:
        """What runs: the daemons of this run, the servers (any other process whose environment names this run's pipe dir), the clients still running."""
        daemons = self.live_daemons()
        clients = sorted(name for name, proc in self.clients.items() if proc.poll() is None)
        client_pids = {proc.pid for proc in self.clients.values()}
        servers = [pid for pid in processes_with(f'CUDA_MPS_PIPE_DIRECTORY={self.pipe}\0') if pid not in daemons and pid not in client_pids
                   and parent(pid) not in client_pids]
        return {'daemons': [self.token('DAEMON', pid) for pid in daemons], 'servers': len(servers), 'clients': clients}

    def log_view(self, which: str, view: str) -> List[str]:
        """Lines of a log (prefix stripped, normalised): ``start``, ``first_ui``, ``last_ui`` or ``match:TEXT``."""
        try:
            with open(os.path.join(self.logdir, which), encoding='utf-8', errors='replace') as handle:
                lines = [strip_prefix(self.normalise(line)) for line in handle.read().splitlines()]
        except OSError:
            return []
        if view == 'start':
            return [line for line in lines if START_RE.match(line)][:3]
        if view.startswith('match:'):
            return [line for line in lines if view[6:] in line]
        starts = [i for i, line in enumerate(lines) if line == 'NEW UI']
        if not starts:
            return []
        if view == 'first_ui':
            end = next((i for i in range(starts[0], len(lines)) if lines[i] == 'UI closed'), len(lines) - 1)
            return lines[starts[0]:end + 1]
        if view == 'last_ui':
            return lines[starts[-1]:]
        raise ValueError(f'unknown log view {view}')

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
        if any(alive(p) for p in pids) and os.path.isdir(self.pipe):
            try:
                self.ui(['quit -t 1'])
            except subprocess.TimeoutExpired:
                pass
        kill_all(pids + [p for p, t in self.tokens.items() if t.startswith('<SERVER')])
        # anything else started with this run's directories (a daemon of a pipe_length step, a server
        # the run never learnt of, a daemon whose pipe dir was deleted): its environment names them
        kill_all(processes_with(self.base + os.sep))


def strip_prefix(line: str) -> str:
    """A normalised log line without its ``[<TS> Control <DAEMON1>] `` prefix."""
    return PREFIX_RE.sub('', line)


def normalise_ps(text: str) -> str:
    """``ps`` output as data: the header as printed (padding included), each row as its first four columns,
    ``<NS>`` for a numeric namespace, ``<COMMAND>``, and ``(misaligned)`` where a column does not start
    under its header word.  Other lines of the batch are kept."""
    out: List[str] = []
    offsets: Optional[List[int]] = None
    for line in text.split('\n'):
        found = list(re.finditer(r'\S+', line))
        words = [m.group() for m in found]
        starts = [m.start() for m in found]
        if words == PS_HEADER:
            offsets = starts
            out.append(line)
            continue
        if offsets is not None and len(words) >= 5 and words[0].isdigit():
            aligned = starts[:6] == offsets[:6]
            namespace = '<NS>' if words[4].isdigit() else words[4]
            out.append(' '.join(words[:4] + [namespace, '<COMMAND>']) + ('' if aligned else ' (misaligned)'))
            continue
        offsets = None
        out.append(line)
    return '\n'.join(out)


def parent(pid: int) -> int:
    """The parent pid (0 when unknown)."""
    try:
        with open(f'/proc/{pid}/stat', encoding='utf-8') as handle:
            return int(handle.read().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


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
    """Live pids (not this one) whose environment holds text (root reads every process's)."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f'/proc/{entry}/environ', 'rb') as handle:
                    if text.encode() in handle.read() and alive(int(entry)):
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
    """A SOCK_STREAM connect to ``path``, as the probe did: ``accepts`` or the errno's name (EPROTOTYPE, ECONNREFUSED, ENOENT...)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return 'accepts'
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    finally:
        sock.close()


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


def differences(step_id: str, answer: dict, result: dict) -> List[str]:
    """Where a result differs from an answer (a recorded one, or a step's ``expect``).

    Keys are result fields (rc, stdout, stderr, data), ``stdout+stderr`` (the two together, for
    answers recorded with both streams in one), and ``head`` (compare only the first N lines of
    the texts: what a recording cut off is not known).
    """
    problems = []
    head = answer.get('head')
    for key, want in answer.items():
        if key == 'head':
            continue
        got = (result.get('stdout', '') + result.get('stderr', '')) if key == 'stdout+stderr' else result.get(key)
        if head and isinstance(got, str):
            got = ''.join(got.splitlines(True)[:head])
        if got != want:
            problems.append(f'{step_id} {key}: expected {want!r}, got {got!r}')
    return problems


def check(step: dict, result: dict) -> List[str]:
    """Where a result misses a step's ``expect`` (empty list: as expected, or nothing expected)."""
    return differences(step['id'], step.get('expect', {}), result)


def load_recording(path: str) -> dict:
    """A recorded real run (tests/fakes/mps/recorded/*.json)."""
    with open(path, encoding='utf-8') as handle:
        return json.load(handle)
