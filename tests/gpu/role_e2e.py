# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role end to end on one GPU of this host: what a user's first hour on a real GPU does.

Steps (each a PASS or FAIL line, then a ``SUMMARY:`` line; exit 0 when all pass):

1. ``provision``: the role with one resource ``infer`` on GPU 0, ``replicas: 4``: changed, compute mode
   EXCLUSIVE_PROCESS, the daemon answers;
2. ``client``: a CUDA client (``cuda_client.py``; the simulator's ``mps_client.py`` with ``--simulated``)
   connects through the daemon and is held;
3. ``no-op``: the same run with the client held: ``changed=0``;
4. ``limits``: ``replicas: 2`` with the client held: changed, the running server named in a warning as
   keeping its limits, the client still running;
5. ``facts``: ``mps_info`` lists the daemon, its server and the client;
6. ``busy``: ``multiuser: true`` with the client held is refused (the host fails naming the client's
   pid), nothing stopped, the client still running;
7. ``teardown``: the client released, ``mps_state: absent`` with ``mps_busy: terminate``: compute mode
   Default again, no process of this run left.

Runs the role from a copy of this checkout (``<work>/coll``) with ``ansible-playbook`` found beside this
interpreter or on PATH, or installed from ``--wheels DIR`` (ansible-core and its dependencies as wheels:
a GPU host is often offline).  Every path is under ``--work`` (a new directory under /tmp by default);
whatever it started is ended at the end.  Without a real ``nvidia-cuda-mps-control`` (an ELF file) it
prints ``SKIP: ...`` and exits 0, unless ``--simulated`` says the simulated host on PATH is meant (the
test suite runs it that way).  Standard library only; python3 >= 3.8.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
sys.path.insert(0, HERE)
import transcript  # noqa: E402  pylint: disable=wrong-import-position
import compare_mps  # noqa: E402  pylint: disable=wrong-import-position

SKIP_DIRS = {'.git', '.venv', '.simhost', '.ansible', 'collections', '__pycache__', 'output'}


class E2E:  # pylint: disable=too-many-instance-attributes
    """One run of the steps."""

    def __init__(self, work: str, python: str, client: List[str], ansible_bin: str, env: Dict[str, str]) -> None:
        self.work = work
        self.python = python
        self.client_cmd = client
        self.bin = ansible_bin
        self.env = env
        self.results: List[Tuple[str, bool, str]] = []
        self.client: Optional[subprocess.Popen] = None
        self.pipe = os.path.join(work, 'root', 'infer', 'pipe')

    def playbook(self, replicas: int, multiuser: bool = False) -> str:
        """The play: the fleet role on localhost, one resource on GPU 0, everything under the work dir."""
        path = os.path.join(self.work, 'site.yml')
        play = [{'hosts': 'localhost', 'connection': 'local', 'gather_facts': False, 'vars': {
            'mps_root': os.path.join(self.work, 'root'), 'mps_config_dir': os.path.join(self.work, 'etc'),
            'mps_python': self.python, 'mps_supervisor': 'none', 'mps_stop_timeout': 10,
            'mps_logrotate_dir': os.path.join(self.work, 'logrotate.d'), 'mps_local_facts_dir': os.path.join(self.work, 'facts.d'),
            'mps_resources': [{'name': 'infer', 'devices': [0], 'replicas': replicas, 'multiuser': multiuser}]},
            'roles': ['gpufleet.mps.fleet']}]
        with open(path, 'w', encoding='utf-8') as handle:
            json.dump(play, handle, indent=1)  # YAML reads JSON
        return path

    def play(self, name: str, replicas: int, *extra: str, multiuser: bool = False) -> subprocess.CompletedProcess:
        """ansible-playbook, its output kept in <work>/<name>.log."""
        proc = subprocess.run([os.path.join(self.bin, 'ansible-playbook'), '-i', 'localhost,', '-e', f'ansible_python_interpreter={self.python}',
                               self.playbook(replicas, multiuser), *extra], env=self.env, capture_output=True, text=True, timeout=300, check=False)
        with open(os.path.join(self.work, f'{name}.log'), 'w', encoding='utf-8') as handle:
            handle.write(proc.stdout + proc.stderr)
        return proc

    def record(self, step: str, ok: bool, detail: str) -> bool:
        """A step's verdict, printed at once."""
        self.results.append((step, ok, detail))
        print(f'{"PASS" if ok else "FAIL"} {step}: {detail}', flush=True)
        return ok

    def compute_mode(self) -> str:
        """GPU 0's compute mode as NVML reports it."""
        code = 'import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByIndex(0)))'
        proc = subprocess.run([self.python, '-c', code], env=self.env, capture_output=True, text=True, timeout=60, check=False)
        return {'0': 'Default', '2': 'Prohibited', '3': 'Exclusive_Process'}.get(proc.stdout.strip(), proc.stdout.strip() or proc.stderr.strip())

    def ask(self, *commands: str) -> str:
        """The control UI with this run's pipe dir."""
        control = shutil.which('nvidia-cuda-mps-control', path=self.env.get('PATH')) or 'nvidia-cuda-mps-control'
        proc = subprocess.run([control], input='\n'.join(commands) + '\n', env=dict(self.env, CUDA_MPS_PIPE_DIRECTORY=self.pipe),
                              capture_output=True, text=True, timeout=30, check=False)
        return proc.stdout + proc.stderr

    @staticmethod
    def recap(proc: subprocess.CompletedProcess) -> str:
        """The play recap's counts."""
        found = re.search(r'localhost\s+:\s+(ok=\d+\s+changed=\d+\s+unreachable=\d+\s+failed=\d+)', proc.stdout)
        return re.sub(r'\s+', ' ', found.group(1)) if found else f'no recap (rc {proc.returncode})'

    def run(self) -> bool:  # pylint: disable=too-many-locals
        """The seven steps; False at the first one that makes the rest meaningless."""
        up = self.play('provision', 4)
        if not self.record('provision', up.returncode == 0 and 'changed=0' not in self.recap(up) and self.compute_mode() == 'Exclusive_Process'
                           and self.ask('get_default_active_thread_percentage').strip() == '25.0',
                           f'{self.recap(up)}, compute mode {self.compute_mode()}, active threads {self.ask("get_default_active_thread_percentage").strip()}'):
            return False
        self.client = subprocess.Popen(  # pylint: disable=consider-using-with
            self.client_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(self.env, CUDA_MPS_PIPE_DIRECTORY=self.pipe))
        assert self.client.stdout is not None
        ready = select.select([self.client.stdout], [], [], 60)[0]
        line = self.client.stdout.readline() if ready else ''
        if not self.record('client', '"ok": true' in line, line.strip() or 'no answer in 60 s'):
            return False
        noop = self.play('no-op', 4)
        self.record('no-op', noop.returncode == 0 and 'changed=0' in self.recap(noop), self.recap(noop))
        limits = self.play('limits', 2)
        kept = 'keep the limits they started with' in limits.stdout + limits.stderr
        self.record('limits', limits.returncode == 0 and 'changed=1' in self.recap(limits) and kept and self.client.poll() is None,
                    f'{self.recap(limits)}, running server named as keeping its limits: {kept}, client running: {self.client.poll() is None}')
        info = subprocess.run([os.path.join(self.bin, 'ansible'), 'localhost', '-i', 'localhost,', '-c', 'local', '-e',
                               f'ansible_python_interpreter={self.python}', '-m', 'gpufleet.mps.mps_info', '-a', f'root={os.path.join(self.work, "root")}'],
                              env=self.env, capture_output=True, text=True, timeout=120, check=False)
        try:  # localhost | SUCCESS => {...}
            facts = json.loads(info.stdout[info.stdout.index('{'):])
        except ValueError:
            facts = {}
        listed = [pid for daemon in facts.get('daemons', []) for server in daemon.get('servers') or [] for pid in server.get('clients') or []]
        self.record('facts', info.returncode == 0 and self.client.pid in listed,
                    f'rc {info.returncode}, clients listed {listed} (the held one: {self.client.pid})')
        busy = self.play('busy', 2, multiuser=True)
        named = str(self.client.pid) in busy.stdout and 'busy' in busy.stdout
        self.record('busy', busy.returncode != 0 and 'failed=1' in self.recap(busy) and named and self.client.poll() is None,
                    f'{self.recap(busy)}, the client named: {named}, client running: {self.client.poll() is None}')
        self.release()
        down = self.play('teardown', 2, '-e', 'mps_state=absent', '-e', 'mps_busy=terminate')
        left = transcript.processes_with(self.work + os.sep)
        self.record('teardown', down.returncode == 0 and self.compute_mode() == 'Default' and not left,
                    f'{self.recap(down)}, compute mode {self.compute_mode()}, processes left: {left or "none"}')
        return all(ok for _step, ok, _detail in self.results)

    def release(self) -> None:
        """Let the client go (stdin closed), killed if it does not leave."""
        if self.client is None:
            return
        for stream in (self.client.stdin,):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            self.client.wait(15)
        except subprocess.TimeoutExpired:
            self.client.kill()
            self.client.wait()
        for stream in (self.client.stdout, self.client.stderr):
            if stream is not None:
                stream.close()


def copy_collection(dest: str) -> None:
    """This checkout as an installed collection (development directories left out)."""
    shutil.copytree(REPO, dest, ignore=lambda _dir, names: [n for n in names if n in SKIP_DIRS])


def ansible_bin(work: str, wheels: Optional[str], env: Dict[str, str]) -> Optional[str]:
    """The directory of ansible-playbook: installed from the wheels, beside this interpreter, or on PATH."""
    if wheels:
        site = os.path.join(work, 'site')
        subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile', '--target', site,
                        *sorted(os.path.join(wheels, n) for n in os.listdir(wheels) if n.endswith('.whl'))], check=True)
        env['PYTHONPATH'] = site
        bindir = os.path.join(work, 'bin')
        os.makedirs(bindir, exist_ok=True)
        for name in ('ansible-playbook', 'ansible'):
            with open(os.path.join(bindir, name), 'w', encoding='utf-8') as handle:
                handle.write(f'#!/bin/sh\nexec {sys.executable} {os.path.join(site, "bin", name)} "$@"\n')
            os.chmod(os.path.join(bindir, name), 0o755)
        return bindir
    beside = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(beside, 'ansible-playbook')):
        return beside
    found = shutil.which('ansible-playbook', path=env.get('PATH'))
    return os.path.dirname(found) if found else None


def main(argv: List[str]) -> int:
    """Find the stack or skip; run the steps; always clean up."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--work', help='directory for everything of this run (default: a new one under /tmp; removed at the end)')
    parser.add_argument('--python', default=sys.executable, help="the modules' interpreter (with nvidia-ml-py; default: this one)")
    parser.add_argument('--wheels', help='a directory of ansible-core wheels to install from (an offline GPU host)')
    parser.add_argument('--simulated', action='store_true', help="the simulated host on PATH is meant (the test suite's run)")
    parser.add_argument('--keep', action='store_true', help='keep the work directory (its logs)')
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(1))  # run.sh's bound: clean up as at the end
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'CUDA_VISIBLE'))}
    if not args.simulated:
        real, others = compare_mps.find_real('nvidia-cuda-mps-control')
        if real is None:
            print(f'SKIP: no real nvidia-cuda-mps-control on this host{" (only " + ", ".join(others) + ")" if others else ""}')
            return 0
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix='mpse2e', dir='/tmp')
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)
    ok = False
    run = None
    try:
        bindir = ansible_bin(work, args.wheels, env)
        if bindir is None:
            print('SKIP: no ansible-playbook beside this interpreter or on PATH, and no --wheels')
            return 0
        copy_collection(os.path.join(work, 'coll', 'ansible_collections', 'gpufleet', 'mps'))
        env.update(ANSIBLE_COLLECTIONS_PATH=os.path.join(work, 'coll'), ANSIBLE_HOME=os.path.join(work, 'ansible-home'), ANSIBLE_NOCOLOR='1',
                   ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_STDOUT_CALLBACK='default')
        client = [args.python, os.path.join(REPO, 'tests', 'fakes', 'mps', 'mps_client.py') if args.simulated else os.path.join(HERE, 'cuda_client.py')]
        run = E2E(work, args.python, client, bindir, env)
        started = time.monotonic()
        ok = run.run()
        passed = sum(1 for _step, good, _detail in run.results if good)
        print(f'SUMMARY: role end to end: {passed} of 7 steps passed in {time.monotonic() - started:.0f}s' + ('' if ok else f' (logs: {work}/*.log)'))
    finally:
        if run is not None:
            run.release()
        left = transcript.processes_with(work + os.sep)
        if left:
            print(f'ended processes this run left: {left}')
            transcript.kill_all(left)
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
