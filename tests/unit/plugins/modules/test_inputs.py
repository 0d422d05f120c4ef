# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Inputs the modules accepted and should not, and errors that named the wrong option (issue 41), each through the
module as Ansible runs it (``host``): refused before any change - nothing created, not even a lock file - naming the
option or the entry the user wrote, with the form that is valid."""
from __future__ import annotations

import os

import pytest


def created(host):
    """Every path under the host's root and config directory (a refusal leaves none)."""
    found = []
    for top in (host.root, host.etc, host.facts):
        for dirpath, dirnames, filenames in os.walk(top):
            found.extend(os.path.join(dirpath, name) for name in dirnames + filenames)
        if os.path.exists(top):
            found.append(top)
    return sorted(found)


def refused(result, param, *words):
    assert result.get('failed'), result
    assert result.get('param') == param, (result.get('param'), result['msg'])
    assert result['msg'].startswith(param + ': '), result['msg']
    for word in words:
        assert word in result['msg'], result['msg']
    assert 'class' not in result['msg'], result['msg']


TRAIN = [{'name': 'train', 'devices': [0], 'replicas': 2}]


@pytest.mark.parametrize('options', [dict(supervisor='none'), dict(health_check=False)], ids=['supervisor-none', 'no-health-check'])
def test_metrics_dir_where_no_health_check_would_write_it_is_refused(host, options):
    result = host.run(TRAIN, metrics_dir=str(host.base / 'metrics'), **options)
    refused(result, 'metrics_dir', 'health check')
    assert created(host) == []


@pytest.mark.parametrize('param', ['local_facts_dir', 'slurm_task_prolog', 'slurm_gres_conf', 'logrotate_dir'])
def test_a_relative_path_is_refused_before_anything_is_written(host, param):
    options = dict(slurm_hook=True) if param.startswith('slurm') else {}
    result = host.run(TRAIN, **dict(options, **{param: 'relative/file'}))
    refused(result, param, "'relative/file'", 'absolute')
    assert created(host) == []
    assert not os.path.exists(host.base / 'relative')


def test_mps_info_slices_above_the_gpus_client_cap_is_refused_as_replicas_is(host):
    host.ok(TRAIN)
    info = host.module('mps_info', name='train', slices=49)
    refused(info, 'slices', '48 MPS clients of GPU 0')
    assert host.module('mps_info', name='train', slices=48)['daemons'][0]['container']['slice']['slices'] == 48


def test_a_percentage_the_daemon_stores_as_zero_is_refused_naming_the_smallest_it_keeps(host):
    result = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': '0.001'}])
    refused(result, 'resources[train].active_thread_percentage', '0.1')
    assert created(host) == []
    limits = host.module('mps_limits', name='train', active_thread_percentage=0.01, create=True)
    refused(limits, 'active_thread_percentage', '0.1')


@pytest.mark.parametrize('replicas', ['4', {'default': '4'}], ids=['string', 'mapping'])
def test_a_replica_count_given_as_a_string_is_a_number_as_a_percentage_is(host, replicas):
    result = host.ok([{'name': 'train', 'devices': [0], 'replicas': replicas}])
    assert result['resources'][0]['limits']['persisted']['active_thread_percentage'] == 25.0
    checked = host.run([{'name': 'train', 'devices': [0], 'replicas': 'four'}])
    refused(checked, 'resources[train].replicas', "'four'")


def test_sm_partitions_on_a_binary_without_them_is_refused_before_the_lock_naming_the_binary_it_needs(host):
    limits = host.module('mps_limits', name='train', sm_partitions=[8], create=True)
    refused(limits, 'sm_partitions', '13010')
    assert 'r580 is 13000' not in limits['msg']
    assert created(host) == []


def test_sm_partitions_refused_in_a_resource_names_the_entry(host):
    result = host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [8]}])
    refused(result, 'resources[train].sm_partitions', '13010')
    assert 'r580 is 13000' not in result['msg']


def test_a_resource_name_too_long_for_a_pipe_directory_is_blamed_on_the_name(host):
    name = 'x' * 200
    result = host.run([{'name': name, 'devices': [0]}])
    refused(result, 'resources[%s].name' % name, 'shorter')
    daemon = host.module('mps_daemon', name=name, devices=[0])
    refused(daemon, 'name', 'shorter')
    assert created(host) == []


def test_a_root_too_long_for_a_pipe_directory_is_still_blamed_on_the_root(host):
    host.args['root'] = str(host.base / ('r' * 90))
    result = host.run([{'name': 't', 'devices': [0]}])
    refused(result, 'root', 'shorter root')


@pytest.mark.parametrize('param,value,words', [
    ('logrotate_rotate', -1, ['-1', 'at least 0']),
    ('logrotate_size', '50 apples', ['50 apples']),
    ('health_timeout', 0, ['at least 1']),
    ('health_interval', 2, ['at least 5']),
])
def test_a_bad_host_option_is_blamed_on_itself(host, param, value, words):
    result = host.run(TRAIN, **{param: value})
    refused(result, param, *words)
    assert created(host) == []


@pytest.mark.parametrize('resources,param,words', [
    (['train'], 'resources[0]', ["must be a mapping", "'train'"]),
    ([{'name': 'a', 'devices': [0]}, 3], 'resources[1]', ['must be a mapping', 'a number 3']),
    ({'name': 'train'}, 'resources', ['must be a list of mappings', 'got a mapping']),
], ids=['string', 'number', 'mapping'])
def test_a_resource_list_of_the_wrong_shape_names_the_entry_in_yaml_words(host, resources, param, words):
    result = host.run(resources)
    refused(result, param, *words)
    assert 'dictionary requested' not in result['msg'] and 'convert' not in result['msg']
    assert created(host) == []


def test_run_by_the_role_a_refusal_names_the_roles_variable(host, monkeypatch):
    # The fleet role's mps_host task sets GPUFLEET_MPS_OPTION_PREFIX=mps_ (roles/fleet/tasks/host.yml).
    monkeypatch.setenv('GPUFLEET_MPS_OPTION_PREFIX', 'mps_')
    refused(host.run(TRAIN, logrotate_rotate=-1), 'mps_logrotate_rotate', 'at least 0')
    refused(host.run([{'name': 'train', 'devices': [0], 'replicas': 'four'}]), 'mps_resources[train].replicas', "'four'")
    refused(host.run(['train']), 'mps_resources[0]', 'must be a mapping')
    monkeypatch.delenv('GPUFLEET_MPS_OPTION_PREFIX')
    refused(host.run(TRAIN, logrotate_rotate=-1), 'logrotate_rotate', 'at least 0')


def test_mps_limits_record_is_the_option_persist_was_and_the_old_name_is_deprecated(host):
    host.ok(TRAIN)
    new = host.module('mps_limits', name='train', active_thread_percentage=40, record=False)
    assert new['applied'] and not new['persisted'] and not new.get('deprecations')
    old = host.module('mps_limits', name='train', active_thread_percentage=30, persist=False)
    assert old['applied'] and not old['persisted']
    assert 'persist' in str(old['deprecations'])


def test_a_bad_entry_is_named_before_a_shm_option_this_host_cannot_honour(host):
    """The entries are checked first, then the options of the shared tmpfs (under the host lock): a run with both wrong
    names the entry, as it always did (a refactor had moved the tmpfs's checks first)."""
    result = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 150}], shm=True, shm_persist='systemd')
    refused(result, 'resources[train].active_thread_percentage')
    assert created(host) == []
    result = host.run(TRAIN, shm=True, shm_persist='systemd')
    refused(result, 'shm_persist', 'systemd was asked for')
    assert created(host) == []
