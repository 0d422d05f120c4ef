# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The control UI: batching, exit codes, outputs of the daemon-level commands (reference section 3)."""
from __future__ import annotations

import pytest

from conftest import SimHost
import mps_daemon

NO_DAEMON = 'Cannot find MPS control daemon process\n'


def test_no_daemon_prints_cannot_find_on_stderr_and_exits_1(host: SimHost) -> None:
    # r580 (gpu-evidence compare.json, step 'no-daemon'): on stderr, stdout empty
    proc = host.ui(['get_server_list'])
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, '', NO_DAEMON)


def test_no_daemon_even_with_empty_stdin(host: SimHost) -> None:
    proc = host.ui('')
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, '', NO_DAEMON)


def test_a_batch_is_one_ui_session_on_one_connection(running: SimHost) -> None:
    before = running.log_messages()
    out = running.out(['get_default_active_thread_percentage', 'set_default_active_thread_percentage 40',
                       'get_default_active_thread_percentage', 'get_server_list', 'get_default_client_priority'])
    assert out == '100.0\n40.0\n40.0\n0\n'
    new = running.log_messages()[len(before):]
    assert new.count('NEW UI') == 1
    assert new.count('Accepting connection...') == 1
    assert new == [
        'Accepting connection...', 'NEW UI',
        'Cmd:get_default_active_thread_percentage', '100.0',
        'Cmd:set_default_active_thread_percentage 40', '40.0',
        'Cmd:get_default_active_thread_percentage', '40.0',
        'Cmd:get_server_list',
        'Cmd:get_default_client_priority', '0',
        'UI closed',
    ]


def test_each_ui_process_is_one_new_ui(running: SimHost) -> None:
    for _attempt in range(3):
        running.out(['get_server_list'])
    assert running.log_messages().count('NEW UI') == 3


def test_empty_stdin_is_still_one_session(running: SimHost) -> None:
    proc = running.ui('')
    assert (proc.returncode, proc.stdout) == (0, '')
    assert running.log_messages()[-3:] == ['Accepting connection...', 'NEW UI', 'UI closed']


def test_last_line_needs_no_newline(running: SimHost) -> None:
    assert running.out('set_default_active_thread_percentage 20\nget_default_active_thread_percentage') == '20.0\n20.0\n'


def test_blank_lines_are_skipped(running: SimHost) -> None:
    assert running.out('\n\nget_default_active_thread_percentage\n\n') == '100.0\n'
    assert 'Cmd:' not in running.log_messages()


def test_rejected_command_prints_error_on_stdout_and_exits_0(running: SimHost) -> None:
    proc = running.ui(['set_default_device_pinned_mem_limit 0 12X', 'get_default_active_thread_percentage'])
    assert proc.returncode == 0
    assert proc.stdout == 'Invalid value: 12X\n100.0\n'  # a bad memory value: not recorded on r580, the simulator's text
    assert proc.stderr == ''


def test_unknown_command_prints_unknown_command_quoted(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "unknown + bad")
    assert running.out(['frobnicate']) == 'Unknown command "frobnicate"\n'
    assert running.out(['frobnicate 1 2']) == 'Unknown command "frobnicate"\n'
    assert running.log_messages()[-3:] == ['Cmd:frobnicate 1 2', 'Unknown command "frobnicate"', 'UI closed']


@pytest.mark.parametrize('command', [
    'get_server_list 1', 'get_server_status', 'get_default_active_thread_percentage x', 'set_default_active_thread_percentage',
    'set_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit', 'get_client_list', 'quit now',
    'shutdown_server', 'terminate_client 1', 'start_server', 'start_server -uid', 'ps -q 1',
])
def test_wrong_arguments_are_rejected_with_a_text(shared: SimHost, command: str) -> None:
    out = shared.out([command])
    assert out.startswith(('Invalid arguments for ', 'Invalid value', 'Invalid user id', 'Server with PID')), out
    assert shared.daemon_pid()


def test_get_server_list_is_empty_without_servers(running: SimHost) -> None:
    assert running.out(['get_server_list']) == ''


def test_get_default_active_thread_percentage_is_100_initially(running: SimHost) -> None:
    assert running.out(['get_default_active_thread_percentage']) == '100.0\n'


@pytest.mark.parametrize('value,stored', [('25', '25.0'), ('30.0', '30.0'), ('33.33', '33.3'), ('100', '100.0'), ('0.5', '0.5'), ('12.', '12.0')])
def test_set_default_active_thread_percentage_prints_the_stored_value(shared: SimHost, value: str, stored: str) -> None:
    assert shared.out([f'set_default_active_thread_percentage {value}', 'get_default_active_thread_percentage']) == f'{stored}\n{stored}\n'


@pytest.mark.parametrize('value', ['150', 'abc', '0', '-5', '100.1', '101', '25%', 'nan', '1e2', '0.0'])
def test_a_bad_active_thread_percentage_prints_the_value_in_force_and_changes_nothing(shared: SimHost, value: str) -> None:
    # r580 answered 150 and abc so (gpu-evidence probe.txt, "unknown + bad"); the other values are taken alike [I]
    out = shared.out(['set_default_active_thread_percentage 50', f'set_default_active_thread_percentage {value}',
                      'get_default_active_thread_percentage'])
    assert out == '50.0\n50.0\n50.0\n'


def test_a_bad_server_active_thread_percentage_prints_the_servers_value(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    assert running.out([f'set_active_thread_percentage {spid} 40', f'set_active_thread_percentage {spid} 150']) == '40.0\n40.0\n'


def test_env_active_thread_percentage_is_the_default(host: SimHost) -> None:
    host.start(env={'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '33'})
    assert host.out(['get_default_active_thread_percentage']) == '33.0\n'


@pytest.mark.parametrize('value,readback', [
    ('3840M', '3G'), ('1044M', '1G'), ('1024M', '1G'), ('1023M', '1023M'), ('2047M', '1G'), ('2G', '2G'), ('512M', '512M'), ('0M', '0M'),
    ('81559M', '79G'),
])
def test_pinned_mem_limit_set_prints_nothing_and_reads_back_lossy(shared: SimHost, value: str, readback: str) -> None:
    assert shared.out([f'set_default_device_pinned_mem_limit 0 {value}']) == ''
    assert shared.out(['get_default_device_pinned_mem_limit 0']) == f'{readback}\n'
    assert shared.log_messages()[-3:] == ['Cmd:get_default_device_pinned_mem_limit 0', readback, 'UI closed']


def test_pinned_mem_limits_are_per_device(running: SimHost) -> None:
    out = running.out(['set_default_device_pinned_mem_limit 0 2G', 'set_default_device_pinned_mem_limit 3 500M',
                       'get_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit 3'])
    assert out == '2G\n500M\n'
    assert running.out(['get_default_device_pinned_mem_limit 1']) == ''


def test_unset_pinned_mem_limit_prints_nothing_and_logs_that_none_is_set(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "defaults" and its control.log)
    proc = running.ui(['get_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit GPU-6a2b5c1e-0000-4000-8000-000000000000'])
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '', '')
    assert running.log_messages()[-5:] == [
        'Cmd:get_default_device_pinned_mem_limit 0', 'No default pinned memory limit set for the device!',
        'Cmd:get_default_device_pinned_mem_limit GPU-6a2b5c1e-0000-4000-8000-000000000000',
        'No default pinned memory limit set for the device!', 'UI closed']


def test_unset_server_pinned_mem_limit_prints_nothing(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    assert running.out([f'get_device_pinned_mem_limit {spid} 0']) == ''
    assert running.log_messages()[-2:] == [f'Cmd:get_device_pinned_mem_limit {spid} 0', 'UI closed']  # no log line recorded


@pytest.mark.parametrize('value', ['10', '10MB', '1.5G', '-1G', '10m', '1g', 'G', '1T', '0x10M'])
def test_pinned_mem_limit_rejects_bad_values(shared: SimHost, value: str) -> None:
    out = shared.out(['set_default_device_pinned_mem_limit 0 7M', f'set_default_device_pinned_mem_limit 0 {value}',
                      'get_default_device_pinned_mem_limit 0'])
    assert out == f'Invalid value: {value}\n7M\n'


@pytest.mark.parametrize('dev', ['4', '99', 'GPU-6a2b5c1e', 'GPU-00000000-0000-0000-0000-000000000000',
                                 'MIG-00000000-0000-0000-0000-000000000000'])
def test_pinned_mem_limit_stores_devices_the_daemon_does_not_see(shared: SimHost, dev: str) -> None:
    # reference section 3 [C]: DEV is not validated; a missing device's limit is kept and read back
    assert shared.out([f'set_default_device_pinned_mem_limit {dev} 1G', f'get_default_device_pinned_mem_limit {dev}']) == '1G\n'
    assert shared.log_messages()[-4:] == [f'Cmd:set_default_device_pinned_mem_limit {dev} 1G', f'Cmd:get_default_device_pinned_mem_limit {dev}',
                                          '1G', 'UI closed']


@pytest.mark.parametrize('dev', ['-1', 'abc', '0x0', '1.0'])
def test_pinned_mem_limit_rejects_a_malformed_device(shared: SimHost, dev: str) -> None:
    assert shared.out([f'set_default_device_pinned_mem_limit {dev} 1G']) == f'Invalid device: {dev}\n'
    assert shared.out([f'get_default_device_pinned_mem_limit {dev}']) == f'Invalid device: {dev}\n'


def test_env_pinned_mem_limit_is_the_daemon_default(host: SimHost) -> None:
    host.start(env={'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=1G,1=2048M,3=512M'})
    assert host.out([f'get_default_device_pinned_mem_limit {i}' for i in (0, 1, 3)]) == '1G\n2G\n512M\n'
    assert host.out(['get_default_device_pinned_mem_limit 2']) == ''


def test_client_priority_defaults_to_0_and_set_prints_nothing(running: SimHost) -> None:
    # r580 (gpu-evidence probe2.txt, "client priority")
    assert running.out(['get_default_client_priority', 'set_default_client_priority 1', 'get_default_client_priority']) == '0\n1\n'


@pytest.mark.parametrize('value', ['2', '-1', 'high', '0.5'])
def test_client_priority_rejects_other_values(shared: SimHost, value: str) -> None:
    out = shared.out(['set_default_client_priority 0', f'set_default_client_priority {value}', 'get_default_client_priority'])
    assert out == f'Invalid value: {value}\n0\n'


def test_env_client_priority_is_the_default(host: SimHost) -> None:
    host.start(env={'CUDA_MPS_CLIENT_PRIORITY': '1'})
    assert host.out(['get_default_client_priority']) == '1\n'


@pytest.mark.parametrize('command', ['get_server_status 1', 'get_client_list 1', 'get_active_thread_percentage 1',
                                     'set_active_thread_percentage 1 50', 'get_device_pinned_mem_limit 1 0',
                                     'set_device_pinned_mem_limit 1 0 1G', 'shutdown_server 1', 'terminate_client 1 2',
                                     'get_device_client_list 1', 'get_server_status abc'])
def test_commands_on_a_pid_that_is_no_server_are_rejected(shared: SimHost, command: str) -> None:
    pid = command.split()[1]
    assert shared.out([command]) == f'Server with PID {pid} not found\n'


def test_ps_without_clients_prints_the_padded_header(running: SimHost) -> None:
    # r580's header, trailing blanks included (gpu-evidence probe.txt)
    assert running.out(['ps']) == 'PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        \n'


def test_get_device_client_list_without_clients_lists_the_devices(running: SimHost) -> None:
    assert running.out(['get_device_client_list']).splitlines() == [
        '[0] 00:00.0, NVIDIA H100 80GB HBM3', '[1] 00:00.0, NVIDIA H100 80GB HBM3', '[2] 00:00.0, Tesla V100-SXM2-16GB',
        '[3] 00:00.0, Tesla P100-PCIE-16GB']


def test_sim_devices_lists_ordinal_uuid_cc_max_clients_name(running: SimHost) -> None:
    assert running.out(['sim_devices']).splitlines() == [
        '0 GPU-6a2b5c1e-0000-4000-8000-000000000000 9.0 48 NVIDIA H100 80GB HBM3',
        '1 GPU-6a2b5c1e-1111-4000-8000-000000000001 9.0 48 NVIDIA H100 80GB HBM3',
        '2 GPU-9f00aa01-2222-4000-8000-000000000002 7.0 48 Tesla V100-SXM2-16GB',
        '3 GPU-1234abcd-3333-4000-8000-000000000003 6.0 16 Tesla P100-PCIE-16GB',
    ]


def test_many_commands_in_one_batch(running: SimHost) -> None:
    commands = [f'set_default_active_thread_percentage {i}' for i in range(1, 101)]
    assert running.out(commands) == ''.join(f'{i}.0\n' for i in range(1, 101))
    assert running.log_messages().count('NEW UI') == 1


def test_value_helpers() -> None:
    assert mps_daemon.format_mem(3840) == '3G' and mps_daemon.format_mem(1044) == '1G' and mps_daemon.format_mem(1023) == '1023M'
    assert mps_daemon.format_mem(3840, 'exact') == '3840M'
    assert mps_daemon.parse_mem('2G') == 2048 and mps_daemon.parse_mem('2g') is None
    assert mps_daemon.parse_percentage('25') == 25.0 and mps_daemon.parse_percentage('100.5') is None
    assert mps_daemon.format_percentage(33.333) == '33.3'
