# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The MPS v3 questions: what no real r615+ binary has answered here yet, asked of one, and of the simulator beside it.

Every answer the simulator gives for protocol 3 (tests/fakes/mps/mps_v3.py) is inferred from NVIDIA's pages
(shared/mps-v3-reference.md); the points the reference marks [U] are switches there. QUESTIONS is data: daemon starts
(``-p 3``, ``-a`` files good and bad, ``-m``), v3 commands as arguments, legacy commands on stdin to a v3 daemon, clients
routed by socket (a namespace's, the main socket's), the pipe tree, ``-q`` against a v3 and a legacy daemon, and - as
root - whether a namespace directory closed to other users keeps their clients out of it (can directory permissions
narrow which namespace a host process reaches?). Each answer is normalised (the run's directory ``<BASE>``, the GPU's
UUID ``<GPU0>``, pids ``<PID>``, timestamps ``<TS>``) so that the two sides compare line by line.

Usage, on a GPU host with an r615+ driver, as root, from a checkout::

    python3 tests/gpu/v3_questions.py [--json FILE] [--keep]

``SKIP: ...`` (exit 0) where the binary has no protocol 3 (``-p 3 -h`` lists no ``namespace``), e.g. r580.
``--simulated`` plays the simulator alone (an r615 INI of its own): ``make test-fakes`` runs it so that the questions
stay playable. Exit 1 only when a side could not be played; differences are printed, not judged: a difference is the
simulator's to fix (and its switch's default to set), once a real run has recorded the answer.
Standard library only; python3 >= 3.8.
"""
from __future__ import annotations

import argparse
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
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIM_DIR = os.path.join(REPO, 'tests', 'fakes', 'mps')
sys.path.insert(0, HERE)

import compare_mps  # noqa: E402  pylint: disable=wrong-import-position

NOBODY = 65534
GOOD_TOML = ('schema_version = "1.0"\n[servers.filed]\nallowed_devices = "{uuid}"\nactive_thread_percentage = "40"\n'
             '[servers.filed.namespaces.high]\nactive_thread_percentage = "60"\npinned_memory_limit = "2G"\n')
BAD_TOML = '[servers.broken]\nbogus_key = 1\n[servers.fine]\nactive_thread_percentage = "10"\n'
# The file gpufleet.mps renders for a v3 resource (plugins/module_utils/_v3/spec.py V3Spec.toml): an int uid, a namespace
# with all three limits. What the collection relies on: the server Ready soon after -d returns, how a list prints a
# priority and an unset limit, what -q does to an attached client.
COLLECTION_TOML = ('# Written by gpufleet.mps from the resource\'s entry\nschema_version = "1.0"\n\n[servers.res]\n'
                   'allowed_devices = "{uuid}"\nuid = 0\nactive_thread_percentage = "50"\n\n[servers.res.namespaces.small]\n'
                   'active_thread_percentage = "20"\npinned_memory_limit = "2G"\nclient_priority = "1"\n\n'
                   '[servers.res.namespaces.bare]\n')

# op: cli (arguments), start (a daemon start), ui (legacy commands on stdin), log (control.log's lines), tree (the pipe
# directory: paths and modes), client (name, pipe: the sub-directory of the pipe directory it points at, uid),
# client_stop (names), chmod (path under the pipe directory, mode), config (a start with -a and that file's text), procs
QUESTIONS: List[dict] = [
    {'id': 'help', 'op': 'cli', 'args': ['-p', '3', '-h']},
    {'id': 'start', 'op': 'start', 'args': ['-d', '-p', '3']},
    {'id': 'start-log', 'op': 'log'},
    {'id': 'server-create', 'op': 'cli', 'args': ['server', 'create', 'q3', '--allowed-devices={uuid}']},
    {'id': 'server-create-ordinal', 'op': 'cli', 'args': ['server', 'create', 'q3b', '--allowed-devices=0']},
    {'id': 'server-bad-name', 'op': 'cli', 'args': ['server', 'create', 'Bad-Name']},
    {'id': 'server-list-csv', 'op': 'cli', 'args': ['server', 'list', '--format=csv'], 'settle': 2},
    {'id': 'server-list-table', 'op': 'cli', 'args': ['server', 'list']},
    {'id': 'server-get-dash', 'op': 'cli', 'args': ['server', 'get', 'q3', 'pipe-directory']},
    {'id': 'server-get-underscore', 'op': 'cli', 'args': ['server', 'get', 'q3', 'pipe_directory']},
    {'id': 'namespace-create', 'op': 'cli', 'args': ['namespace', 'create', 'a', '--server=q3']},
    {'id': 'namespace-create-b', 'op': 'cli', 'args': ['namespace', 'create', 'b', '--server=q3']},
    {'id': 'namespace-set', 'op': 'cli',
     'args': ['namespace', 'set', 'a', '--server=q3', '--active-thread-percentage=30', '--pinned-memory-limit=2G']},
    {'id': 'namespace-list-csv', 'op': 'cli', 'args': ['namespace', 'list', '--server=q3', '--format=csv']},
    {'id': 'namespace-get', 'op': 'cli', 'args': ['namespace', 'get', 'a', 'q3', 'active-thread-percentage']},
    {'id': 'pipe-tree', 'op': 'tree'},
    {'id': 'client-namespace', 'op': 'client', 'name': 'ca', 'pipe': 'q3/a'},
    {'id': 'client-main-socket', 'op': 'client', 'name': 'cm', 'pipe': ''},
    {'id': 'client-list', 'op': 'cli', 'args': ['client', 'list', '--all', '--format=csv']},
    {'id': 'server-list-uid-routing', 'op': 'cli', 'args': ['server', 'list', '--format=csv,noheader']},
    {'id': 'namespace-set-attached', 'op': 'cli', 'args': ['namespace', 'set', 'a', '--server=q3', '--active-thread-percentage=40']},
    {'id': 'namespace-delete-attached', 'op': 'cli', 'args': ['namespace', 'delete', 'a', '--server=q3']},
    {'id': 'legacy-ui', 'op': 'ui', 'commands': ['get_server_list', 'get_default_active_thread_percentage']},
    {'id': 'clients-stop', 'op': 'client_stop', 'names': ['ca', 'cm']},
    {'id': 'namespace-delete', 'op': 'cli', 'args': ['namespace', 'delete', 'a', '--server=q3'], 'settle': 1},
    {'id': 'quit', 'op': 'cli', 'args': ['-q'], 'settle': 2},
    {'id': 'procs-after-quit', 'op': 'procs'},
    {'id': 'tree-after-quit', 'op': 'tree'},
    {'id': 'config-good', 'op': 'config', 'text': GOOD_TOML},
    {'id': 'config-good-namespaces', 'op': 'cli', 'args': ['namespace', 'list', '--format=csv']},
    {'id': 'quit-2', 'op': 'cli', 'args': ['-q'], 'settle': 2},
    {'id': 'config-bad', 'op': 'config', 'text': BAD_TOML},
    {'id': 'config-bad-log', 'op': 'log'},
    {'id': 'config-bad-servers', 'op': 'cli', 'args': ['server', 'list', '--format=csv']},
    {'id': 'quit-3', 'op': 'cli', 'args': ['-q'], 'settle': 2},
    {'id': 'config-collection', 'op': 'config', 'text': COLLECTION_TOML, 'root': True},
    {'id': 'config-collection-status', 'op': 'cli', 'args': ['server', 'list', '--format=csv,noheader'], 'root': True},
    {'id': 'config-collection-namespaces', 'op': 'cli', 'args': ['namespace', 'list', '--server=res', '--format=csv,noheader'],
     'root': True, 'settle': 1},
    {'id': 'collection-client', 'op': 'client', 'name': 'cr', 'pipe': 'res/small', 'root': True},
    {'id': 'collection-quit-attached', 'op': 'cli', 'args': ['-q'], 'settle': 2, 'root': True},
    {'id': 'collection-procs', 'op': 'procs', 'root': True},
    {'id': 'collection-client-stop', 'op': 'client_stop', 'names': ['cr'], 'root': True},
    {'id': 'start-legacy', 'op': 'start', 'args': ['-d']},
    {'id': 'q-on-legacy', 'op': 'cli', 'args': ['-q'], 'settle': 2},
    {'id': 'legacy-after-q', 'op': 'ui', 'commands': ['get_server_list']},
    {'id': 'legacy-quit', 'op': 'ui', 'commands': ['quit'], 'settle': 2},
    {'id': 'start-multiuser', 'op': 'start', 'args': ['-d', '-p', '3', '-m'], 'root': True},
    {'id': 'mu-server', 'op': 'cli', 'args': ['server', 'create', 'shared', '--uid=0'], 'root': True, 'settle': 2},
    {'id': 'mu-server-uid', 'op': 'cli', 'args': ['server', 'create', 'other', f'--uid={NOBODY}'], 'root': True},
    {'id': 'mu-namespaces', 'op': 'cli', 'args': ['namespace', 'create', 'open', '--server=shared'], 'root': True},
    {'id': 'mu-namespace-closed', 'op': 'cli', 'args': ['namespace', 'create', 'closed', '--server=shared'], 'root': True},
    {'id': 'mu-chmod', 'op': 'chmod', 'path': 'shared/closed', 'mode': 0o700, 'root': True},
    {'id': 'mu-client-open', 'op': 'client', 'name': 'co', 'pipe': 'shared/open', 'uid': NOBODY, 'root': True},
    {'id': 'mu-client-closed', 'op': 'client', 'name': 'cc', 'pipe': 'shared/closed', 'uid': NOBODY, 'root': True},
    {'id': 'mu-client-list', 'op': 'cli', 'args': ['client', 'list', '--all', '--format=csv'], 'root': True},
    {'id': 'mu-stop', 'op': 'client_stop', 'names': ['co', 'cc'], 'root': True},
    {'id': 'quit-mu', 'op': 'cli', 'args': ['-q'], 'settle': 2, 'root': True},
]

TS_RE = re.compile(r'\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}')
PID_RE = re.compile(r'\b\d{3,7}\b')


class Side:  # pylint: disable=too-many-instance-attributes
    """One implementation (the real binary, or the simulator) played in a directory of its own."""

    def __init__(self, base: str, control: List[str], client: List[str], env: Dict[str, str], uuid: str) -> None:
        self.base = base
        self.pipe = os.path.join(base, 'p')
        self.logdir = os.path.join(base, 'l')
        self.control = control
        self.client_cmd = client
        self.uuid = uuid
        self.env = {k: v for k, v in env.items() if not k.startswith(('CUDA_MPS_', 'FAKE_MPS_'))}
        self.env.update(CUDA_MPS_PIPE_DIRECTORY=self.pipe, CUDA_MPS_LOG_DIRECTORY=self.logdir, CUDA_VISIBLE_DEVICES=uuid)
        self.clients: Dict[str, subprocess.Popen] = {}

    def normalise(self, text: str) -> str:
        text = text.replace(self.base, '<BASE>').replace(self.uuid, '<GPU0>')
        return PID_RE.sub('<PID>', TS_RE.sub('<TS>', text))

    def play(self, deadline: float) -> List[dict]:
        results = []
        os.makedirs(self.pipe, mode=0o755, exist_ok=True)
        os.makedirs(self.logdir, mode=0o755, exist_ok=True)
        try:
            for question in QUESTIONS:
                if time.monotonic() > deadline:
                    results.append({'id': 'deadline', 'data': 'stopped at the deadline'})
                    break
                if question.get('root') and os.geteuid() != 0:
                    results.append({'id': question['id'], 'data': 'not run: needs root'})
                    continue
                answer = self.ask(question)
                answer['id'] = question['id']
                results.append(answer)
                time.sleep(question.get('settle', 0))
        finally:
            self.cleanup()
        return results

    def ask(self, question: dict) -> dict:  # pylint: disable=too-many-return-statements
        op = question['op']
        if op in ('cli', 'start'):
            args = [arg.replace('{uuid}', self.uuid) for arg in question['args']]
            return self.run(self.control + args)
        if op == 'config':
            path = os.path.join(self.base, 'mps-%d.toml' % len(os.listdir(self.base)))
            with open(path, 'w', encoding='utf-8') as handle:
                handle.write(question['text'].replace('{uuid}', self.uuid))
            return self.run(self.control + ['-d', '-p', '3', '-a', path])
        if op == 'ui':
            return self.run(self.control, stdin='\n'.join(question['commands']) + '\n')
        if op == 'log':
            try:
                with open(os.path.join(self.logdir, 'control.log'), encoding='utf-8', errors='replace') as handle:
                    lines = handle.read().splitlines()
            except OSError as exc:
                return {'data': 'unreadable: %s' % exc.strerror}
            return {'data': [self.normalise(line.split('] ', 1)[-1]) for line in lines[-12:]]}
        if op == 'tree':
            return {'data': self.tree()}
        if op == 'chmod':
            os.chmod(os.path.join(self.pipe, question['path']), question['mode'])
            return {}
        if op == 'client':
            return self.start_client(question)
        if op == 'client_stop':
            return {'data': {name: self.stop_client(name) for name in question['names']}}
        if op == 'procs':
            return {'data': sorted(self.normalise(name) for name in processes_under(self.base))}
        raise ValueError(op)

    def run(self, argv: List[str], stdin: Optional[str] = None) -> dict:
        try:
            proc = subprocess.run(argv, input=stdin, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return {'rc': 'timeout'}
        return {'rc': proc.returncode, 'stdout': self.normalise(proc.stdout), 'stderr': self.normalise(proc.stderr)}

    def tree(self) -> List[str]:
        out = []
        for top, dirs, files in os.walk(self.pipe):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(top, name)
                try:
                    mode = os.lstat(path).st_mode
                except OSError:
                    continue
                out.append('%s %o' % (os.path.relpath(path, self.pipe), mode & 0o7777))
        return out

    def start_client(self, question: dict) -> dict:
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=os.path.join(self.pipe, question['pipe']) if question['pipe'] else self.pipe)
        argv = list(self.client_cmd) + (['--uid', str(question['uid'])] if question.get('uid') is not None else [])
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,  # pylint: disable=consider-using-with
                                text=True)
        self.clients[question['name']] = proc
        ready = select.select([proc.stdout], [], [], 20)[0]
        line = proc.stdout.readline() if ready else ''
        try:
            reply = json.loads(line) if line.strip() else {'ok': False, 'error': 'no answer within 20 s'}
        except ValueError:
            reply = {'ok': False, 'error': 'unreadable: ' + line[:200]}
        return {'data': {key: reply.get(key) for key in ('ok', 'error')}}

    def stop_client(self, name: str) -> object:
        proc = self.clients.pop(name, None)
        if proc is None:
            return None
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 'killed'

    def cleanup(self) -> None:
        for name in list(self.clients):
            self.stop_client(name)
        try:
            subprocess.run(self.control + ['-q'], env=self.env, capture_output=True, timeout=15, check=False)
        except subprocess.TimeoutExpired:
            pass
        for pid in processes_under(self.base, pids=True):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def processes_under(base: str, pids: bool = False) -> List[str]:
    """The processes whose environment or arguments name ``base``: their comm (or pid)."""
    found = []
    needle = base.encode()
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as handle:
                environ = handle.read()
            with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                cmdline = handle.read()
            with open('/proc/%s/comm' % entry, encoding='utf-8', errors='replace') as handle:
                comm = handle.read().strip()
        except OSError:
            continue
        if needle in environ or needle in cmdline:
            found.append(entry if pids else comm)
    return found


def speaks_v3(control: List[str], env: Dict[str, str]) -> bool:
    """``-p 3 -h`` lists the modules server and namespace (NVIDIA's own check, shared/mps-v3-reference.md 1.1)."""
    proc = subprocess.run(control + ['-p', '3', '-h'], env=env, capture_output=True, text=True, timeout=30, check=False)
    words = {line.split()[0] for line in proc.stdout.splitlines() if line.split()}
    return {'server', 'namespace'} <= words


def simulator(base: str, gpu: Dict[str, str], driver: str, cuda: str) -> tuple:
    """(control, client, env) of the simulator given this GPU and versions."""
    ini = os.path.join(base, 'nvml.ini')
    compare_mps.write_ini(ini, [gpu], driver, cuda)
    env = dict(os.environ, FAKE_NVML_CONFIG=ini, PYTHONDONTWRITEBYTECODE='1')
    return ([sys.executable, os.path.join(SIM_DIR, 'mps_sim.py')], [sys.executable, os.path.join(SIM_DIR, 'mps_client.py')], env)


def main(argv: List[str]) -> int:  # pylint: disable=too-many-locals
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--json', help='write the answers here')
    parser.add_argument('--keep', action='store_true', help='keep the temporary directories')
    parser.add_argument('--simulated', action='store_true', help='the simulator alone, as an r615 binary (no GPU needed)')
    parser.add_argument('--deadline', type=int, default=200, help='seconds each side may run (default 200)')
    args = parser.parse_args(argv[1:])
    top = tempfile.mkdtemp(prefix='mps-v3q.')
    os.chmod(top, 0o755)  # a uid 65534 client must reach the pipe directories
    sides: Dict[str, List[dict]] = {}
    try:
        if args.simulated:
            gpu = {'index': '0', 'uuid': 'GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b', 'name': 'NVIDIA H200', 'memory': '143771', 'cc': '9.0'}
            driver, cuda = '615.71.09', '13040'
        else:
            real, _seen = compare_mps.find_real(compare_mps.NAME)
            smi, _others = compare_mps.find_real('nvidia-smi')
            if real is None or smi is None:
                print('SKIP: no real nvidia-cuda-mps-control or nvidia-smi on this host')
                return 0
            gpu = compare_mps.query_gpus(smi)[0]
            driver, cuda = compare_mps.driver_version(smi), compare_mps.cuda_version(smi)
            env = {k: v for k, v in os.environ.items() if not k.startswith('CUDA_MPS_')}
            if not speaks_v3([real], env):
                print('SKIP: %s (driver %s) has no MPS protocol 3: -p 3 -h lists no namespace' % (real, driver))
                return 0
            base = os.path.join(top, 'real')
            os.makedirs(base)
            sides['real'] = Side(base, [real], [sys.executable, os.path.join(HERE, 'cuda_client.py')], env,
                                 gpu['uuid']).play(time.monotonic() + args.deadline)
        base = os.path.join(top, 'sim')
        os.makedirs(base)
        control, client, env = simulator(top, gpu, driver, cuda)
        sides['simulator'] = Side(base, control, client, env, gpu['uuid']).play(time.monotonic() + args.deadline)
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    report = {'gpu': gpu.get('name'), 'driver': driver, 'cuda': cuda, 'sides': sides}
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as handle:
            json.dump(report, handle, indent=1, sort_keys=True)
    different = 0
    if 'real' in sides:
        sim = {item['id']: item for item in sides['simulator']}
        for item in sides['real']:
            other = sim.get(item['id'])
            same = other == item
            different += not same
            print('%-28s %s' % (item['id'], 'same' if same else 'DIFFERS'))
            if not same:
                print('  real:      %s\n  simulator: %s' % (json.dumps(item, sort_keys=True)[:600], json.dumps(other, sort_keys=True)[:600]))
    else:
        for item in sides['simulator']:
            print('%-28s %s' % (item['id'], json.dumps({k: v for k, v in item.items() if k != 'id'}, sort_keys=True)[:200]))
    played = [item['id'] for item in next(iter(sides.values()))]
    print('SUMMARY: %d questions, %d played per side, %d differ between the real binary and the simulator%s' % (
        len(QUESTIONS), len(played), different, '' if 'real' in sides else ' (simulator only)'))
    return 1 if 'deadline' in played else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
