# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persisted limits: the commands that give a fresh daemon its defaults.

MPS forgets ``set_default_*`` on every restart. The wanted defaults of a resource are kept under the
config directory as a file of control commands (``<instance>.limits``), one per line, which is fed
to the control UI after every start - by mps_daemon for daemons it supervises, and by the systemd
unit (``ExecStartPost``) for the others - so no server ever starts without them.
"""

from __future__ import annotations

import typing as t

from ._control import command
from ._errors import MpsError
from ._io import read_text
from ._root import ConfigPaths

REPLAYABLE = ('set_default_active_thread_percentage', 'set_default_device_pinned_mem_limit')


def read_replay(config: ConfigPaths) -> t.List[str]:
    """The persisted commands, validated again: a tampered file cannot inject other commands."""
    text = read_text(config.limits_file)
    if not text:
        return []
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        words = line.split()
        if words[0] not in REPLAYABLE:
            raise MpsError('%s line %d: %r is not a limit command; refusing to replay it' % (config.limits_file, number, line))
        commands.append(command(*words))
    return commands
