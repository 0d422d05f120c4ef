# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the control binary has client priority, asked once, before anything changes.

A running daemon has already said (its answer to ``get_default_client_priority``, in the one read of its state); for a
daemon not running the binary's help text is read, once per run and binary, and only when a priority is wanted.
"""

from __future__ import annotations

import typing as t

from .._errors import InvalidParameterError
from .._protocol.commands import GET_DEFAULT_PRIORITY, SET_DEFAULT_PRIORITY
from .decide import LimitsSeen
from .model import Limits


def offers(view: t.Any, prober: t.Any, command_word: str) -> t.Tuple[t.Optional[bool], str]:
    """(whether the control binary's help lists ``command_word``, the binary) as the run (``view``) read it from
    ``prober``'s binary; (None, '') without a binary to ask."""
    if prober is None:
        return None, ''
    return view.offers(prober.binary, command_word), prober.binary


def check_priority_offered(view: t.Any, name: str, prober: t.Any, wanted: Limits, seen: LimitsSeen) -> None:
    """A client priority is refused, before anything changes, where the control binary of the resource ``name`` has none.

    A running daemon has already said (its answer to get_default_client_priority, in the one read); for a daemon not
    running the help text of ``prober``'s binary is read, once, only when a priority is wanted.
    """
    if wanted.client_priority is None:
        return
    if seen.running:
        if seen.priority is not None:
            return
        why = 'its MPS control daemon answered %r to %s' % (seen.priority_text or '(nothing)', GET_DEFAULT_PRIORITY)
    else:
        readout = view.readouts.get(name)
        if readout is not None and readout[1].default_priority is not None:
            return  # the daemon this plan restarts answered a priority when it was observed
        offered, binary = offers(view, prober, SET_DEFAULT_PRIORITY)
        if offered is not False:
            return  # offered, or the help is unreadable: the start's replay checks the daemon's answer
        why = 'the help text of %s lists no %s' % (binary, SET_DEFAULT_PRIORITY)
    raise InvalidParameterError('client_priority', 'the control binary of %s has no client priority (%s); it needs a driver '
                                'whose nvidia-cuda-mps-control offers set_default_client_priority (r580 does), or leave '
                                'client_priority unset' % (name, why))
