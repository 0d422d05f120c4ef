# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A ``protocol: 3`` resource through mps_host on the simulated r615 host (issue 43): provisioned with two namespaces,
clients held to each namespace's limits through the published environment, a namespace changed live beside an attached
client, the same change refused under busy=refuse where its own client is attached, a restart and a simulated reboot
bringing the namespaces back, teardown leaving nothing - check mode first at each step, equal to what apply did.

Everything v3 the simulator does is inferred from NVIDIA's pages (tests/fakes/mps/mps_v3.py); no r615 GPU ran this."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest


UID = os.geteuid()


def entry(**more):
    found = {'name': 'train', 'devices': [0], 'protocol': '3', 'uid': UID, 'active_thread_percentage': 50,
             'namespaces': [{'name': 'small', 'active_thread_percentage': 20, 'pinned_device_mem_limit': '2G'},
                            {'name': 'big', 'active_thread_percentage': 80}]}
    found.update(more)
    return found


def client_at(host, pipe_dir, **env):
    """A simulated CUDA client with CUDA_MPS_PIPE_DIRECTORY=pipe_dir: (process, what it reported)."""
    proc = subprocess.Popen([os.path.join(host.bin, 'mps-sim-client')],  # pylint: disable=consider-using-with
                            env=dict({k: v for k, v in os.environ.items() if not k.startswith('CUDA_MPS_')},
                                     CUDA_MPS_PIPE_DIRECTORY=pipe_dir, **env),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    host.clients.append(proc)
    info = json.loads(proc.stdout.readline())
    assert info['ok'], info
    return proc, info


def namespaces(host, server='train'):
    out = subprocess.run([host.binary, 'namespace', 'list', '--server=%s' % server, '--format=csv,noheader'], check=True,
                         env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=host.pipe('train')), capture_output=True, text=True).stdout
    return {row.split(',')[0]: row.split(',')[3:6] for row in out.splitlines() if row}


def twice(host, resources, **options):
    """Check mode, then the run: the plan check mode returned is what the run did."""
    planned = host.run(resources, check=True, **options)
    applied = host.run(resources, **options)
    assert not planned.get('failed') and not applied.get('failed'), (planned, applied)
    assert planned['changed'] == applied['changed'] and planned['actions'] == applied['actions'], (planned, applied)
    return applied


def test_a_v3_resource_end_to_end(host, r615):
    r615()
    result = twice(host, [entry()])
    assert result['changed'] and any('MPS v3, server train' in action for action in result['actions']), result['actions']
    res = result['resources'][0]
    server_dir = os.path.join(host.pipe('train'), 'train')
    assert res['env']['CUDA_MPS_PIPE_DIRECTORY'] == server_dir  # never <pipe>: its main socket routes to uid_<uid>
    assert res['protocol'] == '3' and [ns['name'] for ns in res['v3']['namespaces']] == ['small', 'big']
    assert namespaces(host) == {'default': ['-', '50.00', '-'], 'small': ['2G', '20.00', '-'], 'big': ['-', '80.00', '-']}
    # the published environment lands in the named server; each namespace's client gets its limits
    default = client_at(host, server_dir)[1]
    assert (default['server'], default['namespace'], default['active_thread_percentage']) == ('train', 'default', 50.0)
    small_proc, small = client_at(host, os.path.join(server_dir, 'small'))
    assert small['active_thread_percentage'] == 20.0 and set(small['pinned_mem_limit_mib'].values()) == {2048}
    big = client_at(host, os.path.join(server_dir, 'big'))[1]
    assert big['active_thread_percentage'] == 80.0
    pid = list(host.daemons())[0]
    again = twice(host, [entry()])
    assert not again['changed'] and list(host.daemons()) == [pid]

    # big changed live while small has a client: no restart, the small client undisturbed
    changed = entry(namespaces=[{'name': 'small', 'active_thread_percentage': 20, 'pinned_device_mem_limit': '2G'},
                                {'name': 'big', 'active_thread_percentage': 60}])
    # ... but big has a client too: refused under busy=refuse, nothing done
    refused = host.run([changed])
    assert refused.get('failed') and 'busy' in refused['msg'] and 'namespace big' in refused['msg'], refused
    assert namespaces(host)['big'] == ['-', '80.00', '-']
    for proc in host.clients[1:]:
        if proc is not small_proc:
            host.leave(proc)
    host.clients = [proc for proc in host.clients if proc.poll() is None]
    result = twice(host, [changed])
    assert result['changed'] and list(host.daemons()) == [pid], result['actions']
    assert namespaces(host)['big'] == ['-', '60.00', '-'] and small_proc.poll() is None
    big = client_at(host, os.path.join(server_dir, 'big'))[1]
    assert big['active_thread_percentage'] == 60.0
    with open(os.path.join(host.etc, 'train.mps.toml'), encoding='utf-8') as handle:
        assert 'active_thread_percentage = "60"' in handle.read()  # MPS keeps no CLI change: the file holds it

    # a namespace removed from the list is deleted; one added is created
    host.leave(small_proc)
    host.clients = [proc for proc in host.clients if proc.poll() is None]
    for proc in list(host.clients):
        host.leave(proc)
    host.clients = []
    later = entry(namespaces=[{'name': 'eval', 'client_priority': 'below_normal'}])
    result = twice(host, [later])
    assert list(host.daemons()) == [pid] and set(namespaces(host)) == {'default', 'eval'}
    assert namespaces(host)['eval'] == ['-', '50.00', '1']  # the resource's limits unless given: never the whole GPU

    # a restart and a simulated reboot bring the namespaces back from the file
    os.kill(pid, 9)
    _wait_gone(pid)
    recovered = twice(host, [later])
    assert recovered['changed'] and set(namespaces(host)) == {'default', 'eval'}
    assert namespaces(host)['eval'] == ['-', '50.00', '1']

    # teardown leaves nothing
    down = twice(host, [], state='absent')
    assert down['changed'] and not host.daemons()
    assert not os.path.exists(os.path.join(host.etc, 'train.mps.toml'))
    left = sorted(os.path.relpath(os.path.join(top, name), host.root) for top, dirs, files in os.walk(host.root) for name in dirs + files)
    assert left == ['train', 'train/log', 'train/log/control.log', 'train/log/server.log'], (left, down.get('warnings'))  # logs stay


def _wait_gone(pid):
    import time
    deadline = time.monotonic() + 10
    while os.path.exists('/proc/%d' % pid) and time.monotonic() < deadline:
        with open('/proc/%d/stat' % pid, encoding='utf-8') as handle:
            if handle.read().split(') ', 1)[1].startswith('Z'):
                break
        time.sleep(0.05)


@pytest.mark.parametrize('bad, param, words', [
    ({'uid': None, 'multiuser': False}, 'resources[train].uid', 'serves only its owner'),
    ({'server': 'Train'}, 'resources[train].server', 'MPS v3 takes'),
    ({'server': 'uid_0'}, 'resources[train].server', 'automatic server'),
    ({'sm_partitions': [8]}, 'resources[train].sm_partitions', 'protocol: 3'),
    ({'namespaces': [{'name': 'Big'}]}, 'resources[train].namespaces[0].name', 'MPS v3 takes'),
    ({'namespaces': [{'name': 'default'}]}, 'resources[train].namespaces[0].name', 'own namespace'),
    ({'namespaces': [{'name': 'a'}, {'name': 'a'}]}, 'resources[train].namespaces', 'listed twice'),
    ({'protocol': 'legacy'}, 'resources[train].uid', 'needs protocol: 3'),
])
def test_refusals_before_any_change(host, r615, bad, param, words):
    r615()
    result = host.run([entry(**bad)])
    assert result.get('failed') and not result.get('changed'), result
    assert param in result['msg'] and words in result['msg'], result['msg']
    assert not host.daemons() and not os.path.exists(os.path.join(host.root, 'train'))


def test_v3_refused_where_the_binary_has_none(host):
    result = host.run([entry()])  # the simulated host's default binary is r580's
    assert result.get('failed') and not result.get('changed'), result
    assert 'resources[train].protocol' in result['msg'] and 'no MPS v3' in result['msg'], result['msg']
    assert not host.daemons()


def test_a_colliding_server_name_is_refused(host, r615):
    r615()
    result = host.run([entry(), dict(entry(name='other', devices=[1]), server='train')])
    assert result.get('failed') and 'resources[other].server' in result['msg'] and "'train'" in result['msg'], result['msg']
    assert not host.daemons()


def test_the_other_modules_face_a_v3_resource(host, r615):
    """mps_info reports the server, its namespaces and whose each client is; mps_limits and mps_daemon (which manage legacy
    daemons) refuse to start or change it; mps_daemon state=absent stops it with -q and restores the GPU."""
    r615()
    host.ok([entry()])
    pid = list(host.daemons())[0]
    server_dir = os.path.join(host.pipe('train'), 'train')
    client_at(host, os.path.join(server_dir, 'small'))
    info = host.module('mps_info', gather=['daemons', 'servers'])
    daemon = [d for d in info['daemons'] if d['name'] == 'train'][0]
    assert daemon['protocol'] == 3 and daemon['healthy'] and not daemon.get('error'), daemon
    assert daemon['v3']['server'] == 'train' and daemon['v3']['pipe_directory'] == server_dir
    assert daemon['v3']['namespaces']['small'] == {'active_thread_percentage': 20.0, 'pinned_device_mem_limit_mib': 2048,
                                                   'client_priority': None}
    assert [(c['namespace'], c['owner']) for c in daemon['v3']['clients']] == [('small', daemon['v3']['clients'][0]['owner'])]
    assert daemon['clients_by_owner']
    limits = host.module('mps_limits', name='train', active_thread_percentage=30)
    assert limits.get('failed') and 'runs MPS v3' in limits['msg'] and 'mps_host' in limits['msg'], limits
    started = host.module('mps_daemon', name='train', devices=[0])
    assert started.get('failed') and 'runs MPS v3' in started['msg'] and list(host.daemons()) == [pid], started
    for proc in host.clients:
        host.leave(proc)
    host.clients = []
    stopped = host.module('mps_daemon', name='train', state='absent')
    assert not stopped.get('failed') and stopped['changed'] and not host.daemons(), stopped
    assert host.compute_modes()[0] == 0  # DEFAULT again


def test_switching_protocols_restarts_and_leaves_no_file_of_the_other(host, r615):
    r615()
    host.ok([{'name': 'train', 'devices': [0], 'active_thread_percentage': 40}])
    legacy = list(host.daemons())[0]
    assert os.path.exists(os.path.join(host.etc, 'train.limits.json'))
    result = twice(host, [entry()])
    assert result['resources'][0]['restarted'] and list(host.daemons()) != [legacy], result['actions']
    assert not any(os.path.exists(os.path.join(host.etc, 'train' + suffix)) for suffix in ('.limits.json', '.limits', '.limits-env'))
    assert namespaces(host)['default'] == ['-', '50.00', '-']
    back = twice(host, [{'name': 'train', 'devices': [0], 'active_thread_percentage': 40}])
    assert back['resources'][0]['restarted'] and not os.path.exists(os.path.join(host.etc, 'train.mps.toml')), back['actions']
    again = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 40}])
    assert not again['changed'], again['actions']


def test_a_lost_record_a_crash_and_empty_v3_keys(host, r615):
    """Found by review: a v3 daemon whose start record is gone (/run emptied at a boot while systemd started it again, or
    a start that failed after it came up) is still the resource's own and read with v3 words, not refused; after a crash
    state=absent leaves none of the server's directories; an empty namespaces list is no request for v3."""
    r615()
    host.ok([entry()])
    pid = list(host.daemons())[0]
    os.unlink(os.path.join(host.root, 'train', '.started'))
    result = twice(host, [entry()])  # supervisor=none: without a record the daemon is restarted, never refused
    assert result['resources'][0]['restarted'] and 'no .started record' in ' '.join(result['actions']), result['actions']
    assert list(host.daemons()) != [pid] and set(namespaces(host)) == {'default', 'small', 'big'}
    crashed = list(host.daemons())[0]
    os.kill(crashed, 9)
    _wait_gone(crashed)
    down = twice(host, [], state='absent')
    assert down['changed'] and not os.path.exists(host.pipe('train')), os.listdir(host.pipe('train'))
    legacy = host.ok([{'name': 'train', 'devices': [0], 'namespaces': [], 'active_thread_percentage': 40}])
    assert legacy['resources'][0]['protocol'] == 'legacy'
    assert legacy['resources'][0]['env']['CUDA_MPS_PIPE_DIRECTORY'] == host.pipe('train')


def test_a_thread_percentage_v3_refuses_is_refused_first(host, r615):
    r615()
    for bad, param in ((entry(active_thread_percentage=0.5, namespaces=[]), 'resources[train].active_thread_percentage'),
                       (entry(namespaces=[{'name': 'tiny', 'active_thread_percentage': 0.5}]),
                        'resources[train].namespaces[tiny].active_thread_percentage')):
        result = host.run([bad])
        assert result.get('failed') and not result.get('changed') and param in result['msg'], result
        assert 'from 1 to 100' in result['msg'] and not host.daemons()
        assert not os.path.exists(os.path.join(host.etc, 'train.mps.toml'))


def test_the_hosts_protocol_is_that_of_every_entry_that_gives_none(host, r615):
    """mps_host's protocol (the fleet role's mps_protocol) for the entries without their own; an entry's own wins."""
    r615()
    bare = {key: value for key, value in entry().items() if key != 'protocol'}
    result = host.ok([bare, {'name': 'old', 'devices': [1], 'protocol': 'legacy'}], protocol='3')
    assert [res['protocol'] for res in result['resources']] == ['3', 'legacy'], result['resources']
    assert result['resources'][0]['env']['CUDA_MPS_PIPE_DIRECTORY'] == os.path.join(host.pipe('train'), 'train')
    refused = host.run([{'name': 'train', 'devices': [0]}], protocol='3')  # v3 without uid or multiuser
    assert refused.get('failed') and 'resources[train].uid' in refused['msg'], refused


def test_a_mig_device_is_refused_with_v3(host, r615):
    """How v3 servers map onto MIG instances is unknown (mps-v3-reference 1.11): refused, naming the device."""
    shipped = Path(__file__).resolve().parents[3] / 'fakes' / 'nvml' / 'configs' / 'h100x1-mig.ini'
    with open(os.environ['FAKE_NVML_CONFIG'], 'w', encoding='utf-8') as handle:
        handle.write(shipped.read_text(encoding='utf-8'))
    r615()
    result = host.run([entry(devices=['0:0'], namespaces=[])])
    assert result.get('failed') and not result.get('changed'), result
    assert 'resources[train].devices' in result['msg'] and 'MIG device' in result['msg'], result['msg']
    assert not host.daemons()


def test_without_its_record_a_v3_daemon_named_by_its_environment_file_is_still_v3(host, r615):
    """Found by review: /run lost the record at a boot while systemd started the daemon again from its environment file
    (MPS_V3_SERVER names its server). mps_daemon still refuses to start or restart it as a legacy daemon, and mps_host
    switching the resource to the legacy protocol restarts it as such - never a legacy word to the v3 daemon."""
    r615()
    host.ok([entry()])
    pid = list(host.daemons())[0]
    os.unlink(os.path.join(host.root, 'train', '.started'))
    with open(os.path.join(host.etc, 'train.env'), 'w', encoding='utf-8') as handle:  # as the systemd unit's file has it
        handle.write('# test\nCUDA_MPS_PIPE_DIRECTORY=%s\nMPS_V3_SERVER=train\n' % host.pipe('train'))
    started = host.module('mps_daemon', name='train', devices=[0], check=True)
    assert started.get('failed') and 'runs MPS v3 (server train)' in started['msg'] and list(host.daemons()) == [pid], started
    legacy = [{'name': 'train', 'devices': [0], 'active_thread_percentage': 40}]
    result = twice(host, legacy)
    assert result['resources'][0]['restarted'] and list(host.daemons()) != [pid], result['actions']
    assert not os.path.exists(os.path.join(host.etc, 'train.mps.toml')) and not os.path.exists(os.path.join(host.pipe('train'), 'train'))


@pytest.mark.parametrize('busy', ['refuse', 'terminate'])
def test_a_v3_daemon_with_clients_is_stopped_as_busy_says(host, warnings, r615, busy):
    """A teardown with a client attached: refused, or - busy=terminate - its server deleted with --force first (which
    ends its clients [mps-v3-reference 1.3]; what -q does to attached clients is unknown), then -q."""
    r615()
    host.ok([entry()])
    proc, _info = client_at(host, os.path.join(host.pipe('train'), 'train', 'small'))
    result = host.run([], state='absent', busy=busy)
    if busy == 'refuse':
        assert result.get('failed') and 'busy' in result['msg'] and host.daemons(), result
        return
    assert not result.get('failed') and not host.daemons(), result
    assert any('ends its 1 connected client(s)' in warning for warning in warnings(result)), warnings(result)
    host.leave(proc)
