# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's health check of <root>/.ready between runs: its script and units, rendered."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health


def mps_health_files(root: t.Any, config_dir: t.Any, interval: t.Any = 30, timeout: t.Any = 10,
                     unit_dir: t.Any = '/etc/systemd/system') -> t.List[t.Dict[str, t.Any]]:
    """One entry per file - ``path``, ``content``, ``mode`` - in the order they are to be written."""
    try:
        files = render_health(str(root), str(config_dir), str(unit_dir), int(interval), int(timeout))
    except (MpsError, ValueError, TypeError) as exc:
        raise AnsibleFilterError('mps_health_files: %s' % getattr(exc, 'msg', exc)) from exc
    return [{'path': path, 'content': content, 'mode': '0755' if not path.startswith(str(unit_dir)) else '0644'}
            for path, content in files.items()]


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_health_files': mps_health_files}
