# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of ``gpufleet.mps.mps_host``: what needs no GPU facts is refused here, then the module runs.

A resource list's keys, names, percentages, sizes and replica counts, and the unit order, are checked on the controller
before the module is sent to the host, in the words the module's own checks use (naming the role's ``mps_*`` variable
when the task's environment sets ``GPUFLEET_MPS_OPTION_PREFIX``, as the fleet role's task does). The checks are
imported with this plugin, which the controller's main process loads once per run before it forks a worker per host:
no worker imports them again (a filter in the task's arguments was imported by every host's worker, ~50 ms each).
Everything else is what ``ansible.builtin.normal`` does (check mode, async).
"""

from __future__ import annotations

import typing as t

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import check_resources
from ansible_collections.gpufleet.mps.plugins.module_utils._module import OPTION_PREFIX_VAR, prefixed
from ansible_collections.gpufleet.mps.plugins.module_utils._options import resources_option
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import check_unit_order


# the list as mps_host's argument spec declares it
RESOURCES_SPEC = {'resources': resources_option()}


def refusal(args: t.Mapping[str, t.Any], prefix: str = '') -> t.Optional[t.Tuple[str, str]]:
    """(param, message) of the first thing in ``args`` refused without the host's GPUs, or None.

    The resource list where the state is present (absent takes none), the unit order for every state. ``param`` and
    the message name ``prefix + option`` (``mps_resources[train].replicas`` from the fleet role).
    """
    try:
        for option in ('unit_before', 'unit_after'):
            check_unit_order(args.get(option), option)
        if args.get('state', 'present') == 'present' and args.get('resources') is not None:
            # As the module reads the list: its argument check converts each entry first ("name=train", a name of
            # 123, multiuser: 1.0 and sm_partitions: "8,4,4" are all good input to it), so the check runs on what it
            # converted. Where the conversion fails, the list as given: the refusal in our words (an unknown key, a
            # value's kind); what neither check names is left to the module, which refuses it on the host.
            converted = ArgumentSpecValidator(RESOURCES_SPEC).validate({'resources': args['resources']})
            # the host's protocol for the entries that give none - only a value the module takes (its own check refuses
            # any other, naming protocol)
            protocol = str(args['protocol']) if str(args.get('protocol')) in ('legacy', '3') else None
            if converted.error_messages:
                check_resources(args['resources'], protocol=protocol)
            else:
                check_resources(converted.validated_parameters['resources'], protocol=protocol)
    except MpsError as exc:
        # named as the module names its own refusals (_module.prefixed): the same words from either side
        return prefixed(prefix, exc.fail_kwargs().get('param') or '', exc.msg)
    return None


class ActionModule(ActionBase):
    """Check on the controller, then run the module as the normal action does."""

    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp: t.Any = None, task_vars: t.Optional[t.Dict[str, t.Any]] = None) -> t.Dict[str, t.Any]:
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect
        environment: t.Dict[str, t.Any] = {}
        self._compute_environment_string(environment)
        found = refusal(self._task.args, str(environment.get(OPTION_PREFIX_VAR) or ''))
        if found is not None:
            result.update(failed=True, changed=False, msg=found[1])
            if found[0]:
                result['param'] = found[0]
            return result
        wrap_async = self._task.async_val and not self._connection.has_native_async
        result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
