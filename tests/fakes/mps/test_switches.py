# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every FAKE_MPS_* switch: the [U] items of the reference and the fault injections (README.md)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import PYTHON, SIM, SimHost, pid_alive, wait_until
import mps_common
import mps_daemon

ALL = sorted(mps_common.PIPE_FILES)


def test_every_switch_is_documented_in_the_readme() -> None:
    with open(os.path.join(os.path.dirname(__file__), 'README.md'), encoding='utf-8') as handle:
        readme = handle.read()
    rows = [line for line in readme.splitlines() if line.startswith('|')]
    for name, (default, _allowed) in mps_common.SWITCHES.items():
        row = [r for r in rows if f'| `{name}` |' in r]
        assert len(row) == 1, name
        # the default column (second to last): `value`, or "empty" for an empty default
        assert row[0].split(' | ')[-2] == (f'`{default}`' if default else 'empty'), (name, default)


@pytest.mark.parametrize('value,left', [
    ('', ['control', 'control_lock', 'control_privileged']),
    ('r580', ['control', 'control_lock', 'control_privileged']),
    ('all-but-lock', ['control_lock']),
    ('all', []),
    ('none', ALL),
    ('sockets', ['control_lock', 'log', 'nvidia-cuda-mps-control.pid']),
    ('control,log', ['control_lock', 'control_privileged', 'nvidia-cuda-mps-control.pid']),
])
def test_quit_removes(host: SimHost, value: str, left: list[str]) -> None:
    host.start(env={'FAKE_MPS_QUIT_REMOVES': value})
    host.quit()
    assert sorted(os.listdir(host.pipe)) == left


def test_quit_removes_rejects_unknown_names(host: SimHost) -> None:
    proc = host.start(env={'FAKE_MPS_QUIT_REMOVES': 'control,bogus'}, check=False)
    assert proc.returncode == 2 and 'FAKE_MPS_QUIT_REMOVES' in proc.stderr


def test_leftover_files_from_quit_do_not_block_a_new_daemon(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_QUIT_REMOVES': 'none'})
    host.quit()
    proc = host.ui(['get_server_list'])
    assert (proc.returncode, proc.stderr) == (1, 'Cannot find MPS control daemon process\n')
    host.start()
    assert host.out(['get_default_active_thread_percentage']) == '100.0\n'


@pytest.mark.parametrize('value,out,err', [
    ('', '', 'Cannot find MPS control daemon process\n'),
    ('stderr', '', 'Cannot find MPS control daemon process\n'),
    ('stdout', 'Cannot find MPS control daemon process\n', ''),
])
def test_no_daemon_stream(host: SimHost, value: str, out: str, err: str) -> None:
    proc = host.ui(['get_server_list'], env={'FAKE_MPS_NO_DAEMON_STREAM': value})
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, out, err)


@pytest.mark.parametrize('style,unknown,value,mem', [
    ('', 'Unknown command "bogus"\n', '100.0\n', 'Invalid value: 12X\n'),
    ('r580', 'Unknown command "bogus"\n', '100.0\n', 'Invalid value: 12X\n'),
    ('text', 'Unrecognized command: bogus\n', 'Invalid value: 0\n', 'Invalid value: 12X\n'),
    ('alt', 'Error: unknown command\n', 'Error: invalid value\n', 'Error: invalid value\n'),
    ('silent', '', '', ''),
])
def test_error_style(host: SimHost, style: str, unknown: str, value: str, mem: str) -> None:
    host.start(env={'FAKE_MPS_ERROR_STYLE': style})
    assert host.out(['bogus']) == unknown
    assert host.out(['set_default_active_thread_percentage 0']) == value
    if style == 'silent':
        assert host.log_messages()[-2:] == ['Cmd:set_default_active_thread_percentage 0', 'UI closed']
    assert host.out(['set_default_device_pinned_mem_limit 0 12X']) == mem


def test_server_cmd_output_pid(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_SERVER_CMD_OUTPUT': 'pid'})
    out = host.out(['start_server -uid 0'])
    spid = int(out)
    assert host.servers() == [spid]
    assert host.out(['start_server -uid 0']) == f'{spid}\n'  # already there: the same server
    assert host.out([f'shutdown_server {spid}']) == f'{spid}\n'
    wait_until(lambda: not pid_alive(spid), what='server exit')


@pytest.mark.parametrize('value,out', [('0M', '0M\n'), ('0', '0\n'), ('empty', ''), ('N/A', 'N/A\n'), ('No limit', 'No limit\n')])
def test_unset_mem_limit(host: SimHost, value: str, out: str) -> None:
    host.start(env={'FAKE_MPS_UNSET_MEM_LIMIT': value})
    assert host.out(['get_default_device_pinned_mem_limit 0']) == out
    spid = host.client().info()['server_pid']
    assert host.out([f'get_device_pinned_mem_limit {spid} 0']) == out


@pytest.mark.parametrize('value,out', [
    ('number', '0\n1\n'),
    ('echo', '0\n1\n1\n'),
    ('name', 'NORMAL\nBELOW_NORMAL\n'),
])
def test_priority_output(host: SimHost, value: str, out: str) -> None:
    host.start(env={'FAKE_MPS_PRIORITY_OUTPUT': value})
    assert host.out(['get_default_client_priority', 'set_default_client_priority 1', 'get_default_client_priority']) == out


def test_device_client_list_format_pairs(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_DEVICE_CLIENT_LIST_FORMAT': 'pairs', 'CUDA_VISIBLE_DEVICES': '0,1'})
    first = host.client('--device', '1')
    first.info()
    second = host.client()
    second.info()
    uuids = [line.split()[1] for line in host.out(['sim_devices']).splitlines()]
    assert host.out(['get_device_client_list']).splitlines() == [
        f'{uuids[0]} {second.pid}', f'{uuids[1]} {first.pid}', f'{uuids[1]} {second.pid}']


def test_client_list_sep_space(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_CLIENT_LIST_SEP': 'space'})
    first = host.client()
    spid = first.info()['server_pid']
    second = host.client()
    second.info()
    assert host.out([f'get_client_list {spid}']) == f'{first.pid} {second.pid}\n'


@pytest.mark.parametrize('value,default_out,client_mib', [
    ('default', '1G\n', 1024),
    ('servers', '', 1024),
    ('ignored', '', None),
])
def test_env_pinned_mem(host: SimHost, value: str, default_out: str, client_mib: object) -> None:
    host.start(env={'FAKE_MPS_ENV_PINNED_MEM': value, 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=1G'})
    assert host.out(['get_default_device_pinned_mem_limit 0']) == default_out
    assert host.client('--device', '0').info()['pinned_mem_limit_mib'] == {'0': client_mib}


def test_mem_readback_exact(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_MEM_READBACK': 'exact'})
    assert host.out(['set_default_device_pinned_mem_limit 0 3840M', 'get_default_device_pinned_mem_limit 0',
                     'set_default_device_pinned_mem_limit 1 2G', 'get_default_device_pinned_mem_limit 1']) == '3840M\n2048M\n'


def test_mem_readback_unparseable_answers_na_but_limits_still_apply(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_MEM_READBACK': 'unparseable'})
    assert host.out(['get_default_device_pinned_mem_limit 0', 'set_default_device_pinned_mem_limit 0 2G',
                     'get_default_device_pinned_mem_limit 0']) == 'N/A\nN/A\n'
    info = host.client('--device', '0').info()
    assert info['pinned_mem_limit_mib'] == {'0': 2048}
    spid = info['server_pid']
    assert host.out([f'get_device_pinned_mem_limit {spid} 0', f'get_device_pinned_mem_limit {spid} 1']) == 'N/A\nN/A\n'
    host.wait_log('Device pinned memory limit for device 0 set to 0x80000000 bytes', 'server')


def test_bind_failure_error(host: SimHost) -> None:
    pipe = os.path.join(host.base, 'z' * (108 - len(host.base) - len('/control') - 1))
    assert len(os.path.join(pipe, 'control')) == 108
    proc = host.start(env={'FAKE_MPS_BIND_FAILURE': 'error', 'CUDA_MPS_PIPE_DIRECTORY': pipe, 'FAKE_MPS_PIPE_DIR_MAX': '200'}, check=False)
    assert (proc.returncode, proc.stdout) == (1, f'Failed to bind socket {pipe}/control\n')


def test_server_init_delay_shows_initializing(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_SERVER_INIT_DELAY': '0.8'})
    host.out(['start_server -uid 0'])
    spid = host.servers()[0]
    assert host.out([f'get_server_status {spid}']) == 'INITIALIZING\n'
    client = host.client()
    assert not client.printed_within(0.2)
    wait_until(lambda: host.out([f'get_server_status {spid}']) == 'ACTIVE\n', what='ACTIVE')
    assert client.info()['server_pid'] == spid


def test_server_init_delay_must_be_a_number(host: SimHost) -> None:
    proc = host.start(env={'FAKE_MPS_SERVER_INIT_DELAY': 'soon'}, check=False)
    assert proc.returncode == 2


def test_sim_fault_server_shows_fault_and_takes_no_new_clients(running: SimHost) -> None:
    first = running.client()
    spid = first.info()['server_pid']
    assert running.out([f'sim_fault_server {spid}', f'get_server_status {spid}']) == 'FAULT\n'
    newcomer = running.client()
    assert not newcomer.printed_within(0.3)
    first.stop()
    wait_until(lambda: not pid_alive(spid), what='faulty server exit')
    assert newcomer.info()['server_pid'] != spid


def test_fault_hang_accepts_but_never_answers(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_FAULT_HANG': '1'})
    with pytest.raises(subprocess.TimeoutExpired):
        host.ui(['get_server_list'], timeout=0.7)
    messages = host.log_messages()
    assert 'NEW UI' in messages and 'Cmd:get_server_list' not in messages
    assert pid_alive(host.daemon_pid())


def test_fault_quit_hang_never_completes_quit(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_FAULT_QUIT_HANG': '1'})
    quitter = host.ui_background(['quit -t 0'])
    time.sleep(0.7)
    assert quitter.poll() is None
    assert pid_alive(host.daemon_pid())
    assert host.out(['get_default_active_thread_percentage']) == '100.0\n'


@pytest.mark.parametrize('fault,rc', [('garbage', 0), ('crash', -11)])
def test_fault_ui_prints_garbage(running: SimHost, fault: str, rc: int) -> None:
    proc = subprocess.run([PYTHON, SIM], input=b'set_default_active_thread_percentage 42\nget_default_active_thread_percentage\n',
                          env=running.environ(FAKE_MPS_FAULT_UI=fault), capture_output=True, timeout=15, check=False)
    assert proc.returncode == rc
    assert b'42.0' not in proc.stdout
    assert proc.stdout.startswith(b'\x1b[?1049h\x00\xff')
    with pytest.raises(UnicodeDecodeError):
        proc.stdout.decode()
    # the daemon did run the command
    assert running.out(['get_default_active_thread_percentage']) == '42.0\n'


def test_fault_ui_rejects_unknown_values(running: SimHost) -> None:
    proc = running.ui(['get_server_list'], env={'FAKE_MPS_FAULT_UI': 'maybe'})
    assert proc.returncode == 2 and 'FAKE_MPS_FAULT_UI' in proc.stderr


def test_fault_kill_on_kills_the_daemon_mid_batch(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_FAULT_KILL_ON': 'set_default_active_thread_percentage'})
    pid = host.daemon_pid()
    files = sorted(os.listdir(host.pipe))
    assert files == ALL
    proc = host.ui(['get_default_active_thread_percentage', 'set_default_active_thread_percentage 25',
                    'get_default_active_thread_percentage'])
    # the UI got the first reply, then lost the connection: it sends nothing more and exits 1 (FAKE_MPS_UI_DROPPED=fail)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, '100.0\n', '')
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    assert host.log_messages()[-3:] == ['Cmd:get_default_active_thread_percentage', '100.0',
                                        'Cmd:set_default_active_thread_percentage 25']
    assert sorted(os.listdir(host.pipe)) == files  # a stale daemon: every file stays
    dead = host.ui(['get_server_list'])
    assert (dead.returncode, dead.stderr) == (1, 'Cannot find MPS control daemon process\n')
    host.start()
    assert host.daemon_pid() != pid and pid_alive(host.daemon_pid())
    assert host.out(['get_default_active_thread_percentage', 'set_default_active_thread_percentage 25']) == '100.0\n25.0\n'


@pytest.mark.parametrize('dropped,rc', [('', 1), ('fail', 1), ('ok', 0)])
def test_fault_kill_on_a_silent_command_shows_only_in_the_ui_status(host: SimHost, dropped: str, rc: int) -> None:
    host.start(env={'FAKE_MPS_FAULT_KILL_ON': 'set_default_device_pinned_mem_limit'})
    pid = host.daemon_pid()
    proc = host.ui(['set_default_device_pinned_mem_limit 0 2G'], env={'FAKE_MPS_UI_DROPPED': dropped})
    # the output is what a success prints too: only the status (unless FAKE_MPS_UI_DROPPED=ok) tells them apart
    assert (proc.returncode, proc.stdout, proc.stderr) == (rc, '', '')
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    assert host.log_messages()[-1] == 'Cmd:set_default_device_pinned_mem_limit 0 2G'
    assert host.ui(['get_default_device_pinned_mem_limit 0']).returncode == 1


def test_fault_kill_on_ends_the_servers_and_their_clients(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_FAULT_KILL_ON': 'quit'})
    client = host.client()
    spid = client.info()['server_pid']
    pid = host.daemon_pid()
    assert host.ui(['quit']).returncode == 1  # the session dropped
    wait_until(lambda: not pid_alive(pid), what='daemon death')
    wait_until(lambda: not pid_alive(spid), what='server exit')
    rc, out, _err = client.rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_RPC_FAILURE"' in out
    assert 'nvidia-cuda-mps-control.pid' in os.listdir(host.pipe)  # not a clean quit


@pytest.mark.parametrize('value', ['bogus', 'set_default_active_thread_percentage_x', 'Quit'])
def test_fault_kill_on_rejects_unknown_command_names(host: SimHost, value: str) -> None:
    proc = host.start(env={'FAKE_MPS_FAULT_KILL_ON': value}, check=False)
    assert proc.returncode == 2 and 'FAKE_MPS_FAULT_KILL_ON' in proc.stderr and repr(value) in proc.stderr
    assert host.ui(['get_server_list']).returncode == 1


def test_fault_kill_on_accepts_every_ui_command_and_only_those() -> None:
    for name in mps_daemon.UI_COMMANDS:
        assert mps_daemon.DaemonConfig.from_env({'FAKE_MPS_FAULT_KILL_ON': name}).fault_kill_on == name
    assert mps_daemon.DaemonConfig.from_env({}).fault_kill_on == ''
    assert mps_daemon.DaemonConfig.from_env({'FAKE_MPS_FAULT_KILL_ON': '  '}).fault_kill_on == ''
    with pytest.raises(mps_common.SwitchError):
        mps_daemon.DaemonConfig.from_env({'FAKE_MPS_FAULT_KILL_ON': 'get_server_list 1'})


def test_ui_dropped_rejects_unknown_values(running: SimHost) -> None:
    proc = running.ui(['get_server_list'], env={'FAKE_MPS_UI_DROPPED': 'maybe'})
    assert proc.returncode == 2 and 'FAKE_MPS_UI_DROPPED' in proc.stderr


@pytest.mark.parametrize('dropped,rc', [('', 1), ('ok', 0)])
def test_quit_reply_drop_stops_everything_without_answering(host: SimHost, dropped: str, rc: int) -> None:
    host.start(env={'FAKE_MPS_QUIT_REPLY': 'drop'})
    client = host.client()
    spid = client.info()['server_pid']
    pid = host.daemon_pid()
    quitter = host.ui_background(['get_default_active_thread_percentage', 'quit -t 1'], env={'FAKE_MPS_UI_DROPPED': dropped})
    out, err = quitter.communicate(timeout=15)
    assert (quitter.returncode, out, err) == (rc, '100.0\n', '')
    # by the time the UI saw the session end, the servers were stopped and the files removed: a clean quit
    assert not pid_alive(spid)
    assert sorted(os.listdir(host.pipe)) == ['control', 'control_lock', 'control_privileged']
    wait_until(lambda: not pid_alive(pid), what='daemon exit')
    assert client.rest()[0] == 1


def test_quit_reply_answer_is_the_default(running: SimHost) -> None:
    # answered, then the daemon is gone before the UI's goodbye: not a dropped session
    proc = running.ui(['get_server_list', 'quit'])
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '', '')
