# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rotation of the daemons' logs (``<root>/<resource>/log/control.log`` and ``server.log``): a logrotate drop-in.

The control daemon opens its logs once and keeps writing to them; NVIDIA documents no signal that makes
it reopen them. So the drop-in uses ``copytruncate``: the file is copied, then truncated in place, and
the daemon writes on at the start of the same file (a few lines written between the copy and the
truncation can be lost - logrotate's documented trade-off). Resource names hold at most one ``/``, so
two patterns cover every log of the root.
"""

from __future__ import annotations

import os
import re

from .._errors import MpsError

_SIZE = re.compile(r'[1-9][0-9]*[kMG]?')

TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (fleet role). Local changes are overwritten.
# The MPS control daemon keeps its logs open and is not documented to reopen them on a signal:
# copytruncate copies each log, then truncates it in place.
{root}/*/log/*.log {root}/*/*/log/*.log {{
    su root root
    size {size}
    rotate {rotate}
    copytruncate
    missingok
    notifempty
    compress
    delaycompress
}}
"""


def render_logrotate(root: str, size: str = '50M', rotate: int = 7) -> str:
    """The drop-in for the logs under ``root``: rotated past ``size``, ``rotate`` old copies kept."""
    root = os.path.normpath(str(root))
    if not os.path.isabs(root) or any(char.isspace() or char in '"\'\\{}*?[]#' for char in root):
        raise MpsError('root: %r cannot be written into a logrotate drop-in (an absolute path without spaces, quotes, '
                       'braces or glob characters)' % root)
    if not _SIZE.fullmatch(str(size)):
        raise MpsError('size: %r is not a logrotate size such as 50M, 500k or 1G' % (size,))
    if isinstance(rotate, bool) or not isinstance(rotate, int) or rotate < 0:
        raise MpsError('rotate: %r is not a number of old logs to keep (0 or more)' % (rotate,))
    return TEMPLATE.format(root=root, size=size, rotate=rotate)
