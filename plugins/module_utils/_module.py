# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one place where the domain meets AnsibleModule: run, and turn domain errors into fail_json."""

from __future__ import annotations

import typing as t

from ansible.module_utils.basic import AnsibleModule

from ._errors import MpsError


def run_module(argument_spec: t.Dict[str, t.Any], run: t.Callable[[AnsibleModule], t.Dict[str, t.Any]]) -> None:
    """Build the module (check mode supported), call ``run(module)``, exit with its result or the domain error."""
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    try:
        result = run(module)
    except MpsError as exc:
        module.fail_json(**exc.fail_kwargs())
    module.exit_json(**result)
