# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's controller-side pre-flight: what a resource list gets wrong without the host's GPUs."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._host.plan import check_resources


def mps_check(resources: t.Any) -> t.Any:
    """The resource list itself, or a refusal of what needs no GPU facts (keys, names, limit values, replica counts)."""
    try:
        check_resources(resources, 'mps_resources')
    except MpsError as exc:
        raise AnsibleFilterError(exc.msg) from exc
    return resources


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_check': mps_check}
