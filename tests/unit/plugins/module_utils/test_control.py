# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._protocol import commands as _commands, framing as _control
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import (
    ControlBinaryError,
    ControlCommandError,
    DaemonNotRunningError,
    DaemonTimeoutError,
    InvalidParameterError,
)


def fake_ui(tmp_path, stdout='', stderr='', rc=0, sleep=0):
    """A stand-in UI binary that records its stdin and environment and prints canned output."""
    script = tmp_path / 'ui'
    (tmp_path / 'out').write_text(stdout)
    (tmp_path / 'err').write_text(stderr)
    script.write_text(
        '#!/bin/sh\n'
        'cat > "%(d)s/stdin"\n'
        'env > "%(d)s/env"\n'
        'sleep %(sleep)s\n'
        'cat "%(d)s/out"\n'
        'cat "%(d)s/err" >&2\n'
        'exit %(rc)d\n' % dict(d=tmp_path, sleep=sleep, rc=rc))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize('args, expected', [
    (('get_server_list',), 'get_server_list'),
    (('set_default_device_pinned_mem_limit', 0, '3840M'), 'set_default_device_pinned_mem_limit 0 3840M'),
    (('set_default_active_thread_percentage', 25.0), 'set_default_active_thread_percentage 25.0'),
    (('get_default_device_pinned_mem_limit', 'GPU-0a1b2c3d-0000'), 'get_default_device_pinned_mem_limit GPU-0a1b2c3d-0000'),
])
def test_command_joins_plain_tokens(args, expected):
    assert _commands.command(*args) == expected


@pytest.mark.parametrize('bad', ['25\nquit', '1G quit', '', '-t', 'a;b', '$(id)', '1G\0', ' 1G'])
def test_command_refuses_tokens_that_could_smuggle_a_second_command(bad):
    with pytest.raises(InvalidParameterError):
        _commands.command('set_default_device_pinned_mem_limit', 0, bad)


def test_batch_sends_one_process_with_delimiters_and_splits_replies(tmp_path):
    # replies for: pct, mem 0 (lossy), sentinel, mem 1 (unset prints nothing), sentinel, server list
    ui = fake_ui(tmp_path, stdout='25.0\n3G\n25.0\n25.0\n101\n202\n')
    client = _control.ControlClient(ui, '/run/x/pipe', timeout=5)
    replies = client.batch([
        'get_default_active_thread_percentage',
        'get_default_device_pinned_mem_limit 0',
        'get_default_device_pinned_mem_limit 1',
        'get_server_list',
    ])
    assert client.processes == 1
    assert (tmp_path / 'stdin').read_text() == (
        'get_default_active_thread_percentage\n'
        'get_default_device_pinned_mem_limit 0\nget_default_active_thread_percentage\n'
        'get_default_device_pinned_mem_limit 1\nget_default_active_thread_percentage\n'
        'get_server_list')
    assert [r.lines for r in replies] == [('25.0',), ('3G',), (), ('101', '202')]
    assert _commands.parse_percentage(replies[0]) == 25.0
    assert _commands.parse_pids(replies[3]) == [101, 202]


@pytest.mark.parametrize('header', [
    'PID ID SERVER DEVICE NAMESPACE COMMAND',
    # The real r580 daemon pads its ps columns (gpu-evidence 2026-12-04/probe.txt).
    'PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        ',
])
def test_a_failed_server_query_ends_before_the_fence_header_however_it_is_padded(tmp_path, header):
    row = '41        0         7              GPU-0a1b2c3d-0000-1111    4026531836     python train.py'
    ui = fake_ui(tmp_path, stdout='Server with PID 31 not found\n%s\n%s\n100.0\n101\n' % (header, row))
    replies = _control.ControlClient(ui, '/run/x/pipe', timeout=5).batch(['get_active_thread_percentage 31', 'get_server_list'])
    assert [r.lines for r in replies] == [('Server with PID 31 not found',), ('101',)]


def test_batch_passes_the_pipe_dir_and_never_nvml_mps_device_enumeration(tmp_path):
    ui = fake_ui(tmp_path, stdout='100.0\n')
    client = _control.ControlClient(ui, '/run/x/pipe', timeout=5, log_dir='/run/x/log',
                                    base_env={'PATH': os.environ['PATH'], 'NVML_MPS_DEVICE_ENUMERATION': '1'})
    client.batch(['get_default_active_thread_percentage'])
    env = (tmp_path / 'env').read_text().splitlines()
    assert 'CUDA_MPS_PIPE_DIRECTORY=/run/x/pipe' in env
    assert 'CUDA_MPS_LOG_DIRECTORY=/run/x/log' in env
    assert not any(line.startswith('NVML_MPS_DEVICE_ENUMERATION=') for line in env)


# What a job script, a Slurm prolog or an operator's shell may have set: none of it may reach a control command.
CALLERS_MPS_ENV = {
    'CUDA_MPS_PROTOCOL_VERSION': '3',  # every invocation follows the running daemon's protocol (mps-v3-reference.md)
    'CUDA_MPS_PIPE_DIRECTORY': '/theirs/pipe',
    'CUDA_MPS_LOG_DIRECTORY': '/theirs/log',
    'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '10',
    'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=1G',
    'CUDA_MPS_CLIENT_PRIORITY': '1',
}


@pytest.mark.parametrize('log_dir', ['/run/x/log', None])
def test_a_callers_cuda_mps_variables_never_reach_the_control_ui(tmp_path, log_dir):
    ui = fake_ui(tmp_path, stdout='100.0\n')
    client = _control.ControlClient(ui, '/run/x/pipe', timeout=5, log_dir=log_dir,
                                    base_env=dict(CALLERS_MPS_ENV, PATH=os.environ['PATH'], LANG='C.UTF-8'))
    client.batch(['get_default_active_thread_percentage'])
    env = dict(line.split('=', 1) for line in (tmp_path / 'env').read_text().splitlines() if '=' in line)
    mps = {name: value for name, value in env.items() if name.startswith('CUDA_MPS_')}
    assert mps == dict({'CUDA_MPS_PIPE_DIRECTORY': '/run/x/pipe'}, **({'CUDA_MPS_LOG_DIRECTORY': log_dir} if log_dir else {}))
    assert env['LANG'] == 'C.UTF-8'  # the rest of the caller's environment is kept


def test_control_env_keeps_the_rest_and_sets_only_what_it_is_given():
    base = dict(CALLERS_MPS_ENV, PATH='/usr/bin', NVML_MPS_DEVICE_ENUMERATION='1', CUDA_VISIBLE_DEVICES='0')
    assert _control.control_env(base) == {'PATH': '/usr/bin', 'CUDA_VISIBLE_DEVICES': '0'}
    assert base['CUDA_MPS_PROTOCOL_VERSION'] == '3'  # the caller's mapping is not changed


@pytest.mark.parametrize('stream', ['stdout', 'stderr'])
def test_no_daemon_is_reported_whichever_stream_carries_the_message(tmp_path, stream):
    ui = fake_ui(tmp_path, rc=1, **{stream: 'Cannot find MPS control daemon process\n'})
    with pytest.raises(DaemonNotRunningError):
        _control.ControlClient(ui, '/p', timeout=5).batch(['get_server_list'])


def test_rejected_command_with_exit_0_is_an_error_not_a_value(tmp_path):
    ui = fake_ui(tmp_path, stdout='Invalid thread percentage\n')
    reply = _control.ControlClient(ui, '/p', timeout=5).batch(['set_default_active_thread_percentage 250'])[0]
    with pytest.raises(ControlCommandError, match='Invalid thread percentage'):
        _commands.parse_percentage(reply)


def test_silent_command_that_prints_is_rejected(tmp_path):
    ui = fake_ui(tmp_path, stdout='Invalid device\n25.0\n')
    replies = _control.ControlClient(ui, '/p', timeout=5).batch(
        ['set_default_device_pinned_mem_limit 9 1G', 'get_default_active_thread_percentage'])
    with pytest.raises(ControlCommandError, match='Invalid device'):
        _commands.expect_silent(replies[0])


def test_missing_delimiter_is_an_unparsable_reply(tmp_path):
    ui = fake_ui(tmp_path, stdout='garbage\n')
    with pytest.raises(ControlBinaryError, match='no delimiter'):
        _control.ControlClient(ui, '/p', timeout=5).batch(['get_server_list', 'get_server_list'])


def test_unexpected_exit_status_is_reported_with_output(tmp_path):
    ui = fake_ui(tmp_path, stdout='boom\n', rc=3)
    with pytest.raises(ControlBinaryError) as excinfo:
        _control.ControlClient(ui, '/p', timeout=5).batch(['get_server_list'])
    assert excinfo.value.details['rc'] == 3


def test_a_daemon_that_never_answers_times_out_naming_the_log(tmp_path):
    ui = fake_ui(tmp_path, sleep=5)
    client = _control.ControlClient(ui, '/p', timeout=0.3, log_dir='/l')
    with pytest.raises(DaemonTimeoutError, match=r'did not answer within 0\.3s \(see /l/control.log\)'):
        client.batch(['get_server_list'])


def test_missing_binary_is_a_control_binary_error(tmp_path):
    with pytest.raises(ControlBinaryError, match='cannot run'):
        _control.ControlClient(str(tmp_path / 'nope'), '/p', timeout=5).batch(['get_server_list'])


@pytest.mark.parametrize('command, answer, taken', [
    ('set_default_active_thread_percentage 25', '25.0', True),
    ('set_default_active_thread_percentage 33.33', '33.3', True),
    ('set_active_thread_percentage 4242 40', '40.0', True),
    # r580 refuses a value by printing the one it keeps, with no error text (gpu-evidence probe.txt)
    ('set_default_active_thread_percentage 250', '100.0', False),
    ('set_active_thread_percentage 4242 150', '25.0', False),
])
def test_a_percentage_setter_is_taken_only_when_it_echoes_the_value_sent(command, answer, taken):
    reply = _control.Reply(command, (answer,))
    if taken:
        _commands.check_applied([reply])
    else:
        with pytest.raises(ControlCommandError, match=r"rejected '%s': it answered %s, the value it keeps" % (command, answer)):
            _commands.check_applied([reply])
