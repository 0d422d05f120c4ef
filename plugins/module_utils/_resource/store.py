# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The start environment a daemon gets from its persisted limits (``<instance>.limits-env``; ``_limits/store.py`` writes them).

NVIDIA documents ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the control daemon's environment as the default of
every server it spawns: the direct start sets it, the systemd unit reads the same from the limits-env file.
"""

from __future__ import annotations

import typing as t

from .._protocol.commands import SM_PARTITION, default_percentage_of

# The one default documented as read from the control daemon's environment at its start.
PERCENTAGE_ENV = 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'
# The daemon's option for static SM partitions (-S), where the replay creates partitions: the unit's ExecStart= adds it.
STATIC_ARGS_ENV = 'MPS_STATIC_ARGS'
STATIC_OPTION = '-S'


def wants_static(commands: t.Sequence[str]) -> bool:
    """Whether a replay creates SM partitions: its daemon must be started with -S (the mode is fixed at the start)."""
    return any(cmd.split()[:1] == [SM_PARTITION] for cmd in commands)


def start_environment(commands: t.Sequence[str]) -> t.Dict[str, str]:
    """The part of the replayed limits the daemon is started with: the default thread percentage, and -S for partitions."""
    env = {}
    for cmd in commands:
        percentage = default_percentage_of(cmd)
        if percentage is not None:
            env[PERCENTAGE_ENV] = percentage
    if wants_static(commands):
        env[STATIC_ARGS_ENV] = STATIC_OPTION
    return env
