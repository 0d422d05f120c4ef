# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_host's action plugin: what needs no GPU facts refused on the controller, in the module's words (the role's
``mps_*`` names under its prefix), before the module is sent; everything else run as the normal action runs it."""
from __future__ import annotations

import typing as t
from unittest import mock

import pytest

from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.loader import connection_loader
from ansible.template import Templar

from ansible_collections.gpufleet.mps.plugins.action import mps_host as action

GOOD = {'resources': [{'name': 'train', 'devices': [0], 'replicas': 4}], 'unit_before': ['slurmd.service'], 'unit_after': []}


@pytest.mark.parametrize('args, prefix, param, message', [
    ({'resources': [{'name': 'train', 'device': [0]}]}, '', 'resources[train]', r'^resources\[train\]: unknown key\(s\) device; the keys are name, devices'),
    ({'resources': [{'name': 'train', 'device': [0]}]}, 'mps_', 'mps_resources[train]', r'^mps_resources\[train\]: unknown key\(s\) device'),
    ({'resources': {'name': 'train'}}, 'mps_', 'mps_resources', r'^mps_resources: must be a list of resources'),
    ({'resources': [{'name': 'train', 'pinned_device_mem_limit': '20 GB'}]}, '', 'resources[train].pinned_device_mem_limit', '20 GB'),
    ({'resources': [{'name': 'train', 'replicas': 61}]}, '', 'resources[train].replicas', 'from 1 to 60'),
    ({'unit_before': {'slurmd.service': True}}, 'mps_', 'mps_unit_before', r'^mps_unit_before: must be a list of systemd unit names'),
    ({'unit_after': 'slurmd.service, kubelet.service'}, '', 'unit_after', r"^unit_after: ' kubelet.service' is not a systemd unit name"),
    # the unit order is checked whatever the state; the resources only where they are brought up
    ({'state': 'absent', 'unit_before': ['gpufleet-mps@train.service']}, '', 'unit_before', 'is a unit of this collection'),
])
def test_a_refusal_names_the_option_as_the_user_wrote_it(args, prefix, param, message):
    found = action.refusal(args, prefix)
    assert found is not None and found[0] == param
    assert pytest.importorskip('re').search(message, found[1]), found
    assert 'class' not in found[1]


@pytest.mark.parametrize('args', [
    GOOD,
    {},  # the module's defaults
    # what the module's own argument check converts before its checks: good input to it, so good here
    {'resources': ['name=train']},
    {'resources': [{'name': 123}]},
    {'resources': [{'name': 'a', 'multiuser': 1.0, 'oversubscribe': 'yes'}]},
    {'resources': [{'name': 'a', 'sm_partitions': '8,4,4'}]},
    {'state': 'absent', 'resources': [{'name': 'train', 'device': [0]}]},  # absent takes no list: the module's to say
    {'unit_before': 'slurmd.service,kubelet.service', 'resources': []},
])
def test_what_needs_the_hosts_gpus_or_nothing_passes(args):
    assert action.refusal(args) is None


@pytest.mark.parametrize('value', ['\u00b2', ['\u00b2']])
@pytest.mark.parametrize('key', ['replicas', 'sm_partitions'])
def test_digits_int_cannot_read_are_refused_not_raised(key, value):
    """'²' is a digit to str.isdigit() and no number to int(): a refusal naming the key, never a ValueError."""
    found = action.refusal({'resources': [{'name': 'a', key: value}]})
    assert found is not None and found[0] == 'resources[a].%s' % key


def _plugin(args: t.Dict[str, t.Any], environment: t.Any = None) -> action.ActionModule:
    task = Task()
    task.action = 'gpufleet.mps.mps_host'
    task.args = args
    task.environment = environment
    connection = connection_loader.get('local', PlayContext())
    return action.ActionModule(task, connection, PlayContext(), loader=mock.MagicMock(), templar=Templar(loader=mock.MagicMock()),
                               shared_loader_obj=None)


def test_a_refused_list_fails_the_task_without_sending_the_module():
    plugin = _plugin({'resources': [{'name': 'train', 'replica': 4}]}, environment=[{'GPUFLEET_MPS_OPTION_PREFIX': 'mps_'}])
    with mock.patch.object(plugin, '_execute_module') as execute:
        result = plugin.run(task_vars={})
    execute.assert_not_called()
    assert result['failed'] and not result['changed'] and result['param'] == 'mps_resources[train]'
    assert result['msg'].startswith('mps_resources[train]: unknown key(s) replica; the keys are name, devices')


def test_without_the_prefix_the_refusal_names_the_module_option():
    plugin = _plugin({'resources': [{'name': 'train', 'replica': 4}]})
    with mock.patch.object(plugin, '_execute_module') as execute:
        result = plugin.run(task_vars={})
    execute.assert_not_called()
    assert result['msg'].startswith('resources[train]: unknown key(s) replica')


def test_a_good_list_runs_the_module_once_and_returns_its_result():
    plugin = _plugin(dict(GOOD))
    with mock.patch.object(plugin, '_execute_module', return_value={'changed': False, 'ready': True}) as execute, \
            mock.patch.object(plugin, '_remove_tmp_path') as cleanup:
        result = plugin.run(task_vars={'inventory_hostname': 'gpu01'})
    execute.assert_called_once_with(task_vars={'inventory_hostname': 'gpu01'}, wrap_async=False)
    cleanup.assert_called_once()
    assert result['ready'] is True and not result.get('failed')


def test_an_async_task_runs_the_module_wrapped_and_leaves_its_directory_to_the_executor():
    plugin = _plugin(dict(GOOD))
    plugin._task.async_val = 60
    with mock.patch.object(plugin, '_execute_module', return_value={'ansible_job_id': 'j1', 'started': 1}) as execute, \
            mock.patch.object(plugin, '_remove_tmp_path') as cleanup:
        result = plugin.run(task_vars={})
    execute.assert_called_once_with(task_vars={}, wrap_async=True)
    cleanup.assert_not_called()  # as the normal action: the async wrapper removes it when the job ends
    assert result['ansible_job_id'] == 'j1'
