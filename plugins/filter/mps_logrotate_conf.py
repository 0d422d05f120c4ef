# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's logrotate drop-in for the daemons' logs, rendered."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.logrotate import render_logrotate


def mps_logrotate_conf(root: t.Any, size: t.Any = '50M', rotate: t.Any = 7) -> str:
    try:
        return render_logrotate(str(root), str(size), int(rotate))
    except (MpsError, ValueError, TypeError) as exc:
        raise AnsibleFilterError('mps_logrotate_conf: %s' % getattr(exc, 'msg', exc)) from exc


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_logrotate_conf': mps_logrotate_conf}
