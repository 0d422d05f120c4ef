# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.filter.mps_logrotate_conf import mps_logrotate_conf


def test_the_drop_in_covers_both_levels_of_resource_names():
    conf = mps_logrotate_conf('/run/nvidia/mps/', '100M', '14')
    assert '/run/nvidia/mps/*/log/*.log /run/nvidia/mps/*/*/log/*.log {' in conf
    assert '    size 100M\n' in conf and '    rotate 14\n' in conf and '    copytruncate\n' in conf


@pytest.mark.parametrize('args, message', [(('relative',), 'root'), (('/run/mps', '50 MB'), 'size'), (('/run/mps', '50M', 'x'), '')])
def test_what_a_drop_in_cannot_carry_is_refused_naming_the_filter(args, message):
    with pytest.raises(AnsibleFilterError, match='^mps_logrotate_conf: %s' % message):
        mps_logrotate_conf(*args)
