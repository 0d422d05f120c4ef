# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one place where the domain meets AnsibleModule: the options every module shares, the run, the result."""

from __future__ import annotations

import shutil
import typing as t

from ansible.module_utils.basic import AnsibleModule

from ._errors import MpsError
from ._outcome import Outcome
from ._options import spec
from ._supervisor.process import require_binary

CONTROL_BINARY = 'nvidia-cuda-mps-control'


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


def run_module(argument_spec: t.Dict[str, t.Any], run: t.Callable[[AnsibleModule], t.Dict[str, t.Any]]) -> None:
    """Build the module (check mode supported), call ``run(module)``, exit with its result or the domain error."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    try:
        result = run(module)
    except MpsError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(**result)
