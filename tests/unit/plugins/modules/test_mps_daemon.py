# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import subprocess

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.module_utils._daemon import manager as _resource
from ansible_collections.gpufleet.mps.plugins.modules import mps_daemon


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            mps_daemon.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize('args, message', [
    ({'name': '../../etc'}, 'name: '),
    ({'name': 'a', 'root': 'relative'}, 'root: '),
    ({'name': 'a', 'start_timeout': 0}, 'start_timeout: '),
    ({'name': 'a', 'stop_timeout': -1}, 'stop_timeout: '),
    ({'name': 'a', 'devices': 'some'}, 'devices: '),
    ({'name': 'a', 'control_binary': '/nonexistent/bin'}, 'control_binary: '),
    ({'name': 'a', 'config_dir': 'etc'}, 'config_dir: '),
])
def test_bad_input_fails_naming_the_parameter(args, message, capsys, tmp_path):
    args.setdefault('root', str(tmp_path / 'root'))
    result = run_module(args, capsys)
    assert result['failed']
    assert result['msg'].startswith(message)
    assert not (tmp_path / 'root').exists()


def test_start_noop_and_stop_through_main(simhost, capsys):
    common = {
        'name': 'nvidia.com/gpu',
        'root': str(simhost / 'root'),
        'config_dir': str(simhost / 'etc'),
        'control_binary': str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control'),
        'supervisor': 'none',
        'devices': [1, 0],
        'stop_timeout': 5,
    }
    started = run_module(dict(common, _ansible_diff=True), capsys)
    assert started['changed'] and started['pid'] > 0, started
    assert [d['index'] for d in started['devices']] == [1, 0]
    assert started['diff']['before']['state'] == 'stopped'

    noop = run_module(common, capsys)
    assert not noop['changed'] and noop['pid'] == started['pid'] and noop['actions'] == []

    stopped = run_module(dict(common, state='stopped'), capsys)
    assert stopped['changed'] and stopped['pid'] is None
    assert not (simhost / 'root' / 'nvidia.com' / 'gpu' / '.started').exists()


def test_a_concurrent_run_that_changed_the_compute_mode_is_seen_under_the_lock(simhost, capsys, monkeypatch):
    # Run A reads the GPUs, then run B (simulated here) sets EXCLUSIVE_PROCESS and starts the daemon while A
    # waits for the resource lock. A must judge by what NVML says under the lock: nothing left to change.
    common = {
        'name': 'race',
        'root': str(simhost / 'root'),
        'config_dir': str(simhost / 'etc'),
        'control_binary': str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control'),
        'supervisor': 'none',
        'devices': [0],
        'stop_timeout': 5,
    }
    started = run_module(common, capsys)
    assert started['changed']
    subprocess.run([str(simhost / 'host' / 'bin' / 'nvidia-smi'), '-i', '0', '-c', 'DEFAULT'], check=True, capture_output=True)
    original = _resource.resource_lock

    def other_run_while_waiting(paths):
        with _gpus.Nvml() as nvml:
            assert nvml.gpus()[0].compute_mode == 'default'  # what A could have read before the lock
        subprocess.run([str(simhost / 'host' / 'bin' / 'nvidia-smi'), '-i', '0', '-c', 'EXCLUSIVE_PROCESS'], check=True,
                       capture_output=True)
        return original(paths)

    monkeypatch.setattr(_resource, 'resource_lock', other_run_while_waiting)
    again = run_module(common, capsys)
    assert not again['changed'], again['actions']
