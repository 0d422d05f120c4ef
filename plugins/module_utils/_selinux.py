# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SELinux labels, through ansible-core's own binding to libselinux (``ansible.module_utils.compat.selinux``).

On an enforcing host a container's MPS client may connect to the daemon's sockets only when the pipe
directory has a type containers may use (``container_file_t``), as NVIDIA's device plugin labels it.
Only the type is changed; user, role and level stay. A host without SELinux (or without libselinux) is
never touched.
"""

from __future__ import annotations

import re
import typing as t

from ._errors import InvalidParameterError, MpsError
from ._outcome import Outcome

try:
    from ansible.module_utils.compat import selinux as _sel
except (ImportError, NotImplementedError):  # no libselinux: no SELinux
    _sel = None  # type: ignore[assignment]

CONTAINER_TYPE = 'container_file_t'


def validate_type(value: t.Any, param: str = 'selinux_type') -> str:
    """An SELinux type name (or '' to leave labels alone), or a refusal naming ``param``."""
    selinux_type = value or ''
    if selinux_type and not re.fullmatch(r'[a-z0-9_]+', str(selinux_type)):
        raise InvalidParameterError(param, 'must be an SELinux type name such as container_file_t (letters, digits, '
                                    'underscores), or empty to leave labels alone; got %r' % selinux_type)
    return str(selinux_type)


def enabled() -> bool:
    return _sel is not None and _sel.is_selinux_enabled() == 1


def context_of(path: str) -> str:
    try:
        return _sel.lgetfilecon_raw(path)[1]  # type: ignore[union-attr]
    except OSError as exc:
        raise MpsError('cannot read the SELinux context of %s: %s' % (path, exc.strerror), path=path) from exc


def with_type(context: str, selinux_type: str) -> str:
    """``context`` with its type replaced (``user:role:type:level``; the level may itself hold colons)."""
    parts = context.split(':', 3)
    if len(parts) < 3:
        raise MpsError('unexpected SELinux context %r' % context)
    parts[2] = selinux_type
    return ':'.join(parts)


def type_of(context: str) -> t.Optional[str]:
    parts = context.split(':', 3)
    return parts[2] if len(parts) >= 3 else None


def set_type(path: str, selinux_type: str) -> None:
    wanted = with_type(context_of(path), selinux_type)
    try:
        _sel.lsetfilecon(path, wanted)  # type: ignore[union-attr]
    except OSError as exc:
        raise MpsError('cannot set the SELinux context %s on %s: %s' % (wanted, path, exc.strerror), path=path) from exc


def plan_type(path: str, selinux_type: t.Optional[str], out: Outcome, view: t.Any) -> t.Optional[str]:
    """Plan giving ``path`` the SELinux type ``selinux_type``; returns its current type (None: nothing to do or know).

    ``view``: the run's view of the host (_observe.view.HostView), which read SELinux's state and the path's label. A path
    that does not exist yet is labelled once a planned step before this one has created it.
    """
    if not selinux_type or not view.selinux:
        return None
    current = view.label(path)
    if current is None:
        out.act('set SELinux type %s on %s' % (selinux_type, path), lambda: set_type(path, selinux_type))
        return None
    if current != selinux_type:
        out.act('set SELinux type %s on %s (was %s)' % (selinux_type, path, current), lambda: set_type(path, selinux_type))
    return current
