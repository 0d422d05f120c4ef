# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A v3 resource's record, the file rendered from it, its server's lists parsed, and the live changes decided from them:
pure functions, as tables (issue 43; shared/mps-v3-reference.md 1.3, 1.4, 1.8, 1.9)."""
from __future__ import annotations

import tomllib

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._v3.decide import LiveChange, compare, live_changes
from ansible_collections.gpufleet.mps.plugins.module_utils._v3.readout import V3Readout, parse_clients, parse_mem, parse_namespaces
from ansible_collections.gpufleet.mps.plugins.module_utils._v3.spec import NamespaceLimits, V3Spec, check_name, server_name_for

L = NamespaceLimits
SPEC = V3Spec('train', ('GPU-a', 'GPU-b'), 1000, False, L(50.0, 4096, None),
              (('small', L(20.0, 2048, 1)), ('big', L(80.0, 4096, None))))


def test_the_file_holds_only_the_615_keys_with_their_documented_types():
    data = tomllib.loads(SPEC.toml())
    assert data == {'schema_version': '1.0', 'servers': {'train': {
        'allowed_devices': 'GPU-a,GPU-b', 'uid': 1000, 'active_thread_percentage': '50', 'pinned_memory_limit': '4G',
        'namespaces': {'small': {'active_thread_percentage': '20', 'pinned_memory_limit': '2G', 'client_priority': '1'},
                       'big': {'active_thread_percentage': '80', 'pinned_memory_limit': '4G'}}}}}
    assert V3Spec('s', ('GPU-a',), None, True, L()).toml().count('uid = 0') == 1  # -m: only root owns a server


def test_clients_are_given_the_server_never_the_pipe_directory():
    assert SPEC.client_env({'CUDA_MPS_PIPE_DIRECTORY': '/run/mps/train/pipe', 'CUDA_MPS_LOG_DIRECTORY': '/x'}) == {
        'CUDA_MPS_PIPE_DIRECTORY': '/run/mps/train/pipe/train', 'CUDA_MPS_LOG_DIRECTORY': '/x'}
    view = SPEC.container({'pipe_dir': '/c/train/pipe', 'env': {'CUDA_MPS_PIPE_DIRECTORY': '/c/train/pipe'},
                           'mounts': [{'source': '/run/mps/train/pipe', 'target': '/c/train/pipe'},
                                      {'source': '/dev/shm', 'target': '/dev/shm'}]}, '/run/mps/train/pipe')
    assert view['env']['CUDA_MPS_PIPE_DIRECTORY'] == '/c/train/pipe/train'
    assert view['mounts'][0] == {'source': '/run/mps/train/pipe/train', 'target': '/c/train/pipe/train'}
    # a container held to one namespace mounts only its directory, at the same path [ref 1.9, DYN]
    assert view['namespaces']['small']['mounts'][0] == {'source': '/run/mps/train/pipe/train/small',
                                                        'target': '/c/train/pipe/train/small'}


@pytest.mark.parametrize('name, ok', [('train', True), ('a_1', True), ('x' * 64, True), ('x' * 65, False), ('Train', False),
                                      ('a-b', False), ('', False), (3, False)])
def test_names_follow_the_v3_rule(name, ok):
    if ok:
        assert check_name(name, 'p', 'the name') == name
    else:
        with pytest.raises(InvalidParameterError, match='MPS v3 takes'):
            check_name(name, 'p', 'the name')


def test_a_resource_name_maps_to_a_server_name():
    assert server_name_for('nvidia.com/gpu') == 'nvidia_com_gpu' and server_name_for('Train-1') == 'train_1'


@pytest.mark.parametrize('text, mib', [('20G', (20480, True)), ('512M', (512, True)), ('1024K', (1, True)), ('-', (None, True)),
                                       ('', (None, True)), ('4GiB', (4096, True)), ('lots', (None, False))])
def test_listed_sizes(text, mib):
    assert parse_mem(text) == mib


def test_the_lists_are_read_quoted_or_not():
    text = ('default,train,Ready,4G,50.00,-,/p/train\n'
            'small,train,Ready,2G,20.00,1,/p/train/small\n'
            'other,elsewhere,Ready,-,-,-,/p/elsewhere/other\n'
            'odd,train,Ready,much,20.00,0,/p/train/odd\n')
    status, found, unreadable = parse_namespaces('train', text)
    assert status == 'Ready' and set(found) == {'default', 'small', 'odd'} and unreadable == ('odd',)
    assert found['small'] == L(20.0, 2048, 1) and found['default'] == L(50.0, 4096, None)
    assert parse_clients('train', '51023,train,"0,1",default,python a.py\n51087,train,0;1,small,b, with comma\nx,train,0,y,z\n') == (
        (51023, 'default'), (51087, 'small'))


@pytest.mark.parametrize('want, have, how', [
    (L(50.0), L(50.0), ''), (L(50.0), L(50.004), ''), (L(50.0), L(60.0), 'set'), (L(50.0, 10), L(50.0), 'set'),
    (L(50.0), L(50.0, 10), 'unset'), (L(None, None, 1), L(None, None, 0), 'set'), (L(), L(None, None, 1), 'unset'),
    # printed forms of no limit [U]: 100 %, 0 MiB, priority 0 (normal) are none - never a restart for how it is printed
    (L(), L(100.0, 0, 0), ''), (L(100.0), L(), ''), (L(None, None, 0), L(), ''),
])
def test_compare(want, have, how):
    assert compare(want, have) == how


def test_limits_that_could_not_be_read_are_set_again_never_dropped():
    assert compare(L(50.0), L(), unreadable=True) == 'set' and compare(L(), L(), unreadable=True) == ''
    changes, why = live_changes(SPEC, _seen([('default', L(50.0, 4096)), ('small', L(20.0, 2048, 1)), ('big', L())],
                                            unreadable=['big']))
    assert why == '' and [(c.verb, c.namespace) for c in changes] == [('set', 'big')]
    status, found, unreadable = parse_namespaces('train', 'default,train,Ready,-,100.00,normal,/p\nsmall,train,Ready,-,-,below_normal,/p/s\n')
    assert unreadable == () and found['default'].client_priority == 0 and found['small'].client_priority == 1


def _seen(namespaces, clients=(), unreadable=()):
    return V3Readout('train', found=True, status='Ready', namespaces=dict(namespaces), unreadable=tuple(unreadable),
                     clients=tuple(clients))


def test_as_wanted_is_nothing():
    assert live_changes(SPEC, _seen([('default', L(50.0, 4096)), ('small', L(20.0, 2048, 1)), ('big', L(80.0, 4096))])) == ([], '')


def test_each_change_is_typed_ordered_and_names_the_clients_it_touches():
    changes, why = live_changes(SPEC, _seen([('default', L(40.0, 4096)), ('big', L(80.0)), ('old', L(10.0))],
                                            clients=[(7, 'old'), (8, 'default')]))
    assert why == ''
    assert [(c.verb, c.namespace, c.attached) for c in changes] == [
        ('set', 'default', (8,)), ('create', 'small', ()), ('set', 'big', ()), ('delete', 'old', (7,))]
    assert changes[0].commands('train', force=False) == [['server', 'set', 'train', '--active-thread-percentage=50',
                                                          '--pinned-memory-limit=4G']]
    assert changes[1].commands('train', force=False) == [
        ['namespace', 'create', 'small', '--server=train'],
        ['namespace', 'set', 'small', '--server=train', '--active-thread-percentage=20', '--pinned-memory-limit=2G',
         '--client-priority=1']]
    assert changes[3].commands('train', force=True) == [['namespace', 'delete', 'old', '--server=train', '--force']]
    assert changes[3].touches_clients and not changes[1].touches_clients


def test_a_dropped_limit_makes_a_namespace_anew_and_restarts_for_the_default():
    changes, why = live_changes(SPEC, _seen([('default', L(50.0, 4096)), ('small', L(20.0, 2048, 1)), ('big', L(80.0, 4096, 1))]))
    assert why == '' and [(c.verb, c.namespace) for c in changes] == [('recreate', 'big')]
    assert changes[0].commands('train', force=False)[0] == ['namespace', 'delete', 'big', '--server=train']
    changes, why = live_changes(SPEC, _seen([('default', L(50.0, 4096, 1))]))
    assert changes == [] and 'only dropped by a new start' in why


def test_a_server_not_listed_is_a_restart():
    changes, why = live_changes(SPEC, V3Readout('train', found=False))
    assert changes == [] and 'not in the daemon\'s lists' in why


def test_describe():
    change = LiveChange('set', 'big', L(60.0), (), L(80.0))
    assert change.describe('train') == 'set namespace big of server train: active-thread-percentage=60 (was active-thread-percentage=80)'
