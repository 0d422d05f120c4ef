# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real nvidia-ml-py on the fake libnvidia-ml.so.1 (tests/fakes/nvml), one GPU set per test."""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import tempfile
import shutil
import sys
from pathlib import Path

import pytest

FAKE_NVML_DIR = Path(__file__).resolve().parents[2] / 'fakes' / 'nvml'
sys.path.insert(0, str(FAKE_NVML_DIR))

from build import fake_nvml_lib  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture
def tmp_path():
    """A short temporary directory: pytest's own path, named after the test, can make a pipe directory longer
    than the 87 bytes the modules accept (the real daemon fails silently beyond that)."""
    path = Path(tempfile.mkdtemp(prefix='u.', dir='/tmp'))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='session')
def nvml_lib(tmp_path_factory):
    import pynvml  # pylint: disable=import-outside-toplevel

    path = fake_nvml_lib(tmp_path_factory.mktemp('fake-nvml'))
    pynvml.nvmlLib = ctypes.CDLL(str(path))
    return path


@pytest.fixture
def gpu_host(nvml_lib, tmp_path, monkeypatch):
    """Return a function that points NVML at a copy of a shipped GPU set and returns the copy's path."""

    def use(config='h100x4.ini'):
        target = tmp_path / config
        shutil.copy(FAKE_NVML_DIR / 'configs' / config, target)
        monkeypatch.setenv('FAKE_NVML_CONFIG', str(target))
        return target

    return use


@pytest.fixture
def simhost(nvml_lib, gpu_host, monkeypatch):
    """A whole simulated host (tests/fakes/make-simhost.sh) in a short temporary directory."""
    config = gpu_host()
    base = Path(tempfile.mkdtemp(prefix='mps.', dir='/tmp'))
    host = base / 'host'
    subprocess.run([str(FAKE_NVML_DIR.parent / 'make-simhost.sh'), str(host), str(nvml_lib.parent), sys.executable, str(config)],
                   check=True, capture_output=True)
    monkeypatch.setenv('FAKE_NVML_CONFIG', str(host / 'nvml.ini'))
    monkeypatch.setenv('LD_LIBRARY_PATH', str(host / 'lib'))
    yield base
    # Nested resource names (nvidia.com/gpu) have their pipe directory one level deeper.
    for pidfile in list(base.glob('root/*/pipe/nvidia-cuda-mps-control.pid')) + list(base.glob('root/*/*/pipe/nvidia-cuda-mps-control.pid')):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def r615(simhost):
    """A function that makes the simulated host's driver r615 (CUDA 13.4, binary version 13040): from there the simulated
    control binary speaks MPS v3 (tests/fakes/mps/mps_v3.py). Called after any other change of the GPU set."""
    del simhost  # the host whose FAKE_NVML_CONFIG it changes

    def make():
        path = os.environ['FAKE_NVML_CONFIG']
        with open(path, encoding='utf-8') as handle:
            text = handle.read()
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(re.sub(r'(?m)^cuda_driver_version = .*$', 'cuda_driver_version = 13040',
                                re.sub(r'(?m)^driver_version = .*$', 'driver_version = 615.71.09', text)))
    return make


@pytest.fixture
def sim_clients(simhost):
    """Start CUDA client stand-ins (mps-sim-client) on a pipe directory of the simulated host; each is ended after the test.

    ``start(pipe_dir)`` returns the running client and the JSON line it printed once connected.
    """
    started = []

    def start(pipe_dir):
        proc = subprocess.Popen([str(simhost / 'host' / 'bin' / 'mps-sim-client')],  # pylint: disable=consider-using-with
                                env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        reply = json.loads(proc.stdout.readline())
        assert reply['ok'], reply
        return proc, reply

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(10)


@pytest.fixture
def see():
    """``see(manager, state)`` gives a resource's manager the view of the host a run would read now, built by hand: the
    paths its decisions look at read from the disk, its daemon in ``state`` (not running when None) with the /dev/shm,
    clients and unit state given; sealed. A decision under test then reads that view and nothing else."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import read_paths
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.reader import read_labels, resource_wants
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView, ResourceView, parse_record
    from ansible_collections.gpufleet.mps.plugins.module_utils._proc import read_mountinfo
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import Liveness

    def build(manager, state=None, dev_shm=None, clients=(), unit=(True, True), gpus=(), daemons=((), ()), offered=None,
              shm_namespace=''):
        run = manager.run
        wants = resource_wants(manager.paths, run.config).merge(manager.wants(shm=True, state='absent'))
        view = HostView(list(gpus))
        view.mountinfo = read_mountinfo()
        view.realpaths[manager.paths.shm_dir] = os.path.join(os.path.realpath(manager.paths.root), 'shm')
        view.paths = read_paths(wants.files, wants.dirs, wants.others, mountinfo=view.mountinfo)
        state = state or Liveness(False, None, None)
        record, corrupt = parse_record(view.text(manager.paths.started_file))
        view.resources[manager.paths.name] = ResourceView(manager.paths, state, None, record, corrupt)
        view.daemons = (list(daemons[0]), list(daemons[1]))
        if state.pid:
            view.dev_shm[state.pid] = dev_shm
            view.clients[manager.paths.name] = (state.pid, list(clients))
        view.units[run.unit] = unit
        view.offered.update(offered or {})
        view.shm_namespace = shm_namespace
        if run.selinux_type:
            read_labels(view, [manager.paths.pipe_dir])
        run.host.view = view.seal()
        return view
    return build


class IOWhileDeciding(BaseException):
    """A decision opened, listed, stat-ed, started or connected to something (a BaseException: nothing may catch it)."""


# What a decision may not call: it reads the run's view of the host and nothing else.
_NO_IO = (('builtins', 'open'), ('os', 'open'), ('os', 'stat'), ('os', 'lstat'), ('os', 'scandir'), ('os', 'listdir'),
          ('os', 'readlink'), ('os', 'access'), ('subprocess', 'Popen'), ('socket', 'socket'))


@pytest.fixture
def decide_guard(monkeypatch):
    """While any decision runs - HostManager.decide, and the per-resource modules' plan stages - open, os.open, stat, lstat,
    scandir, listdir, readlink, access, subprocess and socket raise IOWhileDeciding. Yields the number of decisions made.
    Every module of the collection is imported first: an import during a decision would read files too."""
    # pylint: disable=import-outside-toplevel
    import builtins
    import importlib
    import pkgutil
    import socket
    import subprocess
    from ansible_collections.gpufleet.mps.plugins import module_utils
    for info in pkgutil.walk_packages(module_utils.__path__, module_utils.__name__ + '.'):
        importlib.import_module(info.name)
    from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonManager
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.manager import HostManager
    from ansible_collections.gpufleet.mps.plugins.module_utils._limits.manager import LimitsManager
    from ansible_collections.gpufleet.mps.plugins.module_utils._shm import ShmManager
    modules = {'builtins': builtins, 'os': os, 'subprocess': subprocess, 'socket': socket}
    real = {(module, name): getattr(modules[module], name) for module, name in _NO_IO}
    state = {'depth': 0, 'decisions': 0}

    def guarded(module, name):
        def call(*args, **kwargs):
            if state['depth']:
                raise IOWhileDeciding('%s.%s%r while deciding' % (module, name, args[:2]))
            return real[(module, name)](*args, **kwargs)
        return call
    for module, name in _NO_IO:
        monkeypatch.setattr(modules[module], name, guarded(module, name))

    def deciding(cls, method):
        original = getattr(cls, method)

        def decide(self, *args, **kwargs):
            state['depth'] += 1
            state['decisions'] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                state['depth'] -= 1
        monkeypatch.setattr(cls, method, decide)
    for cls, method in ((HostManager, 'decide'), (DaemonManager, 'plan'), (LimitsManager, '_plan'), (ShmManager, 'plan')):
        deciding(cls, method)
    yield state


@pytest.fixture
def fake_systemd(simhost, monkeypatch):
    """``systemctl`` on PATH is tests/fakes/systemctl.py, which runs the collection's units from ``<simhost>/units``: the
    modules run with supervisor=systemd as under systemd (the real one: the molecule scenario under systemd-nspawn)."""
    sbin = simhost / 'sbin'
    sbin.mkdir(exist_ok=True)
    (sbin / 'systemctl').write_text('#!/bin/sh\nexec %s %s "$@"\n' % (sys.executable, FAKE_NVML_DIR.parent / 'systemctl.py'))
    (sbin / 'systemctl').chmod(0o755)
    monkeypatch.setenv('FAKE_SYSTEMD_DIR', str(simhost / 'systemd'))
    monkeypatch.setenv('FAKE_SYSTEMD_UNIT_DIR', str(simhost / 'units'))
    monkeypatch.setenv('PATH', '%s:%s:%s' % (sbin, simhost / 'host' / 'bin', os.environ.get('PATH', '/usr/bin:/bin')))
    yield simhost / 'systemd'
