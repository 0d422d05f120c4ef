# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MPS v3 of the simulator (mps_v3.py), held to shared/mps-v3-reference.md independently of the modules: absent before
binary 13040 as r580 recorded, named servers and namespaces from 13040 on (inferred, each test names its section)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import PYTHON, SIM, SimHost, wait_until, write_ini

GPUS = [('NVIDIA H200', 'GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b', 143771, '9.0'),
        ('NVIDIA H200', 'GPU-b2bb752d-52a7-47f6-ab1d-d3295872ad6c', 143771, '9.0')]
R615 = {'driver': '615.71.09', 'cuda': '13040'}
UID = os.geteuid()


def r615(host: SimHost) -> SimHost:
    write_ini(host.ini, GPUS, **R615)
    return host


def v3(host: SimHost, *words: str, env=None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, SIM, *words], env=host.environ(env), capture_output=True, text=True, timeout=15, check=False)
    if check:
        assert proc.returncode == 0, (words, proc.returncode, proc.stdout, proc.stderr)
    return proc


def csv(host: SimHost, *words: str) -> list[list[str]]:
    return [line.split(',') for line in v3(host, *words, '--format=csv,noheader').stdout.splitlines()]


def ns_env(host: SimHost, server: str, namespace: str = '', **more: str) -> dict:
    return {'CUDA_MPS_PIPE_DIRECTORY': os.path.join(host.pipe, server, namespace) if namespace else os.path.join(host.pipe, server),
            **more}


# ---------------------------------------------------------------- before 13040: none of it (r580 recorded)

def test_r580_refuses_protocol_3_as_recorded(host: SimHost) -> None:
    write_ini(host.ini, GPUS, driver='580.159.04', cuda='13000')
    proc = host.start('-d', '-p', '3', check=False)
    assert proc.returncode == 0 and proc.stdout.startswith('Unrecognized option')  # gpu-evidence probe2.txt
    assert 'namespace' not in proc.stdout and '--protocol' not in proc.stdout
    assert host.ui(['get_server_list']).returncode == 1  # nothing started


def test_r580_ignores_the_protocol_variable(host: SimHost) -> None:
    write_ini(host.ini, GPUS, driver='580.159.04', cuda='13000')
    host.start('-d', env={'CUDA_MPS_PROTOCOL_VERSION': '3'})
    assert host.state()['protocol'] == 2


# ---------------------------------------------------------------- 13040 and later (inferred)

def test_help_lists_server_and_namespace(host: SimHost) -> None:
    r615(host)
    helped = host.start('-p', '3', '-h', check=False).stdout  # DYN's check [ref 1.1]
    assert 'server ' in helped and 'namespace ' in helped and '-p,--protocol' in helped and '-q,--quit' in helped
    assert '--ready-devices' not in helped


def test_legacy_stays_the_default_and_speaks_legacy(host: SimHost) -> None:
    r615(host)
    host.start('-d')
    assert host.state()['protocol'] == 2
    assert host.out(['get_default_active_thread_percentage']).strip() == '100.0'
    # a v3 verb sent to a v2 daemon is read as v2 input [ref 1.1, I]
    assert v3(host, 'server', 'list').stdout.strip() == 'Unknown command "server"'


def test_variable_wins_over_the_option(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '2', env={'CUDA_MPS_PROTOCOL_VERSION': '3'})
    assert host.state()['protocol'] == 3


def test_server_create_list_get_delete(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    assert any('set CUDA_MPS_PIPE_DIRECTORY=' in m and 'set env' not in m for m in host.log_messages())
    v3(host, 'server', 'create', 'training', f'--allowed-devices={GPUS[0][1]},{GPUS[1][1]}', f'--uid={UID}')
    wait_until(lambda: csv(host, 'server', 'list')[0][3] == 'Ready', what='server Ready')
    row = v3(host, 'server', 'list', '--format=csv,noheader').stdout.strip()
    # name,uid,pid,status,pipe-directory,allowed-devices,context-ids [ref 1.3]; two devices quoted (FAKE_MPS_V3_LIST_QUOTE) [U]
    assert row.startswith(f'training,{UID},') and f',Ready,{host.pipe}/training,"{GPUS[0][1]},{GPUS[1][1]}",-' in row
    assert v3(host, 'server', 'get', 'training', 'pipe-directory').stdout.strip() == f'{host.pipe}/training'
    assert v3(host, 'server', 'get', 'training', 'pipe_directory', check=False).returncode == 1  # the dash spelling by default
    spelled = v3(host, 'server', 'get', 'training', 'pipe_directory', env={'FAKE_MPS_V3_FIELD_SPELLING': 'underscore'}, check=False)
    assert spelled.returncode == 1  # the switch is the daemon's, read at start: this daemon takes dashes
    assert os.path.exists(os.path.join(host.pipe, 'training', 'control'))
    assert os.path.exists(os.path.join(host.pipe, 'training', 'default', 'control'))
    header = v3(host, 'server', 'list', '--format=csv').stdout.splitlines()[0]
    assert header == 'name,uid,pid,status,pipe-directory,allowed-devices,context-ids'
    v3(host, 'server', 'delete', 'training')
    assert csv(host, 'server', 'list') == []
    assert not os.path.exists(os.path.join(host.pipe, 'training'))


@pytest.mark.parametrize('name', ['Training', 'a-b', 'x' * 65, ''])
def test_names_the_v3_rule_rejects(host: SimHost, name: str) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    proc = v3(host, 'server', 'create', name, check=False) if name else v3(host, 'server', 'create', check=False)
    assert proc.returncode == 1 and proc.stdout.startswith('Error:')
    assert csv(host, 'server', 'list') == []


def test_multiuser_allows_only_uid_0(host: SimHost) -> None:
    if UID != 0:
        pytest.skip('a multi-user daemon needs root')
    r615(host)
    host.start('-d', '-p', '3', '-m')
    proc = v3(host, 'server', 'create', 'shared', '--uid=1000', check=False)
    assert proc.returncode == 1 and 'only --uid=0' in proc.stdout  # [ref 1.3]
    v3(host, 'server', 'create', 'shared', '--uid=0')


def test_a_namespace_without_limits_gets_the_whole_gpu_and_limits_are_its_own(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'shared', f'--uid={UID}')
    v3(host, 'server', 'set', 'shared', '--active-thread-percentage=20', '--pinned-memory-limit=2G')
    for name in ('small', 'free'):
        v3(host, 'namespace', 'create', name, '--server=shared')
    v3(host, 'namespace', 'set', 'small', '--server=shared', '--active-thread-percentage=30', '--pinned-memory-limit=20G',
       '--client-priority=1')
    rows = {row[0]: row for row in csv(host, 'namespace', 'list', '--server=shared')}
    assert rows['small'][3:6] == ['20G', '30.00', '1']  # two decimals, as DYN's table [ref 1.4]
    assert rows['free'][3:6] == ['-', '-', '-']
    assert rows['small'][6] == f'{host.pipe}/shared/small'
    assert v3(host, 'namespace', 'get', 'small', 'shared', 'pinned-memory-limit').stdout.strip() == '20G'
    # a namespace neither inherits the server's (default namespace's) limits nor is capped by them [ref 1.9, DYN]
    free = host.client(env=ns_env(host, 'shared', 'free')).info()
    assert free['active_thread_percentage'] == 100.0 and free['pinned_mem_limit_mib'] == {'0': None, '1': None}
    assert free['server'] == 'shared' and free['namespace'] == 'free'
    small = host.client(env=ns_env(host, 'shared', 'small')).info()
    assert small['active_thread_percentage'] == 30.0 and small['pinned_mem_limit_mib'] == {'0': 20480, '1': 20480}
    assert small['client_priority'] == 1
    default = host.client(env=ns_env(host, 'shared')).info()  # <pipe>/<server>/control: the default namespace
    assert default['namespace'] == 'default' and default['active_thread_percentage'] == 20.0
    assert default['pinned_mem_limit_mib'] == {'0': 2048, '1': 2048}
    listed = {(row[3], row[1]) for row in csv(host, 'client', 'list', '--server=shared')}
    assert listed == {('free', 'shared'), ('small', 'shared'), ('default', 'shared')}


def test_a_clients_own_variables_only_lower_its_namespaces_limits(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'shared', f'--uid={UID}')
    v3(host, 'namespace', 'create', 'small', '--server=shared')
    v3(host, 'namespace', 'set', 'small', '--server=shared', '--active-thread-percentage=30', '--pinned-memory-limit=4G')
    lower = host.client(env=ns_env(host, 'shared', 'small', CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='10',
                                   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=1G,1=8G', CUDA_MPS_CLIENT_PRIORITY='1')).info()
    assert lower['active_thread_percentage'] == 10.0  # effective = min(env, namespace) [ref 1.11, O]
    assert lower['pinned_mem_limit_mib'] == {'0': 1024, '1': 4096}  # the variable lowers, never raises
    assert lower['client_priority'] == 1
    higher = host.client(env=ns_env(host, 'shared', 'small', CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='90')).info()
    assert higher['active_thread_percentage'] == 30.0 and higher['client_priority'] == 0


def test_the_main_socket_routes_to_uid_server(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'training', f'--uid={UID}')
    v3(host, 'server', 'set', 'training', '--active-thread-percentage=25')
    plain = host.client().info()  # CUDA_MPS_PIPE_DIRECTORY=<pipe>: outside the named server and its limits [ref 1.9, 4]
    assert plain['server'] == f'uid_{UID}' and plain['active_thread_percentage'] == 100.0
    assert {row[0] for row in csv(host, 'server', 'list')} == {'training', f'uid_{UID}'}


def test_namespace_set_and_delete_refused_while_attached(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'shared', f'--uid={UID}')
    for name in ('busy', 'idle'):
        v3(host, 'namespace', 'create', name, '--server=shared')
    client = host.client(env=ns_env(host, 'shared', 'busy'))
    client.info()
    refused = v3(host, 'namespace', 'set', 'busy', '--server=shared', '--active-thread-percentage=50', check=False)
    assert refused.returncode == 1 and 'active clients' in refused.stdout  # [ref 1.4, O]
    v3(host, 'namespace', 'set', 'idle', '--server=shared', '--active-thread-percentage=50')  # the other: live, no restart
    assert client.proc.poll() is None
    assert v3(host, 'namespace', 'delete', 'busy', '--server=shared', check=False).returncode == 1
    assert v3(host, 'server', 'delete', 'shared', check=False).returncode == 1
    v3(host, 'namespace', 'delete', 'busy', '--server=shared', '--force')
    wait_until(lambda: client.proc.poll() is not None or client.printed_within(0.1), what='client terminated')
    assert not os.path.exists(os.path.join(host.pipe, 'shared', 'busy'))
    assert [row[0] for row in csv(host, 'namespace', 'list', '--server=shared')] == ['default', 'idle']


def test_an_allowed_uuid_the_host_lacks_drops_the_server(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'ghost', '--allowed-devices=GPU-00000000-0000-0000-0000-000000000000', f'--uid={UID}')  # accepted [DYN]
    wait_until(lambda: csv(host, 'server', 'list') == [], what='the server to drop out')
    host.wait_log('no CUDA-capable device is detected', which='server')


def test_a_config_file_is_applied_at_start_and_only_then(host: SimHost) -> None:
    r615(host)
    path = os.path.join(host.base, 'mps.toml')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(f'schema_version = "1.0"\n[servers.training]\nuid = {UID}\nallowed_devices = "{GPUS[1][1]}"\n'
                     'active_thread_percentage = "40"\n'
                     '[servers.training.namespaces.high]\nactive_thread_percentage = "60"\npinned_memory_limit = "10G"\n')
    host.start('-d', '-p', '3', '-a', path)
    rows = {row[0]: row for row in csv(host, 'namespace', 'list', '--server=training')}
    assert rows['default'][4] == '40.00' and rows['high'][3:5] == ['10G', '60.00']
    high = host.client(env=ns_env(host, 'training', 'high')).info()
    assert high['devices'] == [{'name': 'NVIDIA H200', 'ordinal': 0, 'uuid': GPUS[1][1]}]
    assert high['pinned_mem_limit_mib'] == {'0': 10240}
    host.kill_all()
    v3(host, 'server', 'create', 'later', check=False)  # no daemon: nothing
    host.start('-d', '-p', '3', '-a', path)  # the file again: CLI-made state died with the daemon [ref 1.10]
    assert sorted(row[0] for row in csv(host, 'server', 'list')) == ['training']


def test_a_config_error_ends_the_start_or_is_skipped(host: SimHost) -> None:
    r615(host)
    path = os.path.join(host.base, 'bad.toml')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write('[servers.a]\nbogus = 1\n[servers.b]\nactive_thread_percentage = "10"\n')
    proc = host.start('-d', '-p', '3', '-a', path, check=False)
    assert proc.returncode == 1 and 'servers.a.bogus' in proc.stdout  # [ref 1.8: "any other key is a configuration error"]
    assert host.ui(['get_server_list']).returncode == 1
    host.start('-d', '-p', '3', '-a', path, env={'FAKE_MPS_V3_CONFIG_ERROR': 'skip'})
    assert sorted(row[0] for row in csv(host, 'server', 'list')) == ['b']  # the table with the error left out whole
    assert any('servers.a.bogus' in m for m in host.log_messages())


def test_legacy_commands_on_a_v3_daemon_and_quit(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    assert host.out(['get_server_list']).strip() == 'Unknown command "get_server_list"'  # FAKE_MPS_V3_LEGACY_UI=refuse [U]
    v3(host, 'server', 'create', 'training', f'--uid={UID}')
    pid = host.daemon_pid()
    v3(host, '-q')  # -q/--quit: the daemon and all its servers [ref 1.2]
    wait_until(lambda: not os.path.exists(f'/proc/{pid}'), what='daemon exit')


def test_non_owner_is_refused_and_a_client_of_another_user_is_not_permitted(host: SimHost) -> None:
    if UID != 0:
        pytest.skip('needs root to act as another user')
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'mine', '--uid=0')
    other = host.client('--uid', '65534', env=ns_env(host, 'mine'))
    rc, out, _err = other.rest()
    assert rc != 0 and json.loads(out.splitlines()[0])['error'] == 'CUDA_ERROR_NOT_PERMITTED'  # [ref 1.11, DYN]


def test_the_gpu_questions_play_against_the_simulator(tmp_path) -> None:
    """tests/gpu/v3_questions.py, which a run on an r615+ GPU plays against the real binary, stays playable here."""
    script = os.path.join(os.path.dirname(__file__), '..', '..', 'gpu', 'v3_questions.py')
    out = str(tmp_path / 'v3.json')
    proc = subprocess.run([PYTHON, script, '--simulated', '--json', out], capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'SUMMARY: 57 questions, 57 played per side' in proc.stdout
    with open(out, encoding='utf-8') as handle:
        answers = {item['id']: item for item in json.load(handle)['sides']['simulator']}
    assert answers['namespace-set-attached']['rc'] == 1 and answers['procs-after-quit']['data'] == []
    if UID == 0:
        assert answers['mu-client-open']['data']['ok'] and not answers['mu-client-closed']['data']['ok']


def test_deleting_a_namespace_counts_a_client_still_waiting_for_its_server(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3', env={'FAKE_MPS_SERVER_INIT_DELAY': '2'})
    v3(host, 'server', 'create', 'tr', f'--uid={UID}')
    v3(host, 'namespace', 'create', 'hi', '--server=tr')
    waiting = host.client(env=ns_env(host, 'tr', 'hi'))
    wait_until(lambda: host.state()['pending'], what='the client to wait for the starting server')
    refused = v3(host, 'namespace', 'delete', 'hi', '--server=tr', check=False)
    assert refused.returncode == 1 and 'active client' in refused.stdout
    assert v3(host, 'namespace', 'set', 'hi', '--server=tr', '--active-thread-percentage=5', check=False).returncode == 1
    v3(host, 'namespace', 'delete', 'hi', '--server=tr', '--force')
    rc, out, _err = waiting.rest()
    assert rc != 0 and json.loads(out.splitlines()[0])['ok'] is False  # ended, not left hanging
    wait_until(lambda: csv(host, 'server', 'list')[0][3] == 'Ready', what='the server, unharmed')


@pytest.mark.parametrize('text, error', [
    ('[servers.a]\nnamespaces = "x"\n', 'servers.a.namespaces: expected dict'),
    ('[servers.a.namespaces]\nx = 1\n', 'servers.a.namespaces.x: expected a table'),
    ('[servers.a]\nactive_thread_percentage = "abc"\n', "servers.a.active_thread_percentage: Invalid value 'abc'"),
    ('[servers.a]\nactive_thread_percentage = 40\n', 'servers.a.active_thread_percentage: expected a string'),
    ('[servers.a.namespaces.Bad]\nactive_thread_percentage = "40"\n', 'servers.a.namespaces.Bad: a name of lowercase'),
    ('[[servers.a.devices]]\nname = "x"\n', 'servers.a.devices[0]: a table with a uuid is required'),
    ('[features.memacct]\nfoo = true\n', 'features.memacct.foo: unknown key'),
])
def test_a_malformed_config_file_is_refused_not_crashed_on(host: SimHost, text: str, error: str) -> None:
    r615(host)
    path = os.path.join(host.base, 'bad.toml')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(text)
    proc = host.start('-d', '-p', '3', '-a', path, check=False)
    assert proc.returncode == 1 and error in proc.stdout, proc.stdout
    host.start('-d', '-p', '3', '-a', path, env={'FAKE_MPS_V3_CONFIG_ERROR': 'skip'})
    assert csv(host, 'server', 'list') == []  # the table with the error is left out whole: no server with part of its limits


def test_ints_where_strings_are_quoted_are_a_switch(host: SimHost) -> None:
    r615(host)
    path = os.path.join(host.base, 'ints.toml')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(f'[servers.a]\nuid = {UID}\nactive_thread_percentage = 40\n')
    host.start('-d', '-p', '3', '-a', path, env={'FAKE_MPS_V3_CONFIG_INTS': 'accept'})
    assert csv(host, 'namespace', 'list', '--server=a')[0][4] == '40.00'


def test_server_set_refuses_an_unknown_option_and_takes_uid(host: SimHost) -> None:
    r615(host)
    host.start('-d', '-p', '3')
    v3(host, 'server', 'create', 'a', f'--uid={UID}')
    refused = v3(host, 'server', 'set', 'a', '--bogus=1', check=False)
    assert refused.returncode == 1 and "'--bogus'" in refused.stdout
    refused = v3(host, 'namespace', 'set', 'default', '--server=a', '--bogus=1', check=False)
    assert refused.returncode == 1 and "'--bogus'" in refused.stdout
    v3(host, 'server', 'set', 'a', '--locality-domains=false')
    assert csv(host, 'namespace', 'list', '--server=a')[0][3:6] == ['-', '-', '-']
