# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.filter.mps_health_files import mps_health_files


def test_the_script_then_the_units_with_their_modes():
    files = mps_health_files('/run/nvidia/mps', '/etc/gpufleet-mps', interval='60', timeout=5)
    assert [(entry['path'], entry['mode']) for entry in files] == [
        ('/usr/local/sbin/gpufleet-mps-health', '0755'),
        ('/etc/systemd/system/gpufleet-mps-health.service', '0644'),
        ('/etc/systemd/system/gpufleet-mps-health.timer', '0644'),
    ]
    assert 'OnUnitActiveSec=60s' in files[2]['content']


def test_what_cannot_be_written_is_refused_naming_the_filter():
    with pytest.raises(AnsibleFilterError, match="^mps_health_files: root: .*cannot be written"):
        mps_health_files("relative/root", '/etc/gpufleet-mps')
    with pytest.raises(AnsibleFilterError, match='^mps_health_files: '):
        mps_health_files('/run/nvidia/mps', '/etc/gpufleet-mps', interval='often')
