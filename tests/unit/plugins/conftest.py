# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real nvidia-ml-py on the fake libnvidia-ml.so.1 (tests/fakes/nvml), one GPU set per test."""
from __future__ import annotations

import ctypes
import json
import os
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
