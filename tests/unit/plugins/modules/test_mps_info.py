# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.modules import mps_daemon, mps_info


def run_module(module, args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize('args, message', [
    ({'name': '../../etc'}, 'name: '),
    ({'root': 'relative'}, 'root: '),
    ({'config_dir': 'etc'}, 'config_dir: '),
    ({'timeout': 0}, 'timeout: '),
    ({'gather': []}, 'gather: '),
    ({'control_binary': '/nonexistent/bin'}, 'control_binary: '),
])
def test_bad_input_fails_naming_the_parameter(args, message, capsys, tmp_path):
    args.setdefault('root', str(tmp_path / 'root'))
    result = run_module(mps_info, args, capsys)
    assert result['failed'] and result['msg'].startswith(message), result


def test_an_unknown_gather_choice_is_refused_by_the_argument_spec(capsys, tmp_path):
    result = run_module(mps_info, {'root': str(tmp_path), 'gather': ['gpus', 'clients']}, capsys)
    assert result['failed'] and 'gather' in result['msg']


@pytest.fixture
def common(simhost):
    os.chmod(simhost, 0o755)
    return {
        'root': str(simhost / 'root'),
        'config_dir': str(simhost / 'etc'),
        'control_binary': str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control'),
    }


def test_a_host_without_daemons(common, capsys):
    result = run_module(mps_info, common, capsys)
    assert not result['changed'] and not result.get('failed')
    assert result['daemons'] == [] and 'warnings' not in result
    assert result['nvml']['available'] and [gpu['index'] for gpu in result['gpus']] == [0, 1, 2, 3]
    assert result['control_binary'] == common['control_binary']


def test_a_daemon_started_by_mps_daemon_in_check_mode(common, capsys):
    started = run_module(mps_daemon, dict(common, name='train', devices=[1, 0], supervisor='none', stop_timeout=5), capsys)
    result = run_module(mps_info, dict(common, _ansible_check_mode=True), capsys)
    assert not result['changed']
    (daemon,) = result['daemons']
    assert daemon['name'] == 'train' and daemon['pid'] == started['pid'] and daemon['healthy']
    assert daemon['supervisor'] == 'none' and daemon['started_at'] == started['started_at'] and daemon['multiuser'] is False
    assert [(d['ordinal'], d['index']) for d in daemon['devices']] == [(0, 1), (1, 0)]
    assert daemon['env'] == started['env'] and daemon['servers'] == []
    assert 'warnings' not in result  # mps_daemon set EXCLUSIVE_PROCESS: nothing to warn about


@pytest.mark.parametrize('breakage', ['no nvidia-ml-py', 'no driver'])
def test_a_host_without_nvml_does_not_fail(common, capsys, monkeypatch, breakage):
    if breakage == 'no nvidia-ml-py':
        monkeypatch.setattr(_gpus, 'pynvml', None)
    else:
        monkeypatch.delenv('FAKE_NVML_CONFIG')
    result = run_module(mps_info, common, capsys)
    assert not result.get('failed'), result
    assert result['nvml'] == {'available': False, 'error': result['nvml']['error'], 'driver_version': None,
                              'cuda_driver_version': None, 'python_binding': breakage == 'no driver',
                              'driver_upgrade_pending': False}
    assert result['nvml']['error'] and result['gpus'] == [] and result['daemons'] == []


def test_gather_gpus_only(common, capsys):
    result = run_module(mps_info, dict(common, gather=['gpus']), capsys)
    assert 'daemons' in mps_info.RETURN and 'daemons' not in result and len(result['gpus']) == 4
