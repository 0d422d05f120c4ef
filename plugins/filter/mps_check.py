# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's controller-side pre-flight: what a resource list gets wrong without the host's GPUs."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import check_resources
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import check_unit_order

# The role's variables this filter checks, and how.
UNIT_LISTS = ('mps_unit_before', 'mps_unit_after')
VARIABLES = ('mps_resources',) + UNIT_LISTS


def mps_check(value: t.Any, variable: str = 'mps_resources', protocol: t.Optional[str] = None) -> t.Any:
    """A refusal naming ``variable`` of what needs no GPU facts - for the resource list its keys, names, limit values
    and replica counts; for a unit order, that it is a list of systemd unit names - or else the resource list itself,
    or the unit order as the list of its names (empty for none)."""
    if variable not in VARIABLES:
        raise AnsibleFilterError('mps_check: variable must be one of %s, got %r' % (', '.join(VARIABLES), variable))
    try:
        if variable in UNIT_LISTS:
            return list(check_unit_order(value, variable))
        if protocol is not None and str(protocol) not in ('legacy', '3'):
            raise MpsError('protocol must be legacy or 3 (MPS v3), got %r' % (protocol,))
        check_resources(value, variable, protocol=None if protocol is None else str(protocol))
    except MpsError as exc:
        raise AnsibleFilterError(exc.msg) from exc
    return value


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_check': mps_check}
