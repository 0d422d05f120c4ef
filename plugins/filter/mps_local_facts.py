# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The local facts the fleet role writes for schedulers: ``ansible_local.gpufleet_mps``."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._host.facts import local_facts


def mps_local_facts(plan: t.Any, daemons: t.Any, gpus: t.Any, root: t.Any) -> t.Dict[str, t.Any]:
    """One entry per planned resource, with its GPUs, limits (as persisted) and the environment clients need.

    Nothing that changes between two runs of an unchanged host (pids, start times) is in it. The same facts as
    mps_host writes (module_utils/_host/facts.py).
    """
    if not isinstance(plan, list) or not isinstance(daemons, list) or not isinstance(gpus, list):
        raise AnsibleFilterError('mps_local_facts: expects the mps_plan list, mps_info daemons and mps_info gpus')
    return local_facts(plan, daemons, gpus, str(root))


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_local_facts': mps_local_facts}
