# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each in-process module run starts as a real one does, in a process of its own: without the warnings and deprecations
an earlier run left in ansible-core's module-wide lists (an mps_daemon test's warning showed up in a later mps_info
result when both ran in one pytest worker)."""
from __future__ import annotations

import pytest

from ansible.module_utils.common import warnings as _warnings


@pytest.fixture(autouse=True)
def fresh_module_warnings():
    # pylint: disable=protected-access
    _warnings._global_warnings.clear()
    _warnings._global_deprecations.clear()
    yield
    _warnings._global_warnings.clear()
    _warnings._global_deprecations.clear()
