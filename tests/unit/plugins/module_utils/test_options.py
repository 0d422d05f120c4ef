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


# --- described once: the doc fragments, the modules' own DOCUMENTATION, the role's argument spec -------------------
FRAGMENTS = COLLECTION / 'plugins' / 'doc_fragments' / '_common.py'
# Shared options taken at the top level by one module and as a key of mps_host's resources: described by that module,
# the entry's key referring to it.
ENTRY_DOCUMENTED_BY = {'devices': 'mps_daemon', 'multiuser': 'mps_daemon', 'active_thread_percentage': 'mps_limits',
                       'pinned_device_mem_limit': 'mps_limits', 'replicas': 'mps_limits', 'oversubscribe': 'mps_limits',
                       'client_priority': 'mps_limits', 'sm_partitions': 'mps_limits', 'protocol': 'mps_host'}
# Shared keys only an entry of mps_host's resources takes (MPS v3): described there, as the entry's suboptions.
ENTRY_ONLY = ('server', 'uid', 'namespaces')


# A module's own option of a name a fragment describes, with the reason it means something else there.
OWN_MEANING = {('mps_info', 'name'): 'optional: only that resource is reported (the fragment\'s is required)'}


def _fragments():
    """Each group of the doc fragment (gpufleet.mps._common[.group]) -> its options."""
    import ast  # pylint: disable=import-outside-toplevel
    groups = {}
    for node in ast.walk(ast.parse(FRAGMENTS.read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            name = node.targets[0].id
            key = 'gpufleet.mps._common' + ('' if name == 'DOCUMENTATION' else '.' + name.lower())
            groups[key] = yaml.safe_load(node.value.value).get('options', {})
    return groups


def _documentation(module):
    doc = importlib.import_module('ansible_collections.gpufleet.mps.plugins.modules.%s' % module).DOCUMENTATION
    return yaml.safe_load(doc)


def _declared(doc):
    return {key: doc[key] for key in ('type', 'default', 'choices', 'elements', 'required') if key in doc}


def _expected(option):
    declared = dict(option)
    declared.pop('options', None)
    return declared


def test_every_shared_option_is_described_in_one_place_with_its_declared_type():
    described = {}
    for group, options in _fragments().items():
        for name, doc in options.items():
            assert name not in described, '%s is described in %s and %s' % (name, described.get(name), group)
            described[name] = group
            if name in OPTIONS:
                assert _declared(doc) == _expected(OPTIONS[name]), (group, name)
    for module in MODULES:
        own = _documentation(module)['options']
        for name in own:
            if (module, name) in OWN_MEANING:
                continue
            assert name not in described, '%s describes %s, which %s describes' % (module, name, described[name])
            if name in OPTIONS:
                assert ENTRY_DOCUMENTED_BY.get(name) == module, '%s describes the shared option %s itself' % (module, name)
                described[name] = module
                assert _declared(own[name]) == _expected(OPTIONS[name]), (module, name)
    entry = _documentation('mps_host')['options']['resources']['suboptions']
    for name in ENTRY_ONLY:
        assert name not in described, '%s is an entry\'s own key, described elsewhere too' % name
        described[name] = 'mps_host resources[]'
        assert _declared(entry[name]) == _expected(OPTIONS[name]), name
        for key, sub_doc in OPTIONS[name].get('options', {}).items():
            assert _declared(entry[name]['suboptions'][key]) == sub_doc, (name, key)
    assert sorted(set(OPTIONS) - set(described)) == []


@pytest.mark.parametrize('module', MODULES)
def test_a_module_takes_the_description_of_each_shared_option_from_the_fragment(module):
    doc = _documentation(module)
    groups = _fragments()
    extended = {name for group in doc.get('extends_documentation_fragment', []) for name in groups[group]}
    for name in _argument_spec(module):
        if name in OPTIONS and ENTRY_DOCUMENTED_BY.get(name) != module:
            assert name in extended, '%s takes %s without its fragment' % (module, name)


def test_an_entry_key_of_mps_host_refers_to_the_one_description():
    entry = _documentation('mps_host')['options']['resources']['suboptions']
    for name, module in ENTRY_DOCUMENTED_BY.items():
        first = entry[name]['description']
        first = first[0] if isinstance(first, list) else first
        assert first.startswith('As O(gpufleet.mps.%s#module:%s)' % (module, name)), (name, first)
        assert _declared(entry[name]) == _expected(OPTIONS[name]), name


def test_the_roles_variables_refer_to_the_one_description():
    host = _argument_spec('mps_host')
    role = yaml.safe_load((COLLECTION / 'roles' / 'fleet' / 'meta' / 'argument_specs.yml').read_text())['argument_specs']['main']['options']
    referred = []
    for variable, option in role.items():
        name = variable[len('mps_'):]
        if name not in host or name in ROLE_ONLY:
            continue
        first = option['description'][0] if isinstance(option['description'], list) else option['description']
        assert first == 'As O(gpufleet.mps.mps_host#module:%s).' % name, variable
        referred.append(name)
    assert len(referred) >= 35, referred  # every variable the role passes through to mps_host
