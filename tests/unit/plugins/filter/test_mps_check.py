# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's pre-flight filter: a refusal names the role's variable, never a Python class."""
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.filter.mps_check import mps_check


def test_a_resource_list_is_returned_unchanged_and_a_bad_one_names_mps_resources():
    resources = [{'name': 'train', 'devices': [0]}]
    assert mps_check(resources) is resources
    with pytest.raises(AnsibleFilterError, match=r'^mps_resources\[train\]: unknown key\(s\) bogus'):
        mps_check([{'name': 'train', 'bogus': 1}])


@pytest.mark.parametrize('variable', ['mps_unit_before', 'mps_unit_after'])
def test_a_unit_order_is_a_list_of_unit_names_and_a_wrong_shape_names_the_variable(variable):
    assert mps_check(['slurmd.service'], variable) == ['slurmd.service']
    assert mps_check([], variable) == [] and mps_check(None, variable) == []
    assert mps_check('slurmd.service,kubelet.service', variable) == ['slurmd.service', 'kubelet.service']  # as the module splits it
    with pytest.raises(AnsibleFilterError, match=r"^%s: ' kubelet.service' is not a systemd unit name" % variable):
        mps_check('slurmd.service, kubelet.service', variable)  # the module would refuse the space on the host
    with pytest.raises(AnsibleFilterError) as refused:
        mps_check({'slurmd.service': True}, variable)
    assert str(refused.value).startswith(variable + ': must be a list of systemd unit names')
    assert 'class' not in str(refused.value)
    with pytest.raises(AnsibleFilterError, match=r"^%s: 'slurmd' is not a systemd unit name" % variable):
        mps_check(['slurmd'], variable)


def test_a_variable_the_filter_does_not_know_is_refused_naming_the_ones_it_does():
    with pytest.raises(AnsibleFilterError, match=r'^mps_check: variable must be one of mps_resources, mps_unit_before, '
                                                 r"mps_unit_after, got 'mps_root'"):
        mps_check('/var/lib/mps', 'mps_root')
