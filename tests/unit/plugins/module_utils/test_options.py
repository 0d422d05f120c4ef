# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every shared option is declared once (_options.py): the modules take it from there, and the role agrees with it."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.mps.plugins.module_utils._options import OPTIONS, spec

COLLECTION = Path(__file__).resolve().parents[4]
MODULES = ('mps_daemon', 'mps_host', 'mps_info', 'mps_limits', 'mps_shm')
# Role variables that are no mps_host option of the same name, or that the role passes otherwise, with the reason.
ROLE_ONLY = {
    'resources': 'the role validates the list itself (mps_check) and passes it as resources',
    'state': 'the same choices under another name: the role passes it as state',
}


def _argument_spec(module):
    return importlib.import_module('ansible_collections.gpufleet.mps.plugins.modules.%s' % module).argument_spec()


@pytest.mark.parametrize('module', MODULES)
def test_every_module_takes_the_shared_options_as_declared_once(module):
    argument_spec = _argument_spec(module)
    shared = {name: value for name, value in argument_spec.items() if name in OPTIONS}
    assert shared == {name: OPTIONS[name] for name in shared}
    for value in argument_spec.values():
        for name, sub in (value.get('options') or {}).items():
            assert name not in OPTIONS or sub == OPTIONS[name], name


def test_an_option_declared_twice_is_refused():
    with pytest.raises(ValueError, match='busy is a shared option'):
        spec('root', busy=dict(type='str'))


def test_the_roles_variables_agree_with_mps_host():
    host = _argument_spec('mps_host')
    role = yaml.safe_load((COLLECTION / 'roles' / 'fleet' / 'meta' / 'argument_specs.yml').read_text())['argument_specs']['main']['options']
    defaults = yaml.safe_load((COLLECTION / 'roles' / 'fleet' / 'defaults' / 'main.yml').read_text())
    compared = []
    for variable, option in role.items():
        name = variable[len('mps_'):]
        if name not in host or name in ROLE_ONLY:
            continue
        compared.append(name)
        module = host[name]
        assert option.get('choices') == module.get('choices'), name
        # An unset path is '' in the role (passed as default(omit, true)) and None in the module.
        unset = {'', None}
        assert option.get('default') == module.get('default') or {option.get('default'), module.get('default')} <= unset, name
        assert defaults.get(variable) == module.get('default') or {defaults.get(variable), module.get('default')} <= unset, name
    assert len(compared) >= 25, compared  # every option the role passes through
