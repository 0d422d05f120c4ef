# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Upgrade in place: a host provisioned by the previous tree, daemons running and a client connected, is taken over by
this tree with no daemon restarted, no client ended, and nothing changed - then torn down by it.

usage: test-upgrade.py WORK SIMHOST_LIB PYTHON [REV]

The previous tree is REV of this repository's history (git archive), the new one this checkout's files
(hacking/collection-tree.sh); each runs mps_host as Ansible would, one interpreter per run (the module file run with
its arguments file). Everything lives under WORK, on a simulated host of its own; every process it started is ended.
A clone without REV in its history (a shallow clone) cannot run it: the script says so and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The last main before mps_host planned once and executed its plan (issue 26): what hosts run today.
PREVIOUS = 'd53cece'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = 'ansible_collections/gpufleet/mps/plugins/modules/mps_host.py'


def sh(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def tree(work: str, rev: str) -> str:
    """The collection at ``rev`` (None: this checkout) under ``work``, as a path for PYTHONPATH."""
    if rev is None:
        sh(os.path.join(REPO, 'hacking', 'collection-tree.sh'), work, cwd=REPO)
        return work
    dest = os.path.join(work, 'ansible_collections', 'gpufleet', 'mps')
    os.makedirs(dest)
    archive = subprocess.run(['git', 'archive', rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', dest], input=archive, check=True)
    return work


class Host:
    def __init__(self, base: str, lib: str, python: str) -> None:
        self.base = base
        self.python = python
        sh(os.path.join(REPO, 'tests', 'fakes', 'make-simhost.sh'), os.path.join(base, 'host'), lib, python)
        self.env = dict(os.environ, FAKE_NVML_CONFIG=os.path.join(base, 'host', 'nvml.ini'),
                        LD_LIBRARY_PATH=os.path.join(base, 'host', 'lib'),
                        PATH=os.path.join(base, 'host', 'bin') + os.pathsep + os.environ['PATH'])
        self.args = {
            'root': os.path.join(base, 'root'), 'config_dir': os.path.join(base, 'etc'), 'supervisor': 'none',
            'control_binary': os.path.join(base, 'host', 'bin', 'nvidia-cuda-mps-control'),
            'local_facts_dir': os.path.join(base, 'facts.d'), 'logrotate_dir': os.path.join(base, 'logrotate.d'),
            'resources': [{'name': 'train', 'devices': [0, 1], 'replicas': 4},
                          {'name': 'infer', 'devices': [2], 'active_thread_percentage': 50, 'pinned_device_mem_limit': '10G'}],
        }
        self.clients: list = []

    def run(self, code: str, **over) -> dict:
        """mps_host from the tree at ``code``, in an interpreter of its own, as Ansible runs a module."""
        with tempfile.NamedTemporaryFile('w', suffix='.json', dir=self.base, delete=False) as handle:
            json.dump({'ANSIBLE_MODULE_ARGS': dict(self.args, **over)}, handle)
        proc = subprocess.run([self.python, os.path.join(code, MODULE), handle.name], env=dict(self.env, PYTHONPATH=code),
                              capture_output=True, text=True, check=False)
        os.unlink(handle.name)
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            raise SystemExit('upgrade: mps_host from %s printed no result: %s %s' % (code, proc.stdout, proc.stderr))
        if result.get('failed'):
            raise SystemExit('upgrade: mps_host from %s failed: %s' % (code, result.get('msg')))
        return result

    def client(self, name: str) -> subprocess.Popen:
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=os.path.join(self.base, 'root', name, 'pipe'))
        proc = subprocess.Popen([os.path.join(self.base, 'host', 'bin', 'mps-sim-client')], env=env,  # pylint: disable=consider-using-with
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.clients.append(proc)
        reply = json.loads(proc.stdout.readline())
        assert reply['ok'], reply
        return proc

    def pids(self) -> dict:
        found = {}
        for name in ('train', 'infer'):
            try:
                with open(os.path.join(self.base, 'root', name, 'pipe', 'nvidia-cuda-mps-control.pid'), encoding='ascii') as handle:
                    found[name] = int(handle.read())
            except (OSError, ValueError):
                found[name] = None
        return found

    def close(self) -> None:
        for proc in self.clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for pid in self.pids().values():
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def check(condition: bool, what: str, detail: object = '') -> None:
    if not condition:
        raise SystemExit('upgrade: FAILED - %s %s' % (what, detail))
    print('upgrade: ok - %s' % what)


def main() -> None:
    work, lib, python = sys.argv[1:4]
    rev = sys.argv[4] if len(sys.argv) > 4 else PREVIOUS
    if subprocess.run(['git', 'cat-file', '-e', rev + '^{commit}'], cwd=REPO, capture_output=True, check=False).returncode:
        print('upgrade: SKIPPED - %s is not in this clone\'s history (a shallow clone?): nothing to upgrade from' % rev)
        return
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Pipe directories are limited to 87 bytes: the simulated host lives in a short directory of its own.
    base = tempfile.mkdtemp(prefix='mps.up.', dir='/tmp')
    os.chmod(base, 0o755)
    old = tree(os.path.join(work, 'old'), rev)
    new = tree(os.path.join(work, 'new'), None)
    host = Host(base, lib, python)
    try:
        first = host.run(old)
        check(first['changed'] and first['ready'], 'the previous tree (%s) provisioned the host' % rev)
        client = host.client('train')
        before = host.pids()
        facts = open(os.path.join(base, 'facts.d', 'gpufleet_mps.fact'), encoding='utf-8').read()
        taken = host.run(new)
        # The one change a takeover may make: since issue 28 the local facts name the pinned limits of a resource's own
        # GPUs only (a replica count's record holds every GPU of the host, which the previous facts listed), and since
        # issue 29 each resource's client_priority (null: not managed).
        own_facts = json.loads(facts)
        for resource in own_facts['resources']:
            resource.setdefault('client_priority', None)
            uuids = {device['uuid'] for device in resource['devices']}
            resource['pinned_device_mem_limit_mib'] = {key: value for key, value in resource['pinned_device_mem_limit_mib'].items()
                                                       if key in uuids or key == '*'}
        # And since issue 40 a resource's persisted record holds only its own GPUs: the previous tree's record of a replica
        # count, which held every GPU of the host, is written anew - a file, nothing sent to a daemon, nothing restarted.
        record = os.path.join(base, 'etc', 'train.limits.json')
        narrowed = ['write %s' % record]
        other = [change for change in taken['changes'] if 'gpufleet_mps.fact' not in json.dumps(change) and change['action'] not in narrowed]
        check(other == [] and taken['ready'], 'this tree takes the host over, ready, changing nothing but the local facts and '
              'the record of a replica count', other)
        with open(record, encoding='utf-8') as handle:
            own = {device['uuid'] for device in json.loads(facts)['resources'][0]['devices']}
            check(set(json.load(handle)['pinned_device_mem_limit_mib']) == own, 'the record holds the GPUs of train alone')
        check(host.pids() == before, 'no daemon restarted', (before, host.pids()))
        check(client.poll() is None, 'the connected client still runs')
        with open(os.path.join(base, 'facts.d', 'gpufleet_mps.fact'), encoding='utf-8') as handle:
            check(json.load(handle) == own_facts, 'the local facts kept, but for the pinned limits of other GPUs and the client priority')
        again = host.run(new)
        check(not again['changed'] and again['changes'] == [] and again['ready'], 'a second run changes nothing', again.get('actions'))
        check(not host.run(new, _ansible_check_mode=True)['changed'], 'check mode agrees')
        client.stdin.close()
        client.wait(10)
        gone = host.run(new, state='absent', remove_logs=True)
        check(gone['changed'] and all(pid is None for pid in host.pids().values()), 'this tree tears the host down')
    finally:
        host.close()
        time.sleep(0.2)
        shutil.rmtree(base, ignore_errors=True)
    print('upgrade: passed (from %s)' % rev)


if __name__ == '__main__':
    main()
