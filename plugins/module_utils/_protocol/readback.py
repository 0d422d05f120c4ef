# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon's read-back of a memory limit (``get_*_device_pinned_mem_limit``): the sizes it stands for, or unset."""

from __future__ import annotations

import re
import typing as t

_READBACK = re.compile(r'(?P<number>\d+)(?P<unit>[MG])')


def parse_readback(text: str) -> t.Optional[t.Tuple[int, int]]:
    """The range of MiB a memory read-back stands for: ``3G`` -> [3072, 4096), ``512M`` -> [512, 513).

    None for an unset limit - how the daemon prints one is undocumented (empty, ``0``, ``0M``...) - and
    for a reply that is no size at all (``N/A``, ``No limit``, whatever a new driver prints): either way
    it matches no wanted limit, so a wanted one is applied again (:func:`readback_readable` tells which).
    """
    text = text.strip()
    match = _READBACK.fullmatch(text)
    if not match:
        return None
    number = int(match.group('number'))
    if number == 0:
        return None
    if match.group('unit') == 'G':
        return number * 1024, (number + 1) * 1024
    return number, number + 1


def readback_readable(text: t.Optional[str]) -> bool:
    """Whether a memory read-back is a size or the plain unset forms (empty, ``0``), not an unknown reply."""
    text = (text or '').strip()
    return text in ('', '0') or bool(_READBACK.fullmatch(text))
