# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The writes of a resource's persisted limits planned (:func:`plan_writes`, :func:`plan_forget`), each with the undo that
puts the file back as the run read it."""

from __future__ import annotations

import typing as t

from .._io import atomic_write, ensure_dir, remove, restorer
from .._resource.layout import ConfigPaths
from .model import Limits
from .store import persist, rendered, write_replay

Reader = t.Callable[[str], t.Optional[str]]


def plan_writes(out: t.Any, view: t.Any, config: ConfigPaths, wanted: Limits, uuids: t.List[str], *, order_known: bool,
                reader: Reader) -> None:
    """Add to ``out`` (a LimitsOutcome) the writes that persist ``wanted`` for a daemon on ``uuids``: the record, and the
    files rendered from it for that device order where it is known (``order_known``)."""
    out.replay_for = uuids if order_known else None
    if persist(config, wanted, check_mode=True, reader=reader):
        change = out.act('write %s' % config.limits_json, lambda: (
            ensure_dir(config.config_dir, 0o755), persist(config, wanted, check_mode=False)))
        change.undo = restorer(config.limits_json, _observed(view, reader, config.limits_json))
        out.persisted = True
    if order_known:
        if write_replay(config, wanted, uuids, check_mode=True, reader=reader):
            change = out.act('write %s' % config.limits_file, lambda: (
                ensure_dir(config.config_dir, 0o755), write_replay(config, wanted, uuids, check_mode=False)))
            change.undo = _undo_rendered(view, config, reader)
            out.persisted = True
        return
    # The files rendered from the record at every write, so that none goes stale: without a known device order
    # the commands file goes (the next start writes it for its order), the start environment is rendered.
    for path, text in rendered(config, wanted, None):
        if (reader(path) or '') == text:
            continue
        change = out.act('%s %s' % ('write' if text else 'remove', path), _writer(config, path, text),
                         'the device order of its next start is not known: that start writes it'
                         if path == config.limits_file else '')
        change.undo = restorer(path, _observed(view, reader, path))
        out.persisted = True


def plan_forget(out: t.Any, config: ConfigPaths, reader: Reader) -> None:
    """Exact mode without limits: the persisted files go, so that no start replays old limits."""
    for path in (config.limits_json, config.limits_file, config.limits_env):
        if reader(path) is not None:
            out.act('remove %s' % path, lambda path=path: remove(path), 'the resource has no limits')
            out.persisted = True


def _undo_rendered(view: t.Any, config: ConfigPaths, reader: Reader) -> t.Callable[[], None]:
    """Puts both rendered files back as the run read them."""
    undo = [restorer(path, _observed(view, reader, path)) for path in (config.limits_file, config.limits_env)]
    return lambda: [step() for step in undo] and None


def _writer(config: ConfigPaths, path: str, text: str) -> t.Callable[[], None]:
    def write() -> None:
        if text:
            ensure_dir(config.config_dir, 0o755)
            atomic_write(path, text, 0o644)
        else:
            remove(path)
    return write


def _observed(view: t.Any, reader: Reader, path: str) -> t.Tuple[t.Optional[str], t.Optional[int]]:
    """The file (its text and mode) as the run read it: what an undo puts back."""
    return reader(path), view.mode(path)
