# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one place where the domain meets AnsibleModule: the options every module shares, the run, the result."""

from __future__ import annotations

import copy
import os
import re
import shutil
import typing as t

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ._errors import MpsError
from ._outcome import Outcome
from ._options import spec
from ._supervisor.process import require_binary

CONTROL_BINARY = 'nvidia-cuda-mps-control'
# Set by the fleet role on its mps_host task (``mps_``): a refusal then names the role's variable - mps_root,
# mps_resources[train].replicas - instead of the module option the role passed it as.
OPTION_PREFIX_VAR = 'GPUFLEET_MPS_OPTION_PREFIX'
PREFIXABLE = re.compile(r'^[a-z][a-z_]*(\[|\.|$)')


def common_argument_spec() -> t.Dict[str, t.Any]:
    """``root``, ``config_dir`` and ``control_binary``, with their defaults from the layout (doc fragment ``_common``)."""
    return spec('root', 'config_dir', 'control_binary')


def control_binary(path: t.Optional[str]) -> str:
    """The control binary given, or the one on PATH; refused with the reason when it cannot be run."""
    return require_binary(path or shutil.which(CONTROL_BINARY))


def finish(module: AnsibleModule, outcome: Outcome, **values: t.Any) -> t.Dict[str, t.Any]:
    """The result of a module that changes things: warnings shown, ``changed``, ``actions`` and ``diff`` from the outcome."""
    for warning in outcome.warnings:
        module.warn(warning)
    result = dict(values, changed=outcome.changed, actions=list(outcome.actions))
    if module._diff:
        result['diff'] = outcome.diff()
    return result


def prefixed(prefix: str, param: t.Any, msg: str) -> t.Tuple[t.Any, str]:
    """A refusal's parameter and message as the caller wrote them: run by the fleet role (``prefix`` ``mps_``, from
    ``GPUFLEET_MPS_OPTION_PREFIX``), whose variables are ``mps_<option>``, they name the variable; else unchanged."""
    if prefix and isinstance(param, str) and PREFIXABLE.match(param):
        return prefix + param, prefix + msg if msg.startswith(param + ': ') else msg
    return param, msg


def entry_error(argument_spec: t.Mapping[str, t.Any], params: t.Mapping[str, t.Any]) -> t.Optional[t.Tuple[str, str]]:
    """The first error in an entry of a list of mappings, as (``resources[train].multiuser``, message), or None.

    AnsibleModule says only "found in 'resources'"; a list of twenty resources deserves the entry's name (its index when
    it has none) and the key, the way the plan's own errors name them.
    """
    for option, option_spec in argument_spec.items():
        sub = option_spec.get('options')
        entries = params.get(option)
        if not sub or option_spec.get('type') != 'list' or option_spec.get('elements') != 'dict' or entries is None:
            continue
        if not isinstance(entries, list):
            # AnsibleModule's words name a Python class ("<class 'dict'> cannot be converted to a list").
            return option, 'must be a list of mappings, one per entry; got %s' % _kind(entries)
        for number, entry in enumerate(entries):
            if not isinstance(entry, dict):
                # AnsibleModule's: "dictionary requested, could not parse JSON or key=value", naming no entry.
                return '%s[%d]' % (option, number), 'must be a mapping (name: ..., and its other keys); got %s %r' % (
                    _kind(entry), entry)
            name = entry.get('name')
            label = '%s[%s]' % (option, name if isinstance(name, str) and name else number)
            unknown = sorted(str(key) for key in entry if key not in sub)
            if unknown:
                return label, 'unknown key(s) %s; the keys are %s' % (', '.join(unknown), ', '.join(sub))
            for key, key_spec in sub.items():
                result = ArgumentSpecValidator({key: key_spec}).validate({key: entry[key]} if key in entry else {})
                if result.error_messages:
                    return '%s.%s' % (label, key), result.error_messages[0]
    return None


def _kind(value: t.Any) -> str:
    """What a value is, in the words of YAML rather than of Python."""
    if isinstance(value, dict):
        return 'a mapping'
    if isinstance(value, (list, tuple)):
        return 'a list'
    if isinstance(value, bool):
        return 'a boolean'
    if isinstance(value, (int, float)):
        return 'a number'
    return 'a string' if isinstance(value, str) else 'a %s' % type(value).__name__


class _Module(AnsibleModule):
    """AnsibleModule whose argument errors about one entry of a list of mappings name that entry (:func:`entry_error`)."""

    _raw_params: t.Optional[t.Dict[str, t.Any]] = None
    _validated = False

    def _load_params(self) -> None:
        super()._load_params()
        self._raw_params = copy.deepcopy(self.params)  # validation converts self.params in place before it fails

    def fail_json(self, msg: str, **kwargs: t.Any) -> t.NoReturn:  # type: ignore[override]
        if not self._validated and self._raw_params is not None:
            found = entry_error(self.argument_spec, self._raw_params)
            if found is not None:
                kwargs.setdefault('param', found[0])
                msg = '%s: %s' % found
        if 'param' in kwargs:
            kwargs['param'], msg = prefixed(os.environ.get(OPTION_PREFIX_VAR, ''), kwargs['param'], msg)
        super().fail_json(msg, **kwargs)


def run_module(argument_spec: t.Dict[str, t.Any], run: t.Callable[[AnsibleModule], t.Dict[str, t.Any]]) -> None:
    """Build the module (check mode supported), call ``run(module)``, exit with its result or the domain error."""
    module = _Module(argument_spec=argument_spec, supports_check_mode=True)
    module._validated = True
    try:
        result = run(module)
    except MpsError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(**result)
