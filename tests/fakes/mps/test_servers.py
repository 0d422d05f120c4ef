# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Servers and clients: real processes, limits, uids, quit (reference sections 1, 3 and 4)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Callable

import pytest

from conftest import CLIENT, NOBODY, PYTHON, Client, SimHost, pid_alive, wait_until, write_ini
import mps_common


def proc_uid(pid: int) -> int:
    """Real uid of a process."""
    with open(f'/proc/{pid}/status', encoding='utf-8') as handle:
        for line in handle:
            if line.startswith('Uid:'):
                return int(line.split()[1])
    raise AssertionError('no Uid line')


def test_first_client_starts_a_server_process(running: SimHost) -> None:
    client = running.client()
    info = client.info()
    spid = info['server_pid']
    assert info['ok'] is True and info['client_pid'] == client.pid and info['uid'] == 0
    assert running.servers() == [spid]
    with open(f'/proc/{spid}/comm', encoding='utf-8') as handle:
        assert handle.read().strip() == 'nvidia-cuda-mps'
    with open(f'/proc/{spid}/cmdline', 'rb') as handle:
        assert handle.read().split(b'\0')[0] == b'nvidia-cuda-mps-server'
    assert proc_uid(spid) == 0
    assert client.stop() == 0


def test_client_reports_limits_devices_and_priority(running: SimHost) -> None:
    info = running.client('--device', '0,2').info()
    assert info['active_thread_percentage'] == 100.0
    assert info['pinned_mem_limit_mib'] == {'0': None, '2': None}
    assert info['client_priority'] == 0
    assert [d['ordinal'] for d in info['devices']] == [0, 2]
    assert info['devices'][1]['uuid'] == 'GPU-9f00aa01-2222-4000-8000-000000000002'


def test_control_log_records_client_and_server_start(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    messages = running.log_messages()
    assert f'NEW CLIENT {client.pid} from user 0: Server is not ready, push client to pending list' in messages
    assert f'NEW SERVER {spid}: Ready' in messages
    start = [line for line in running.control_log() if f'Starting new server {spid} for user 0' in line]
    assert len(start) == 1 and f'Control {spid:5d}]' in start[0]  # logged by the forked server, as the real one does
    second = running.client()
    second.info()
    assert f'NEW CLIENT {second.pid} from user 0: Server already exists' in running.log_messages()


def test_server_log_records_start_limits_and_clients(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 25', 'set_default_device_pinned_mem_limit 0 3840M'])
    client = running.client('--device', '0')
    spid = client.info()['server_pid']
    running.wait_log(f'Client {{PID: {client.pid}, Context ID: 0}} connected', 'server')
    lines = running.server_log()
    for line in lines:
        assert re.match(r'^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} (Server|Other) [ \d]{5}\] ', line), line
        assert f' {spid:5d}] ' in line
    messages = running.log_messages('server')
    assert messages[:3] == ['Startup', f'Connecting to control daemon on socket: {running.pipe}/control', 'Initializing server process']
    assert 'Creating server context on device 0 (NVIDIA H100 80GB HBM3)' in messages
    assert 'Active Threads Percentage set to 25.0' in messages
    assert 'Device pinned memory limit for device 0 set to 0xf0000000 bytes' in messages  # 3840 MiB
    assert 'Server has started' in messages
    client.stop()
    running.wait_log(f'Client {{PID: {client.pid}, Context ID: 0}} disconnected', 'server')


def test_get_server_status_is_active_once_started(running: SimHost) -> None:
    spid = running.client().info()['server_pid']
    assert running.out([f'get_server_status {spid}']) == 'ACTIVE\n'


def test_start_server_starts_an_idle_server_and_prints_nothing(running: SimHost) -> None:
    assert running.out(['start_server -uid 0']) == ''
    spid = wait_until(running.servers, what='server')[0]  # type: ignore[index]
    assert proc_uid(spid) == 0
    wait_until(lambda: running.out([f'get_server_status {spid}']) == 'ACTIVE\n', what='ACTIVE')
    assert running.out([f'get_client_list {spid}']) == ''
    info = running.client().info()
    assert info['server_pid'] == spid


def test_start_server_for_another_uid_runs_as_that_uid(running: SimHost) -> None:
    running.out([f'start_server -uid {NOBODY}'])
    spid = wait_until(running.servers, what='server')[0]  # type: ignore[index]
    wait_until(lambda: running.out([f'get_server_status {spid}']) == 'ACTIVE\n', what='ACTIVE')
    assert proc_uid(spid) == NOBODY


def test_idle_server_persists_after_its_clients_exit(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    assert client.stop() == 0
    wait_until(lambda: running.out([f'get_client_list {spid}']) == '', what='client gone')
    assert running.servers() == [spid]
    assert pid_alive(spid)
    assert running.client().info()['server_pid'] == spid


def test_get_client_list_lists_connected_clients(running: SimHost) -> None:
    first = running.client()
    spid = first.info()['server_pid']
    second = running.client()
    assert second.info()['server_pid'] == spid
    assert running.out([f'get_client_list {spid}']).split() == [str(first.pid), str(second.pid)]
    second.stop()
    wait_until(lambda: running.out([f'get_client_list {spid}']).split() == [str(first.pid)], what='one client left')


def test_context_ids_count_up_per_server(running: SimHost) -> None:
    ids = [running.client().info()['context_id'] for _attempt in range(3)]  # info() waits: they connect one after the other
    assert ids == [0, 1, 2]


def test_defaults_are_copied_into_a_server_when_it_starts(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 25', 'set_default_device_pinned_mem_limit 1 2G', 'set_default_client_priority 1'])
    info = running.client().info()
    spid = info['server_pid']
    assert info['active_thread_percentage'] == 25.0
    assert info['pinned_mem_limit_mib'] == {'0': None, '1': 2048, '2': None, '3': None}
    assert info['client_priority'] == 1
    # later defaults do not reach the running server
    running.out(['set_default_active_thread_percentage 50', 'set_default_device_pinned_mem_limit 1 4G'])
    assert running.out([f'get_active_thread_percentage {spid}', f'get_device_pinned_mem_limit {spid} 1']) == '25.0\n2G\n'
    later = running.client().info()
    assert later['active_thread_percentage'] == 25.0 and later['pinned_mem_limit_mib']['1'] == 2048


def test_defaults_set_before_a_restart_of_the_server_apply_to_the_next_server(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    running.out(['set_default_active_thread_percentage 60'])
    client.stop()
    running.out([f'shutdown_server {spid}'])
    wait_until(lambda: not pid_alive(spid), what='server exit')
    assert running.client().info()['active_thread_percentage'] == 60.0


def test_per_server_settings_affect_only_clients_that_connect_afterwards(running: SimHost) -> None:
    first = running.client()
    spid = first.info()['server_pid']
    assert running.out([f'set_active_thread_percentage {spid} 40', f'set_device_pinned_mem_limit {spid} 0 1044M',
                        f'get_active_thread_percentage {spid}', f'get_device_pinned_mem_limit {spid} 0']) == '40.0\n40.0\n1G\n'
    second = running.client().info()
    assert second['active_thread_percentage'] == 40.0 and second['pinned_mem_limit_mib']['0'] == 1044
    clients = {c['pid']: c for c in running.state()['servers'][0]['clients']}
    assert clients[first.pid]['active_thread_percentage'] == 100.0
    assert clients[first.pid]['pinned_mem_limit_mib']['0'] is None
    # the daemon defaults are untouched
    assert running.out(['get_default_active_thread_percentage', 'get_default_device_pinned_mem_limit 0']) == '100.0\n'


def test_client_environment_can_only_lower_its_limits(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 50', 'set_default_device_pinned_mem_limit 0 4G'])
    low = running.client('--device', '0', env={'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '20', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=1G'}).info()
    assert low['active_thread_percentage'] == 20.0 and low['pinned_mem_limit_mib'] == {'0': 1024}
    high = running.client('--device', '0', env={'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '90', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=8G'}).info()
    assert high['active_thread_percentage'] == 50.0 and high['pinned_mem_limit_mib'] == {'0': 4096}


def test_defaults_are_lost_on_quit(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 25', 'set_default_device_pinned_mem_limit 0 3G', 'set_default_client_priority 1'])
    running.quit()
    running.start()
    assert running.out(['get_default_active_thread_percentage', 'get_default_device_pinned_mem_limit 0',
                        'get_default_client_priority']) == '100.0\n0\n'


def test_defaults_are_lost_after_a_crash(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 25'])
    pid = running.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    running.start()
    assert running.out(['get_default_active_thread_percentage']) == '100.0\n'


def test_quit_blocks_while_clients_are_connected(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    dpid = running.daemon_pid()
    quitter = running.ui_background(['quit'])
    time.sleep(0.5)
    assert quitter.poll() is None, 'quit returned while a client was connected'
    assert pid_alive(dpid) and pid_alive(spid)
    assert running.out(['get_server_list']) == f'{spid}\n'  # the daemon still answers other UIs
    assert client.stop() == 0
    out = quitter.communicate(timeout=10)[0]
    assert (quitter.returncode, out) == (0, '')
    wait_until(lambda: not pid_alive(dpid) and not pid_alive(spid), what='daemon and server exit')
    assert f'Server {spid} exited with status 0' in running.log_messages()


def test_quit_refuses_new_clients_while_it_waits(running: SimHost) -> None:
    client = running.client()
    client.info()
    quitter = running.ui_background(['quit'])
    running.wait_log('Cmd:quit')
    late = running.client('--timeout', '5')
    rc, out, _err = late.rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_CONNECTION_FAILED"' in out
    client.stop()
    quitter.communicate(timeout=10)


def test_quit_t_returns_0_after_the_timeout_and_the_client_process_lives_on(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "quit -t 3 with a client held"): the UI returned 0 after 3.0 s, daemon and
    # server exited, the client process kept running (its GPU work gone)
    client = running.client()
    spid = client.info()['server_pid']
    dpid = running.daemon_pid()
    started = time.monotonic()
    proc = running.ui(['quit -t 1'])
    elapsed = time.monotonic() - started
    assert (proc.returncode, proc.stdout) == (0, '')
    assert 0.9 <= elapsed < 5
    wait_until(lambda: not pid_alive(dpid) and not pid_alive(spid), what='daemon and server exit')
    assert client.printed_within(5)
    lost = json.loads(client.proc.stdout.readline())  # type: ignore[union-attr]
    assert lost['ok'] is False and lost['error'] == 'CUDA_ERROR_MPS_CLIENT_TERMINATED'
    time.sleep(0.3)
    assert pid_alive(client.pid)
    rc, out, err = client.rest()  # its stdin closed: it ends, reporting the loss by its status
    assert (rc, out) == (1, '') and 'CUDA error 810' in err


def test_quit_without_clients_stops_idle_servers(running: SimHost) -> None:
    running.out(['start_server -uid 0'])
    spid = wait_until(running.servers, what='server')[0]  # type: ignore[index]
    running.quit()
    wait_until(lambda: not pid_alive(spid), what='server exit')


def test_only_one_uid_has_an_active_server_at_a_time(running: SimHost) -> None:
    root = running.client()
    root_server = root.info()['server_pid']
    other = running.client(uid=NOBODY)
    assert not other.printed_within(0.4), 'a second uid got a server while the first one had clients'
    assert running.servers() == [root_server]
    running.wait_log(f'NEW CLIENT {other.pid} from user {NOBODY}: Server is not ready, push client to pending list')
    root.stop()
    info = other.info()
    assert info['uid'] == NOBODY and info['client_uid'] == NOBODY and info['server_pid'] != root_server
    assert proc_uid(info['server_pid']) == NOBODY
    wait_until(lambda: not pid_alive(root_server), what='root server retired')
    assert running.servers() == [info['server_pid']]
    assert f'Server {root_server} exited with status 0' in running.log_messages()


def test_an_idle_server_of_another_uid_is_retired_at_once(running: SimHost) -> None:
    running.out(['start_server -uid 0'])
    root_server = wait_until(running.servers, what='server')[0]  # type: ignore[index]
    info = running.client(uid=NOBODY).info()
    assert info['uid'] == NOBODY
    wait_until(lambda: not pid_alive(root_server), what='root server retired')


def test_clients_queue_in_order_across_uids(running: SimHost) -> None:
    root = running.client()
    root.info()
    other = running.client(uid=NOBODY)
    running.wait_log(f'NEW CLIENT {other.pid} from user {NOBODY}')
    late_root = running.client()
    running.wait_log(f'NEW CLIENT {late_root.pid} from user 0')
    assert not other.printed_within(0.3) and not late_root.printed_within(0.01)
    root.stop()
    assert other.info()['uid'] == NOBODY
    assert not late_root.printed_within(0.3)
    other.stop()
    assert late_root.info()['uid'] == 0


def test_multiuser_server_serves_every_uid_from_one_root_server(host: SimHost) -> None:
    host.start('-d', '-multiuser-server')
    root = host.client().info()
    other = host.client(uid=NOBODY).info()
    assert root['server_pid'] == other['server_pid']
    assert other['uid'] == 0 and other['client_uid'] == NOBODY
    assert proc_uid(root['server_pid']) == 0
    assert host.out([f'get_client_list {root["server_pid"]}']).split() == [str(root['client_pid']), str(other['client_pid'])]


def test_kill_9_of_a_server_is_noticed_and_its_clients_fail(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    os.kill(spid, signal.SIGKILL)
    running.wait_log(f'Server {spid} was terminated by signal 9')
    assert running.out(['get_server_list']) == ''
    assert running.out([f'get_server_status {spid}']) == f'Server with PID {spid} not found\n'
    rc, out, _err = client.rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_RPC_FAILURE"' in out
    # the next client gets a new server
    assert running.client().info()['server_pid'] != spid


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM])
def test_daemon_killed_ends_its_server_and_the_client_process_lives_on(running: SimHost, sig: int) -> None:
    # r580 (gpu-evidence probe3.txt, kill -9 and TERM): the server died with the daemon, the client did not
    client = running.client()
    spid = client.info()['server_pid']
    os.kill(running.daemon_pid(), sig)
    wait_until(lambda: not pid_alive(spid), what='server exit')
    assert client.printed_within(5)
    lost = json.loads(client.proc.stdout.readline())  # type: ignore[union-attr]
    assert lost['error'] == 'CUDA_ERROR_MPS_RPC_FAILURE'
    time.sleep(0.3)
    assert pid_alive(client.pid)
    assert client.stop() == 1


def test_terminate_client_prints_0_and_ends_the_client(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    assert running.out([f'terminate_client {spid} {client.pid}']) == '0\n'
    rc, out, err = client.rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_CLIENT_TERMINATED"' in out and 'CUDA error 810' in err
    assert running.out([f'get_client_list {spid}']) == ''
    assert running.out([f'terminate_client {spid} {client.pid}']) == f'Client with PID {client.pid} not found on server {spid}\n'
    assert pid_alive(spid)


def test_shutdown_server_waits_for_its_clients(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    assert running.out([f'shutdown_server {spid}']) == ''
    time.sleep(0.2)
    assert pid_alive(spid)
    assert running.out([f'get_server_status {spid}']) == 'ACTIVE\n'
    newcomer = running.client()
    assert not newcomer.printed_within(0.3), 'a shutting-down server took a new client'
    client.stop()
    wait_until(lambda: not pid_alive(spid), what='server exit')
    assert newcomer.info()['server_pid'] != spid


def test_shutdown_server_f_stops_it_at_once(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    assert running.out([f'shutdown_server {spid} -f']) == ''
    wait_until(lambda: not pid_alive(spid), what='server exit')
    rc = client.rest()[0]
    assert rc == 1


PS_HEADER = 'PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND        '


def test_ps_prints_a_fixed_width_row_per_client_numbered_from_1_per_server(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "client held"): `514       1         516            GPU-4e77057f-2920-0f20    4026531836     /opt/...`
    first = running.client('--device', '1')
    spid = first.info()['server_pid']
    second = running.client()
    second.info()
    out = running.out(['ps'])
    ns = os.readlink(f'/proc/{first.pid}/ns/pid').split('[')[1].rstrip(']')
    assert out.splitlines() == [
        PS_HEADER,
        f'{first.pid:<10}1         {spid:<15}GPU-6a2b5c1e-1111-4000    {ns:<15}{PYTHON}',
        f'{second.pid:<10}2         {spid:<15}GPU-6a2b5c1e-0000-4000    {ns:<15}{PYTHON}',
    ]
    # -p takes a SERVER pid: its clients' rows; a client's pid or any other pid selects none
    assert running.out([f'ps -p {spid}']) == out
    assert running.out([f'ps -p {second.pid}']) == PS_HEADER + '\n'
    assert running.out(['ps -p 1']) == PS_HEADER + '\n'


def test_ps_ids_count_per_server(running: SimHost) -> None:
    first = running.client()
    spid = first.info()['server_pid']
    first.stop()
    running.out([f'shutdown_server {spid}'])
    wait_until(lambda: not pid_alive(spid), what='server exit')
    client = running.client()
    assert client.info()['server_pid'] != spid
    assert running.out(['ps']).splitlines()[1].split()[:2] == [str(client.pid), '1']


def test_ps_format_spaces_is_the_old_row(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_PS_FORMAT': 'spaces'})
    client = host.client('--device', '1')
    spid = client.info()['server_pid']
    lines = host.out(['ps']).splitlines()
    assert lines[0] == 'PID ID SERVER DEVICE NAMESPACE COMMAND'
    row = lines[1].split(' ', 5)
    assert row[:4] == [str(client.pid), '0', str(spid), 'GPU-6a2b5c1e-1111-4000']
    assert 'mps_client.py --device 1' in row[5]


def test_get_device_client_list_prints_each_device_then_its_clients_as_pid_dot_id(running: SimHost) -> None:
    # r580 (gpu-evidence probe.txt, "client held"): `[0] 00:00.0, NVIDIA H200` then `514.1`
    first = running.client('--device', '0')
    spid = first.info()['server_pid']
    second = running.client('--device', '0,3')
    second.info()
    out = running.out(['get_device_client_list'])
    assert out.splitlines() == [
        '[0] 00:00.0, NVIDIA H100 80GB HBM3', f'{first.pid}.1', f'{second.pid}.2',
        '[1] 00:00.0, NVIDIA H100 80GB HBM3',
        '[2] 00:00.0, Tesla V100-SXM2-16GB',
        '[3] 00:00.0, Tesla P100-PCIE-16GB', f'{second.pid}.2',
    ]
    assert running.out([f'get_device_client_list {spid}']) == out


def test_get_device_client_list_format_uuid_is_the_old_list(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_DEVICE_CLIENT_LIST_FORMAT': 'uuid'})
    first = host.client('--device', '0')
    spid = first.info()['server_pid']
    second = host.client('--device', '0,3')
    second.info()
    out = host.out(['get_device_client_list'])
    assert out.splitlines() == [
        f'GPU-6a2b5c1e-0000-4000-8000-000000000000: {first.pid} {second.pid}',
        'GPU-6a2b5c1e-1111-4000-8000-000000000001:',
        'GPU-9f00aa01-2222-4000-8000-000000000002:',
        f'GPU-1234abcd-3333-4000-8000-000000000003: {second.pid}',
    ]
    assert host.out([f'get_device_client_list {spid}']) == out


def test_clients_per_gpu_are_capped_at_16_before_volta(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '3'})  # Tesla P100, compute capability 6.0
    clients = [host.client() for _attempt in range(16)]
    for client in clients:
        assert client.info()['ok'] is True
    extra = host.client()
    rc, out, _err = extra.rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"' in out
    clients[0].stop()
    spid = clients[1].info()['server_pid']
    wait_until(lambda: len(host.out([f'get_client_list {spid}']).split()) == 15, what='a free slot')
    assert host.client().info()['ok'] is True


def test_client_cannot_connect_without_a_daemon(host: SimHost) -> None:
    rc, out, err = host.client().rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_CONNECTION_FAILED"' in out and 'CUDA error 805' in err


def test_client_fails_when_it_cannot_traverse_the_pipe_dir_parents(make_host: Callable[..., SimHost]) -> None:
    host = make_host(0o700)  # like /run/nvidia at 0700
    host.start()
    rc, out, _err = host.client(uid=NOBODY).rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_CONNECTION_FAILED"' in out and 'Permission denied' in out
    assert host.client().info()['ok'] is True  # root still can


def test_client_exits_0_on_sigterm(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    client.proc.send_signal(signal.SIGTERM)
    assert client.proc.wait(10) == 0
    wait_until(lambda: running.out([f'get_client_list {spid}']) == '', what='client gone')


def test_client_once_disconnects_right_away(running: SimHost) -> None:
    client = running.client('--once')
    spid = client.info()['server_pid']
    assert client.proc.wait(10) == 0
    wait_until(lambda: running.out([f'get_client_list {spid}']) == '', what='client gone')


def test_client_rejects_a_device_the_daemon_does_not_have(running: SimHost) -> None:
    rc, out, _err = running.client('--device', '4').rest()
    assert rc == 1 and '"CUDA_ERROR_INVALID_DEVICE"' in out


def test_server_start_fails_on_a_prohibited_gpu_and_the_client_gets_an_error(host: SimHost) -> None:
    write_ini(host.ini, compute_mode={0: 'prohibited'})
    host.start(env={'CUDA_VISIBLE_DEVICES': '0'})
    rc, out, _err = host.client().rest(timeout=20)
    assert rc == 1 and '"CUDA_ERROR_MPS_CONNECTION_FAILED"' in out
    messages = host.log_messages()
    assert len([m for m in messages if m.startswith('Starting new server')]) == 6
    assert 'Failed to start : all CUDA-capable devices are busy or unavailable' in host.log_messages('server')
    assert host.out(['get_server_list']) == ''


def test_server_of_a_uid_that_cannot_reach_the_pipe_dir_fails_to_start(make_host: Callable[..., SimHost]) -> None:
    host = make_host(0o700)
    host.start()
    host.out([f'start_server -uid {NOBODY}'])
    host.wait_log('exited with status 1')
    assert host.out(['get_server_list']) == ''


def test_start_server_for_another_uid_is_refused_while_the_active_server_has_clients(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    assert running.out([f'start_server -uid {NOBODY}']) == 'A server for user 0 is active with clients\n'
    assert running.servers() == [spid]


def test_two_quits_both_return(running: SimHost) -> None:
    client = running.client()
    client.info()
    first = running.ui_background(['quit'])
    running.wait_log('Cmd:quit')
    second = running.ui_background(['quit'])
    wait_until(lambda: running.log_messages().count('Cmd:quit') == 2, what='second quit')
    client.stop()
    assert first.communicate(timeout=10)[0] == '' and first.returncode == 0
    assert second.communicate(timeout=10)[0] == '' and second.returncode == 0


# --------------------------------------------------------------------------
# Evidence audit (reference section 7): client lines, limit lines, start attempts, client caps, pre-Volta
# --------------------------------------------------------------------------

def _unshare_works() -> bool:
    if shutil.which('unshare') is None:
        return False
    return subprocess.run(['unshare', '--pid', '--fork', 'true'], capture_output=True, timeout=10, check=False).returncode == 0


def test_client_in_another_pid_namespace_is_logged_as_pid_0(running: SimHost) -> None:
    if not _unshare_works():
        pytest.skip('cannot create a pid namespace here')
    proc = subprocess.Popen(['unshare', '--pid', '--fork', PYTHON, CLIENT], stdin=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=running.environ())
    contained = Client(proc)
    running.clients.append(contained)
    info = contained.info()
    assert info['ok'] is True
    messages = running.log_messages()
    # the daemon still knows its real pid (get_client_list), the log shows 0, as in containers on real hosts
    assert 'NEW CLIENT 0 from user 0: Server is not ready, push client to pending list' in messages
    assert running.out([f'get_client_list {info["server_pid"]}']) == f'{info["client_pid"]}\n'
    assert not [m for m in messages if m.startswith(f'NEW CLIENT {info["client_pid"]} ')]
    local = running.client()
    local.info()
    assert f'NEW CLIENT {local.pid} from user 0: Server already exists' in running.log_messages()


def test_client_connection_is_logged_as_accepting_then_new_client(running: SimHost) -> None:
    client = running.client()
    client.info()
    messages = running.log_messages()
    index = messages.index(f'NEW CLIENT {client.pid} from user 0: Server is not ready, push client to pending list')
    assert messages[index - 1] == 'Accepting connection...'


def test_multiuser_daemon_logs_every_client_as_user_0(host: SimHost) -> None:
    host.start('-d', '-multiuser-server')
    other = host.client(uid=NOBODY)
    assert other.info()['client_uid'] == NOBODY
    assert f'NEW CLIENT {other.pid} from user 0: Server is not ready, push client to pending list' in host.log_messages()


def test_server_log_has_one_line_per_applied_limit(running: SimHost) -> None:
    running.out(['set_default_active_thread_percentage 33', 'set_default_device_pinned_mem_limit 0 5G',
                 'set_default_device_pinned_mem_limit 7 1G', 'set_default_device_pinned_mem_limit GPU-6a2b5c1e-1111-4000-8000-000000000001 2G'])
    running.client().info()
    running.wait_log('Server has started', 'server')
    limits = [m for m in running.log_messages('server') if ' set to ' in m and not m.startswith('Server Priority')]
    # the quoted real lines; the missing device 7 and the limit set by UUID (FAKE_MPS_UUID_LIMITS=ignored) apply nowhere
    assert limits == ['Active Threads Percentage set to 33.0', 'Device pinned memory limit for device 0 set to 0x140000000 bytes']


def test_a_failing_server_is_started_six_times_then_its_clients_fail(host: SimHost) -> None:
    assert mps_common.MAX_SERVER_START_ATTEMPTS == 6  # "restarted by the daemon 5 more times" [O]
    write_ini(host.ini, compute_mode={0: 'prohibited'})
    host.start(env={'CUDA_VISIBLE_DEVICES': '0'})

    def attempts() -> tuple[int, int]:
        messages = host.log_messages()
        return (len([m for m in messages if m.startswith('Starting new server')]),
                len([m for m in messages if re.fullmatch(r'Server \d+ exited with status 1', m)]))

    rc, out, _err = host.client().rest(timeout=20)
    assert rc == 1 and '"CUDA_ERROR_MPS_CONNECTION_FAILED"' in out
    assert attempts() == (6, 6)
    time.sleep(0.5)
    assert attempts() == (6, 6)  # no seventh once the waiting clients were failed
    rc = host.client().rest(timeout=20)[0]  # the next client gets six attempts of its own
    assert rc == 1 and attempts() == (12, 12)


def test_sixty_clients_per_gpu_on_an_r590_driver(host: SimHost) -> None:
    write_ini(host.ini, gpus=[('NVIDIA H200', 'GPU-c832e971-9447-428e-90fc-bd399a3751d3', 143771, '9.0')], driver='590.44.01', cuda='13010')
    host.start()
    assert host.out(['sim_devices']) == '0 GPU-c832e971-9447-428e-90fc-bd399a3751d3 9.0 60 NVIDIA H200\n'
    clients = [host.client('--device', '0') for _index in range(60)]
    assert all(client.info(timeout=60)['ok'] for client in clients)
    rc, out, _err = host.client('--device', '0').rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"' in out


def test_forty_eight_clients_per_gpu_before_r590(host: SimHost) -> None:
    write_ini(host.ini, gpus=[('NVIDIA H200', 'GPU-c832e971-9447-428e-90fc-bd399a3751d3', 143771, '9.0')], driver='580.65.06', cuda='13000')
    host.start()
    assert host.out(['sim_devices']) == '0 GPU-c832e971-9447-428e-90fc-bd399a3751d3 9.0 48 NVIDIA H200\n'


P100_ONLY = {'CUDA_VISIBLE_DEVICES': '3'}  # the default host's Tesla P100, compute capability 6.0


def test_pre_volta_server_logs_as_legacy_server_and_applies_no_limits(host: SimHost) -> None:
    host.start(env=P100_ONLY)
    host.out(['set_default_active_thread_percentage 25', 'set_default_device_pinned_mem_limit 0 2G'])
    info = host.client().info()
    assert info['active_thread_percentage'] == 100.0 and info['pinned_mem_limit_mib'] == {'0': None}
    spid = info['server_pid']
    host.wait_log(f'Client {{PID: {info["client_pid"]}, Context ID: 0}} connected', 'server')
    tags = {re.match(r'^\[\S+ \S+ (Other|Server|Legacy Server) +\d+\]', line).group(1) for line in host.server_log()}  # type: ignore[union-attr]
    assert tags == {'Other', 'Legacy Server'}
    messages = host.log_messages('server')
    assert 'Creating server context on device 0 (Tesla P100-PCIE-16GB)' in messages and 'Server has started' in messages
    assert not [m for m in messages if 'Active Threads Percentage' in m or 'pinned memory limit' in m]
    # control.log is the daemon's: the same lines as for any server
    assert f'NEW SERVER {spid}: Ready' in host.log_messages()


def test_a_mixed_gpu_set_runs_a_volta_server(running: SimHost) -> None:
    running.client().info()  # the default host: H100, H100, V100 and a P100
    running.wait_log('Server has started', 'server')
    assert not [line for line in running.server_log() if 'Legacy Server' in line]


def test_pre_volta_multiuser_is_accepted_but_only_root_clients_work(host: SimHost) -> None:
    proc = host.start('-d', '-multiuser-server', env=P100_ONLY)
    assert (proc.returncode, proc.stdout) == (0, '')
    rc, out, err = host.client(uid=NOBODY).rest()
    assert rc == 1 and '"CUDA_ERROR_NOT_PERMITTED"' in out and 'CUDA error 800' in err
    assert host.client().info()['ok'] is True
    assert host.out(['get_server_list']).count('\n') == 1


# --------------------------------------------------------------------------
# r580's client processes outlive their server (gpu-evidence probe.txt and probe3.txt)
# --------------------------------------------------------------------------

def test_client_on_server_loss_exits_is_the_old_behaviour(running: SimHost) -> None:
    client = running.client(env={'FAKE_MPS_CLIENT_ON_SERVER_LOSS': 'exits'})
    client.info()
    assert running.ui(['quit -t 0']).returncode == 0
    assert client.proc.wait(10) == 1  # on its own: its stdin is still open
    assert '"CUDA_ERROR_MPS_CLIENT_TERMINATED"' in client.proc.stdout.read()  # type: ignore[union-attr]


def test_client_on_server_loss_rejects_unknown_values(running: SimHost) -> None:
    rc, _out, err = running.client(env={'FAKE_MPS_CLIENT_ON_SERVER_LOSS': 'dies'}).rest()
    assert rc == 2 and 'FAKE_MPS_CLIENT_ON_SERVER_LOSS' in err


def test_terminate_client_ends_the_client_process_at_once_even_when_clients_live_on(running: SimHost) -> None:
    # not recorded on r580: the simulator's earlier behaviour
    client = running.client()
    spid = client.info()['server_pid']
    assert running.out([f'terminate_client {spid} {client.pid}']) == '0\n'
    assert client.proc.wait(10) == 1


def test_a_client_that_lost_its_server_exits_1_on_sigterm(running: SimHost) -> None:
    client = running.client()
    spid = client.info()['server_pid']
    os.kill(spid, signal.SIGKILL)
    assert client.printed_within(5)
    assert json.loads(client.proc.stdout.readline())['error'] == 'CUDA_ERROR_MPS_RPC_FAILURE'  # type: ignore[union-attr]
    assert pid_alive(client.pid)
    client.proc.send_signal(signal.SIGTERM)
    assert client.proc.wait(10) == 1


def test_after_kill_9_a_new_d_in_the_same_dir_serves_new_clients_while_the_old_client_lives(running: SimHost) -> None:
    # r580 (gpu-evidence probe3.txt, "kill -9 of the control daemon", "new -d in the same directory", "a second client now")
    old = running.client()
    old_server = old.info()['server_pid']
    dpid = running.daemon_pid()
    os.kill(dpid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(dpid) and not pid_alive(old_server), what='daemon and server death')
    assert running.ui(['get_server_list']).returncode == 1
    running.start()
    new = running.client()
    info = new.info()
    assert info['server_pid'] != old_server and running.servers() == [info['server_pid']]
    rows = running.out(['ps']).splitlines()[1:]
    assert [row.split()[:3] for row in rows] == [[str(new.pid), '1', str(info['server_pid'])]]
    assert pid_alive(old.pid)
    assert old.stop() == 1 and new.stop() == 0


def test_a_second_uids_client_waits_pending_and_ps_lists_only_the_first(running: SimHost) -> None:
    # r580 (gpu-evidence probe2.txt, "root client held, then a client of uid 65534 (no -multiuser)")
    root = running.client()
    spid = root.info()['server_pid']
    other = running.client(uid=NOBODY)
    running.wait_log(f'NEW CLIENT {other.pid} from user {NOBODY}: Server is not ready, push client to pending list')
    assert not other.printed_within(0.3)
    assert running.servers() == [spid]
    rows = running.out(['ps']).splitlines()[1:]
    assert [row.split()[:3] for row in rows] == [[str(root.pid), '1', str(spid)]]
    assert running.state()['pending'] == [other.pid]
