# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module tests: each in-process run starts as a real one does, and ``host`` runs modules the way Ansible does.

Each in-process module run starts without the warnings and deprecations an earlier run left in ansible-core's
module-wide lists (an mps_daemon test's warning showed up in a later mps_info result when both ran in one pytest
worker).

``host`` is one simulated host on which a module runs in a process of its own - its arguments in a file, a JSON result
out - as AnsiballZ runs it. The tests that use it look only at that result, the files and the processes, and import
nothing of the collection, so they also run against an older version of the modules (a test named by a fixed fault
must fail on the commit before the fix).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import pynvml

from ansible.module_utils.common import warnings as _warnings

MODULES = 'ansible_collections.gpufleet.mps.plugins.modules.'


@pytest.fixture(autouse=True)
def fresh_module_warnings():
    # pylint: disable=protected-access
    _warnings._global_warnings.clear()
    _warnings._global_deprecations.clear()
    yield
    _warnings._global_warnings.clear()
    _warnings._global_deprecations.clear()


class Host:
    """One simulated host, and the collection's modules run on it as Ansible runs a module."""

    def __init__(self, base):
        self.base = base
        self.root = str(base / 'root')
        self.etc = str(base / 'etc')
        self.facts = str(base / 'facts.d')
        self.bin = str(base / 'host' / 'bin')
        self.binary = os.path.join(self.bin, 'nvidia-cuda-mps-control')
        self.args = dict(root=self.root, config_dir=self.etc, control_binary=self.binary, supervisor='none',
                         local_facts_dir=self.facts, logrotate_dir=str(base / 'logrotate.d'), start_timeout=10, stop_timeout=5)
        self.clients = []
        self.runs = 0

    def start_module(self, module, args, check=False, diff=False):
        """A module's process, started: its arguments in a file, as AnsiballZ passes them."""
        self.runs += 1
        path = self.base / ('args-%d.json' % self.runs)
        path.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_diff=diff)}))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        # In the host's own directory, as Ansible runs a module in its temporary directory: a relative path a module
        # wrongly accepted lands there, never in the checkout.
        return subprocess.Popen([sys.executable, '-m', MODULES + module, str(path)], env=env, cwd=str(self.base),  # pylint: disable=consider-using-with
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def start(self, resources, check=False, diff=False, **options):
        """mps_host's process, started."""
        return self.start_module('mps_host', dict(self.args, resources=resources, **options), check, diff)

    @staticmethod
    def result(proc):
        out, err = proc.communicate(timeout=120)
        assert out.strip(), 'no result (exit %s): %s' % (proc.returncode, err[-2000:])
        return json.loads(out.strip().splitlines()[-1])

    def run(self, resources, check=False, diff=False, **options):
        return self.result(self.start(resources, check, diff, **options))

    def ok(self, resources, **options):
        result = self.run(resources, **options)
        assert not result.get('failed'), result.get('msg')
        return result

    def module(self, module, check=False, diff=False, **args):
        """A run of ``module`` (mps_daemon, mps_limits, mps_shm, mps_info) with the host's root, config_dir and binary."""
        common = {key: self.args[key] for key in (('root',) if module == 'mps_shm' else ('root', 'config_dir', 'control_binary'))}
        if module == 'mps_daemon':
            common.update(supervisor='none', start_timeout=10, stop_timeout=5)
        return self.result(self.start_module(module, dict(common, **args), check, diff))

    @property
    def ready(self):
        return os.path.exists(os.path.join(self.root, '.ready'))

    def pipe(self, name):
        return os.path.join(self.root, name, 'pipe')

    def daemons(self):
        """The simulated control daemons of this root, by the pipe directory in their environment."""
        found = {}
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                with open('/proc/%s/environ' % entry, 'rb') as handle:
                    env = handle.read().split(b'\0')
                with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                    argv = handle.read().split(b'\0')
            except OSError:
                continue
            pipes = [item.split(b'=', 1)[1].decode() for item in env if item.startswith(b'CUDA_MPS_PIPE_DIRECTORY=')]
            if b'-d' in argv and pipes and pipes[0].startswith(self.root + '/'):
                found[int(entry)] = os.path.relpath(os.path.dirname(pipes[0]), self.root)
        return found

    def client(self, name):
        """A CUDA client stand-in connected to the resource's daemon (its server stays after the client leaves)."""
        proc = subprocess.Popen([os.path.join(self.bin, 'mps-sim-client')],  # pylint: disable=consider-using-with
                                env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe(name)),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.clients.append(proc)
        assert json.loads(proc.stdout.readline())['ok']
        return proc

    @staticmethod
    def leave(proc):
        proc.stdin.close()
        proc.wait(10)

    @staticmethod
    def compute_modes():
        pynvml.nvmlInit()
        try:
            return [pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(index))
                    for index in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()

    def close(self):
        for proc in self.clients:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(10)
        for pid in self.daemons():
            kill(pid)


def warnings_of(result):
    """The result's warnings as text (ansible-core 2.19 returns each as a structured summary)."""
    return [item['event']['msg'] if isinstance(item, dict) else item for item in result.get('warnings', [])]


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


@pytest.fixture
def host(simhost):
    """One simulated host, its modules run as Ansible runs them; every daemon and client it started is ended after."""
    os.chmod(simhost, 0o755)  # mkdtemp's 0700 would warn about every daemon
    made = Host(simhost)
    yield made
    made.close()


@pytest.fixture
def warnings():
    return warnings_of
