# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A running daemon of a resource that speaks MPS protocol 3 where the collection would drive it with the legacy words
(issue 43): reported and refused, never asked with the wrong protocol, nothing changed (shared/mps-v3-reference.md 1.1)."""
from __future__ import annotations

import os
import re
import sys
import subprocess

import pytest


def _start_by_hand(host, name, *args, env=None):
    """A daemon started in the resource's pipe directory by hand, as an operator (or another tool) would."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith('CUDA_MPS_')}
    with open(os.environ['FAKE_NVML_CONFIG'], encoding='utf-8') as handle:
        first_gpu = re.search(r'(?m)^uuid = (\S+)$', handle.read()).group(1)
    # on this host's GPU 0 only: a daemon without CUDA_VISIBLE_DEVICES serves every GPU, other tests' hosts' too
    environ.update(CUDA_MPS_PIPE_DIRECTORY=host.pipe(name), CUDA_MPS_LOG_DIRECTORY=os.path.join(host.root, name, 'log'),
                   CUDA_VISIBLE_DEVICES=first_gpu, **(env or {}))
    proc = subprocess.run([host.binary, '-d', *args], env=environ, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(host.pipe(name), 'nvidia-cuda-mps-control.pid'), encoding='utf-8') as handle:
        return int(handle.read())


def _v3_in_place_of_train(host, r615, *args, env=None):
    """train provisioned (legacy) and torn down, then a v3 daemon started by hand in its pipe directory: its pid."""
    r615()
    host.ok([{'name': 'train', 'devices': [0]}])
    first = list(host.daemons())
    host.ok([], state='absent')  # the legacy daemon gone, its directories with it; made again by hand below
    assert not host.daemons() and first
    os.makedirs(host.pipe('train'), exist_ok=True)
    os.makedirs(os.path.join(host.root, 'train', 'log'), exist_ok=True)
    return _start_by_hand(host, 'train', *args, env=env)


@pytest.mark.parametrize('how', [('-p', '3'), ('--protocol', '3'), ('env',)])
def test_a_v3_daemon_of_a_legacy_resource_is_refused_and_left_as_it_is(host, warnings, r615, how):
    env = {'CUDA_MPS_PROTOCOL_VERSION': '3'} if how == ('env',) else None
    pid = _v3_in_place_of_train(host, r615, *(() if how == ('env',) else how), env=env)
    for check in (True, False):
        result = host.run([{'name': 'train', 'devices': [0]}], check=check)
        assert result.get('failed') and not result.get('changed'), result
        assert 'started with MPS protocol 3' in result['msg'] and 'pid %d' % pid in result['msg'], result['msg']
    assert list(host.daemons()) == [pid]  # still running, untouched
    info = host.module('mps_info', gather=['daemons'])
    daemon = [d for d in info['daemons'] if d['name'] == 'train'][0]
    assert daemon['protocol'] == 3 and daemon['running'] and 'protocol 3' in daemon['error']
    assert any('protocol 3' in text for text in warnings(info))
    stopped = host.module('mps_daemon', name='train', state='absent')
    assert stopped.get('failed') and 'protocol 3' in stopped['msg'] and list(host.daemons()) == [pid]


def test_a_legacy_daemon_reports_protocol_2(host):
    host.ok([{'name': 'train', 'devices': [0]}])
    info = host.module('mps_info', gather=['daemons'])
    assert [d['protocol'] for d in info['daemons']] == [2] and not info['daemons'][0]['error']


def test_mps_limits_refuses_too(host, r615):
    pid = _v3_in_place_of_train(host, r615, '-p', '3')
    result = host.module('mps_limits', name='train', active_thread_percentage=50)
    assert result.get('failed') and 'started with MPS protocol 3' in result['msg'] and not result.get('changed'), result
    assert list(host.daemons()) == [pid]


def test_mps_info_reports_the_protocol_without_a_control_binary(host, monkeypatch, r615):
    _v3_in_place_of_train(host, r615, '--protocol', '3')
    monkeypatch.setenv('PATH', '/usr/bin:/bin')  # no nvidia-cuda-mps-control to be found: the daemon cannot be asked
    info = host.result(host.start_module('mps_info', {'root': host.root, 'config_dir': host.etc, 'gather': ['daemons']}))
    (daemon,) = [d for d in info['daemons'] if d['name'] == 'train']
    assert daemon['protocol'] == 3 and 'not found on PATH' in daemon['error'], daemon


@pytest.mark.parametrize('argv, env, expected', [
    (['-d'], {}, 2),
    (['-d', '-p', '3'], {}, 3),
    (['-d', '-p3'], {}, 3),
    (['-d', '--protocol', '3'], {}, 3),
    (['-d', '--protocol=3'], {}, 3),
    (['-d', '-p', '2'], {}, 2),
    (['-d', '-p', '3'], {'CUDA_MPS_PROTOCOL_VERSION': '2'}, 2),  # the variable wins over the option
    (['-d', '-p', '2'], {'CUDA_MPS_PROTOCOL_VERSION': '3'}, 3),
])
def test_started_protocol_reads_arguments_and_environment(argv, env, expected):
    from ansible_collections.gpufleet.mps.plugins.module_utils._proc import started_protocol  # pylint: disable=import-outside-toplevel
    environ = {key: value for key, value in os.environ.items() if not key.startswith('CUDA_MPS_')}
    environ.update(env)
    code = 'import sys; print(1, flush=True); sys.stdin.read()'
    proc = subprocess.Popen([sys.executable, '-c', code, *argv], env=environ,  # pylint: disable=consider-using-with
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b'1\n', proc.stderr.read()  # running, its arguments and environment in place
        assert started_protocol(proc.pid) == expected
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_started_protocol_of_a_process_that_is_gone_is_unknown():
    from ansible_collections.gpufleet.mps.plugins.module_utils._proc import started_protocol  # pylint: disable=import-outside-toplevel
    proc = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True, check=True)
    assert started_protocol(int(proc.stdout)) is None
