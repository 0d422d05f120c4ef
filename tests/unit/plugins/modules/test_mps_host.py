# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_host's argument errors: AnsibleModule's own sub-option errors name the resource entry, as the plan's errors do."""
from __future__ import annotations

import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.mps.plugins.module_utils._module import entry_error
from ansible_collections.gpufleet.mps.plugins.modules import mps_host


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            mps_host.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize('resources, param, words', [
    ([{'name': 'train', 'devices': [0]}, {'name': 'infer', 'multiuser': 'maybe'}], 'resources[infer].multiuser', 'bool'),
    ([{'name': 'train', 'devices': [0], 'replica': 4}], 'resources[train]', 'unknown key(s) replica; the keys are '),
    ([{'name': 'train'}, {'devices': [1]}], 'resources[1].name', 'missing required arguments: name'),
    ([{'multiuser': 'maybe'}], 'resources[0].multiuser', 'bool'),
])
def test_an_entry_error_of_ansiblemodule_names_the_entry_and_key(resources, param, words, capsys, tmp_path):
    root = tmp_path / 'root'
    result = run_module({'resources': resources, 'root': str(root), 'config_dir': str(tmp_path / 'etc')}, capsys)
    assert result['failed']
    assert result['msg'].startswith(param + ': '), result['msg']
    assert words in result['msg']
    assert result['param'] == param
    assert not root.exists()


def test_an_error_outside_the_list_keeps_ansiblemodule_s_message(capsys, tmp_path):
    result = run_module({'resources': [{'name': 'train'}], 'state': 'sideways', 'root': str(tmp_path / 'root')}, capsys)
    assert result['failed'] and 'state' in result['msg'] and 'resources[' not in result['msg']


def test_entry_error_is_none_for_valid_entries():
    spec = mps_host.argument_spec()
    assert entry_error(spec, {'resources': [{'name': 'a', 'devices': [0], 'multiuser': True}]}) is None
    # called only when AnsibleModule refused the arguments: a string where the list belongs is then said in words
    assert entry_error(spec, {'resources': 'not a list'}) == ('resources', 'must be a list of mappings, one per entry; got a string')
